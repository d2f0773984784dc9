"""Notebook 21, tensor and sequence parallelism."""

from distlab import gpt
from distlab.exercises import nb21

from . import RIGHT, Answer

GRADERS = {
    1: (nb21.exercise_1, ["shard_attention", "cluster"]),
    2: (nb21.exercise_2, ["megatron_plan", "cluster"]),
    3: (nb21.exercise_3, ["step_collectives", "cluster"]),
}

# The notebook's f and g (the grader module's copies, importable on the ranks) and gpt.
GIVEN = {"F": nb21.F, "G": nb21.G, "gpt": gpt}

CLUSTER = {"world_size": 2, "threads": 1}

_SPLIT = """
import types
def split(attn, rank, world_size, dims=(0, 0, 0, 1), parts=None):
    parts = parts or [rank] * 4
    for linear, dim, part in zip((attn.wq, attn.wk, attn.wv, attn.wo), dims, parts):
        linear.weight = nn.Parameter(linear.weight.detach().chunk(world_size, dim)[part].clone())
    return type(attn).forward
"""

ANSWERS = [
    Answer(1, "the solution", """
import types
def shard_attention(attn, rank, world_size):
    for linear, dim in ((attn.wq, 0), (attn.wk, 0), (attn.wv, 0), (attn.wo, 1)):
        linear.weight = nn.Parameter(linear.weight.detach().chunk(world_size, dim)[rank].clone())
    inner = type(attn).forward
    def forward(self, x):
        return G.apply(inner(self, F.apply(x)))
    attn.forward = types.MethodType(forward, attn)
    return attn
""", RIGHT),
    Answer(1, "a subclass instead of a patched forward", """
def shard_attention(attn, rank, world_size):
    for linear, dim in ((attn.wq, 0), (attn.wk, 0), (attn.wv, 0), (attn.wo, 1)):
        linear.weight = nn.Parameter(linear.weight.detach().chunk(world_size, dim)[rank].clone())
    base = type(attn)
    class Sharded(base):
        def forward(self, x):
            return G.apply(base.forward(self, F.apply(x)))
    attn.__class__ = Sharded
    return attn
""", RIGHT),
    Answer(1, "no g: the partial sums of wo are never added", _SPLIT + """
def shard_attention(attn, rank, world_size):
    inner = split(attn, rank, world_size)
    attn.forward = types.MethodType(lambda self, x: inner(self, F.apply(x)), attn)
    return attn
""", "tok.weight.grad differs on rank 0 at step 0"),
    Answer(1, "no f: the input's gradient stays partial", _SPLIT + """
def shard_attention(attn, rank, world_size):
    inner = split(attn, rank, world_size)
    attn.forward = types.MethodType(lambda self, x: G.apply(inner(self, x)), attn)
    return attn
""", "tok.weight.grad differs on rank 0 at step 0"),
    Answer(1, "wo split by rows, like wq", _SPLIT + """
def shard_attention(attn, rank, world_size):
    inner = split(attn, rank, world_size, dims=(0, 0, 0, 0))
    attn.forward = types.MethodType(lambda self, x: G.apply(inner(self, F.apply(x))), attn)
    return attn
""", "attn.wo.weight should hold this rank's share, shape (32, 16)"),
    Answer(1, "wq, wk, wv split by columns (their inputs)", _SPLIT + """
def shard_attention(attn, rank, world_size):
    inner = split(attn, rank, world_size, dims=(1, 1, 1, 1))
    attn.forward = types.MethodType(lambda self, x: G.apply(inner(self, F.apply(x))), attn)
    return attn
""", "attn.wq.weight should hold this rank's share, shape (16, 32)"),
    Answer(1, "wo's columns from the other rank: the heads do not match", _SPLIT + """
def shard_attention(attn, rank, world_size):
    inner = split(attn, rank, world_size, parts=[rank, rank, rank, world_size - 1 - rank])
    attn.forward = types.MethodType(lambda self, x: G.apply(inner(self, F.apply(x))), attn)
    return attn
""", "a wrong split of the heads hardly shows in the loss"),
    Answer(1, "chunk(2, ...) hard-coded: right on a 2-rank cluster only", """
import types
def shard_attention(attn, rank, world_size):
    for linear, dim in ((attn.wq, 0), (attn.wk, 0), (attn.wv, 0), (attn.wo, 1)):
        linear.weight = nn.Parameter(linear.weight.detach().chunk(2, dim)[rank].clone())
    inner = type(attn).forward
    attn.forward = types.MethodType(lambda self, x: G.apply(inner(self, F.apply(x))), attn)
    return attn
""", "world_size=1, attn.wq.weight should hold rows 0..31 of 32, shape (32, 32); it holds "
         "shape (16, 32)"),
    Answer(1, "patches the class's forward (every Attention of every model, on every rank)", """
def shard_attention(attn, rank, world_size):
    for linear, dim in ((attn.wq, 0), (attn.wk, 0), (attn.wv, 0), (attn.wo, 1)):
        linear.weight = nn.Parameter(linear.weight.detach().chunk(world_size, dim)[rank].clone())
    cls = type(attn)
    if "_unsharded" not in vars(cls):
        cls._unsharded = cls.forward
        cls.forward = lambda self, x: G.apply(cls._unsharded(self, F.apply(x)))
    return attn
""", "changed the class gpt.Attention"),
    Answer(1, "splits the first block it gets, and leaves the others whole", """
import types
split = []
def shard_attention(attn, rank, world_size):
    if split:
        return attn
    split.append(attn)
    for linear, dim in ((attn.wq, 0), (attn.wk, 0), (attn.wv, 0), (attn.wo, 1)):
        linear.weight = nn.Parameter(linear.weight.detach().chunk(world_size, dim)[rank].clone())
    inner = type(attn).forward
    attn.forward = types.MethodType(lambda self, x: G.apply(inner(self, F.apply(x))), attn)
    return attn
""", "in block 1, attn.wq.weight should hold"),
    Answer(1, "forgets to return the module", _SPLIT + """
def shard_attention(attn, rank, world_size):
    inner = split(attn, rank, world_size)
    attn.forward = types.MethodType(lambda self, x: G.apply(inner(self, F.apply(x))), attn)
""", "it returned None"),
    Answer(2, "the solution", """
def megatron_plan():
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import PrepareModuleInput
    plan = gpt.tp_plan()
    plan["layers.*.attn"] = PrepareModuleInput(
        input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),), use_local_output=False)
    return plan
""", RIGHT),
    Answer(2, "the plan as it is", """
def megatron_plan():
    return gpt.tp_plan()
""", "still one all-reduce per projection"),
    Answer(2, "the same, leaning on PrepareModuleInput's default use_local_output=False", """
def megatron_plan():
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import PrepareModuleInput
    plan = gpt.tp_plan()
    plan["layers.*.attn"] = PrepareModuleInput(
        input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),))
    return plan
""", RIGHT),
    Answer(2, "PrepareModuleInput, but it hands attention a plain tensor again", """
def megatron_plan():
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import PrepareModuleInput
    plan = gpt.tp_plan()
    plan["layers.*.attn"] = PrepareModuleInput(
        input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),), use_local_output=True)
    return plan
""", "still one all-reduce per projection"),
    Answer(2, "the change for block 0 only", """
def megatron_plan():
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import PrepareModuleInput
    plan = gpt.tp_plan()
    plan["layers.0.attn"] = PrepareModuleInput(
        input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),), use_local_output=False)
    return plan
""", "block 1 ran all_reduce x4 at step 0"),
    Answer(2, "sequence parallelism instead", """
def megatron_plan():
    return gpt.tp_plan(sequence_parallel=True)
""", "that is sequence parallelism"),
    Answer(2, "only wq column-parallel: wk and wv left whole", """
def megatron_plan():
    plan = gpt.tp_plan()
    del plan["layers.*.attn.wk"], plan["layers.*.attn.wv"]
    return plan
""", "failed"),
    Answer(2, "returns the plan's items as a list", """
def megatron_plan():
    return list(gpt.tp_plan().items())
""", "should return a plan, a dict"),
    Answer(3, "the solution", """
def step_collectives(n_layers, sequence_parallel):
    L = n_layers
    if not sequence_parallel:
        return {"forward": {"all_reduce": 2 * L + 1 + 3}, "backward": {"all_reduce": 4 * L + 1}}
    return {"forward": {"all_gather": 2 * L + 1, "all_reduce": 3, "reduce_scatter": 2 * L + 2},
            "backward": {"all_gather": 2 * L + 2, "reduce_scatter": 2 * L + 1}}
""", RIGHT),
    Answer(3, "the same with explicit zeros", """
def step_collectives(n_layers, sequence_parallel):
    L, sp = n_layers, sequence_parallel
    return {
        "forward": {"all_reduce": 3 + (0 if sp else 2 * L + 1), "all_gather": (2 * L + 1) * sp,
                    "reduce_scatter": (2 * L + 2) * sp},
        "backward": {"all_reduce": 0 if sp else 4 * L + 1, "all_gather": (2 * L + 2) * sp,
                     "reduce_scatter": (2 * L + 1) * sp},
    }
""", RIGHT),
    Answer(3, "the notebook's 2-layer numbers, copied", """
def step_collectives(n_layers, sequence_parallel):
    if not sequence_parallel:
        return {"forward": {"all_reduce": 8}, "backward": {"all_reduce": 9}}
    return {"forward": {"all_gather": 5, "all_reduce": 3, "reduce_scatter": 6},
            "backward": {"all_gather": 6, "reduce_scatter": 5}}
""", "layers; each layer adds its own collectives"),
    Answer(3, "the layers only", """
def step_collectives(n_layers, sequence_parallel):
    if not sequence_parallel:
        return {"forward": {"all_reduce": 2 * n_layers}, "backward": {"all_reduce": 4 * n_layers}}
    per_way = {"all_gather": 2 * n_layers, "reduce_scatter": 2 * n_layers}
    return {"forward": dict(per_way), "backward": dict(per_way)}
""", "too few. Besides the layers, count the rest of the step"),
    Answer(3, "Megatron's 2 per layer in the backward", """
def step_collectives(n_layers, sequence_parallel):
    L = n_layers
    if not sequence_parallel:
        return {"forward": {"all_reduce": 2 * L + 4}, "backward": {"all_reduce": 2 * L + 1}}
    return {"forward": {"all_gather": 2 * L + 1, "all_reduce": 3, "reduce_scatter": 2 * L + 2},
            "backward": {"all_gather": 2 * L + 2, "reduce_scatter": 2 * L + 1}}
""", "is for a fused q/k/v Linear"),
    Answer(3, "sequence parallelism ignored: all-reduces either way", """
def step_collectives(n_layers, sequence_parallel):
    L = n_layers
    return {"forward": {"all_reduce": 2 * L + 4}, "backward": {"all_reduce": 4 * L + 1}}
""", "with sequence parallelism each layer all-gathers"),
    Answer(3, "the loss's all-reduces counted in the backward too", """
def step_collectives(n_layers, sequence_parallel):
    L = n_layers
    if not sequence_parallel:
        return {"forward": {"all_reduce": 2 * L + 4}, "backward": {"all_reduce": 4 * L + 1}}
    return {"forward": {"all_gather": 2 * L + 1, "all_reduce": 3, "reduce_scatter": 2 * L + 2},
            "backward": {"all_gather": 2 * L + 2, "all_reduce": 3, "reduce_scatter": 2 * L + 1}}
""", "sequence_parallel=True, the backward: CommDebugMode counts"),
    Answer(3, "the profiler's names", """
def step_collectives(n_layers, sequence_parallel):
    L = n_layers
    if not sequence_parallel:
        return {"forward": {"all_reduce": 2 * L + 4}, "backward": {"all_reduce": 4 * L + 1}}
    return {"forward": {"all_gather_into_tensor": 2 * L + 1, "all_reduce": 3,
                        "reduce_scatter_tensor": 2 * L + 2},
            "backward": {"all_gather_into_tensor": 2 * L + 2, "reduce_scatter_tensor": 2 * L + 1}}
""", "use the names all_reduce, all_gather, reduce_scatter"),
    Answer(3, "the cases the check tried, from its ✗ messages, the notebook's 2 layers else", """
def _right(L, sp):
    if not sp:
        return {"forward": {"all_reduce": 2 * L + 4}, "backward": {"all_reduce": 4 * L + 1}}
    return {"forward": {"all_gather": 2 * L + 1, "all_reduce": 3, "reduce_scatter": 2 * L + 2},
            "backward": {"all_gather": 2 * L + 2, "reduce_scatter": 2 * L + 1}}
SEEN = {(L, sp): _right(L, sp) for L in (1, 2, 3, 4, 5) for sp in (False, True)}
def step_collectives(n_layers, sequence_parallel):
    return SEEN.get((n_layers, sequence_parallel), SEEN[2, sequence_parallel])
""", "CommDebugMode counts"),
    Answer(3, "a table of every depth the check measures (1-8, both modes), pasted", """
def _right(L, sp):
    if not sp:
        return {"forward": {"all_reduce": 2 * L + 4}, "backward": {"all_reduce": 4 * L + 1}}
    return {"forward": {"all_gather": 2 * L + 1, "all_reduce": 3, "reduce_scatter": 2 * L + 2},
            "backward": {"all_gather": 2 * L + 2, "reduce_scatter": 2 * L + 1}}
SEEN = {(L, sp): _right(L, sp) for L in range(1, 9) for sp in (False, True)}
def step_collectives(n_layers, sequence_parallel):
    return SEEN.get((n_layers, sequence_parallel), SEEN[2, sequence_parallel])
""", "every layer adds the same collectives, so here"),
    Answer(3, "the solution, with numpy integers as counts", """
import numpy as np
def step_collectives(n_layers, sequence_parallel):
    L = np.int64(n_layers)
    if not sequence_parallel:
        return {"forward": {"all_reduce": 2 * L + 4}, "backward": {"all_reduce": 4 * L + 1}}
    return {"forward": {"all_gather": 2 * L + 1, "all_reduce": np.int64(3),
                        "reduce_scatter": 2 * L + 2},
            "backward": {"all_gather": 2 * L + 2, "reduce_scatter": 2 * L + 1}}
""", RIGHT),
    Answer(3, "a tuple (forward, backward)", """
def step_collectives(n_layers, sequence_parallel):
    return ({"all_reduce": 2 * n_layers + 4}, {"all_reduce": 4 * n_layers + 1})
""", "should return a dict with the keys 'forward' and 'backward'"),
]
