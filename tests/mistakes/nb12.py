"""Notebook 12, RPC basics."""

import torch.distributed.autograd as dist_autograd
from torch.distributed import rpc

from distlab.exercises import nb12

from . import RIGHT, Answer

GRADERS = {
    1: (nb12.exercise_1, ["fan_out"]),
    2: (nb12.exercise_2, ["sgd_step_on_owner"]),
}

GIVEN = {"rpc": rpc, "dist_autograd": dist_autograd}

ANSWERS = [
    Answer(1, "the solution", """
def fan_out(square):
    futs = [rpc.rpc_async(f"worker{r}", square, args=(torch.tensor(x),))
            for r, x in ((1, 3.0), (2, 4.0))]
    return sum(torch.futures.wait_all(futs))
""", RIGHT),
    Answer(1, "sequential: rpc_sync twice", """
def fan_out(square):
    a = rpc.rpc_sync("worker1", square, args=(torch.tensor(3.0),))
    b = rpc.rpc_sync("worker2", square, args=(torch.tensor(4.0),))
    return a + b
""", "ran one after the other"),
    Answer(1, "rpc_async, but waits for each before starting the next", """
def fan_out(square):
    a = rpc.rpc_async("worker1", square, args=(torch.tensor(3.0),)).wait()
    b = rpc.rpc_async("worker2", square, args=(torch.tensor(4.0),)).wait()
    return a + b
""", "ran one after the other"),
    Answer(1, "both calls to worker1", """
def fan_out(square):
    futs = [rpc.rpc_async("worker1", square, args=(torch.tensor(x),)) for x in (3.0, 4.0)]
    return sum(torch.futures.wait_all(futs))
""", "worker2 never ran square"),
    Answer(1, "returns the list of results, not their sum", """
def fan_out(square):
    futs = [rpc.rpc_async(f"worker{r}", square, args=(torch.tensor(x),))
            for r, x in ((1, 3.0), (2, 4.0))]
    return torch.futures.wait_all(futs)
""", "it returned a list of 2"),
    Answer(1, "Python ints, not tensors", """
def fan_out(square):
    futs = [rpc.rpc_async(f"worker{r}", square, args=(x,)) for r, x in ((1, 3), (2, 4))]
    return sum(torch.futures.wait_all(futs))
""", "worker1 ran square on an int: 3"),
    Answer(1, "the sum as a Python float", """
def fan_out(square):
    futs = [rpc.rpc_async(f"worker{r}", square, args=(torch.tensor(x),))
            for r, x in ((1, 3.0), (2, 4.0))]
    return sum(f.item() for f in torch.futures.wait_all(futs))
""", "it returned a float: 25.0"),
    Answer(1, "no RPC at all: computes it locally", """
def fan_out(square):
    return torch.tensor(3.0) ** 2 + torch.tensor(4.0) ** 2
""", "worker1 never ran square"),
    Answer(1, "the inputs swapped", """
def fan_out(square):
    futs = [rpc.rpc_async(f"worker{r}", square, args=(torch.tensor(x),))
            for r, x in ((1, 4.0), (2, 3.0))]
    return sum(torch.futures.wait_all(futs))
""", "worker1 should run square once, on 3.0"),
    Answer(2, "the solution", """
def sgd_step_on_owner(module_rref, context_id, lr):
    module = module_rref.local_value()
    grads = dist_autograd.get_gradients(context_id)
    for p in module.parameters():
        p.grad = grads[p]
    torch.optim.SGD(module.parameters(), lr=lr).step()
    module.zero_grad()
""", RIGHT),
    Answer(2, "DistributedOptimizer after all (deprecated, warns on the owner)", """
def sgd_step_on_owner(module_rref, context_id, lr):
    from torch.distributed.optim import DistributedOptimizer
    params = [rpc.RRef(p) for p in module_rref.local_value().parameters()]
    DistributedOptimizer(torch.optim.SGD, params, lr=lr).step(context_id)
""", "DeprecationWarning"),
    Answer(2, "steps on .grad, which distributed autograd never fills", """
def sgd_step_on_owner(module_rref, context_id, lr):
    module = module_rref.local_value()
    torch.optim.SGD(module.parameters(), lr=lr).step()
""", "did not change"),
    Answer(2, "plus instead of minus", """
def sgd_step_on_owner(module_rref, context_id, lr):
    module = module_rref.local_value()
    grads = dist_autograd.get_gradients(context_id)
    with torch.no_grad():
        for p in module.parameters():
            p += lr * grads[p]
""", "w + lr * g"),
    Answer(2, "forgets lr", """
def sgd_step_on_owner(module_rref, context_id, lr):
    module = module_rref.local_value()
    grads = dist_autograd.get_gradients(context_id)
    with torch.no_grad():
        for p in module.parameters():
            p -= grads[p]
""", "ignored lr"),
    Answer(2, "looks the gradient up by name: a KeyError on the owner", """
def sgd_step_on_owner(module_rref, context_id, lr):
    grads = dist_autograd.get_gradients(context_id)
    w = module_rref.local_value().weight
    w.grad = grads["weight"]
    torch.optim.SGD([w], lr=lr).step()
""", "your code failed on the ranks"),
]
