"""Notebook 10, data parallelism by hand, then DDP."""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from distlab.exercises import nb10

from . import RIGHT, Answer

GRADERS = {
    1: (nb10.exercise_1, ["DataParallelNaiveAccumulating"]),
    2: (nb10.exercise_2, ["counting_sizes"]),
    3: (nb10.exercise_3, ["my_fp16_hook"]),
}

# The notebook's DataParallelNaive (section 1b), which exercise 1 subclasses; defined in a module
# of its own name so that it travels to the ranks by value, as a cell's class does.
_NOTEBOOK = '''
class DataParallelNaive(nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
        self.calls = 0
        self.order = []
        self.names = {id(p): n for n, p in module.named_parameters()}
        for p in module.parameters():
            p.register_post_accumulate_grad_hook(self._grad_ready)

    def forward(self, *args):
        return self.module(*args)

    def _grad_ready(self, p):
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
        self.calls += 1
        self.order.append(self.names[id(p)])

    def sync_gradients(self):
        pass
'''
_given = {"__name__": "notebook_10", "torch": torch, "dist": dist, "nn": nn}
exec(compile(_NOTEBOOK, "<notebook 10>", "exec"), _given)
GIVEN = {"DataParallelNaive": _given["DataParallelNaive"], "default_hooks": default_hooks}

_ACCUMULATING = """
class DataParallelNaiveAccumulating(DataParallelNaive):
    def __init__(self, module):
        super().__init__(module)
        self.require_sync = True

    def _grad_ready(self, p):
{body}
"""

_FP16 = """
def my_fp16_hook(process_group, bucket):
    buffer = bucket.buffer()
    compressed = (buffer / process_group.size()).to(torch.float16)
    fut = dist.all_reduce(compressed, group=process_group, async_op=True).get_future()

    def decompress(fut):
        return fut.value()[0].to(buffer.dtype)

    return fut.then(decompress)
"""

ANSWERS = [
    Answer(1, "the solution", _ACCUMULATING.format(body="""\
        if self.require_sync:
            super()._grad_ready(p)"""), RIGHT),
    Answer(1, "ignores the switch: all-reduces every micro-batch", _ACCUMULATING.format(
        body="        super()._grad_ready(p)"), "rank 0 made 36 all-reduces"),
    Answer(1, "the switch the wrong way round", _ACCUMULATING.format(body="""\
        if not self.require_sync:
            super()._grad_ready(p)"""), "rank 0's 0.weight after 3 steps"),
    Answer(1, "never syncs", _ACCUMULATING.format(body="""\
        self.calls += 1"""), "rank 0's 0.weight after 3 steps"),
    Answer(1, "syncs, then divides once more", _ACCUMULATING.format(body="""\
        if self.require_sync:
            super()._grad_ready(p)
            p.grad /= dist.get_world_size()"""), "rank 0's 0.weight after 3 steps"),
    Answer(1, "all-reduces without averaging", _ACCUMULATING.format(body="""\
        if self.require_sync:
            dist.all_reduce(p.grad)"""), "rank 0's 0.weight after 3 steps"),
    Answer(2, "the solution", """
def counting_sizes(state, bucket):
    state["sizes"].append((state["iteration"], bucket.buffer().numel()))
    return default_hooks.allreduce_hook(dist.group.WORLD, bucket)
""", RIGHT),
    Answer(2, "forgets `return` (torch 2.13 would segfault)", """
def counting_sizes(state, bucket):
    state["sizes"].append((state["iteration"], bucket.buffer().numel()))
    default_hooks.allreduce_hook(dist.group.WORLD, bucket)
""", "your hook returned None"),
    Answer(2, "counts bytes, not numbers", """
def counting_sizes(state, bucket):
    buf = bucket.buffer()
    state["sizes"].append((state["iteration"], buf.numel() * buf.element_size()))
    return default_hooks.allreduce_hook(dist.group.WORLD, bucket)
""", "your hook recorded"),
    Answer(2, "counts parameters, not numbers", """
def counting_sizes(state, bucket):
    state["sizes"].append((state["iteration"], len(bucket.parameters())))
    return default_hooks.allreduce_hook(dist.group.WORLD, bucket)
""", "your hook recorded"),
    Answer(2, "sums without dividing", """
def counting_sizes(state, bucket):
    state["sizes"].append((state["iteration"], bucket.buffer().numel()))
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(
        lambda f: f.value()[0])
""", "exactly 2x the expected"),
    Answer(2, "no communication: a finished future of the local bucket", """
def counting_sizes(state, bucket):
    state["sizes"].append((state["iteration"], bucket.buffer().numel()))
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut
""", "gradient of fc1.weight (DDP's average)"),
    Answer(2, "forgets the iteration", """
def counting_sizes(state, bucket):
    state["sizes"].append(bucket.buffer().numel())
    return default_hooks.allreduce_hook(dist.group.WORLD, bucket)
""", "(iteration, numbers)"),
    Answer(3, "the solution", _FP16, RIGHT),
    Answer(3, "forgets to divide: 2x the gradient", _FP16.replace(
        "(buffer / process_group.size())", "buffer"), "exactly 2x the expected"),
    Answer(3, "no compression: all-reduces float32", _FP16.replace(
        ".to(torch.float16)", ""), "the exact float32 average"),
    Answer(3, "bfloat16 instead of float16", _FP16.replace("torch.float16", "torch.bfloat16"),
        "not bit for bit"),
    Answer(3, "compresses, but sends nothing: its own gradient", """
def my_fp16_hook(process_group, bucket):
    buffer = bucket.buffer()
    fut = torch.futures.Future()
    fut.set_result((buffer / process_group.size()).to(torch.float16))
    return fut.then(lambda f: f.value().to(buffer.dtype))
""", "rank 0's gradient of 0.weight should be"),
    Answer(3, "divides after the all-reduce, in float32: exact on 2 ranks, until it overflows",
           """
def my_fp16_hook(process_group, bucket):
    buffer = bucket.buffer()
    compressed = buffer.to(torch.float16)
    fut = dist.all_reduce(compressed, group=process_group, async_op=True).get_future()

    def decompress(fut):
        return fut.value()[0].to(buffer.dtype) / process_group.size()

    return fut.then(decompress)
""", "your hook adds the ranks' float16 values before it divides"),
    Answer(3, "forgets `return`", _FP16.replace("    return fut.then(decompress)",
                                                 "    fut.then(decompress)"),
        "your hook returned None"),
]
