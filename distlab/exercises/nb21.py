"""Graders for notebook 21, tensor and sequence parallelism (see `distlab.exercises`).

All run on the notebook's live cluster (2 ranks that imported DTensor already). In exercises 1
and 2 the learner's code builds a tensor-parallel tiny GPT (`distlab.gpt`) there, which trains
three steps and is compared with one process (`distlab.gradcheck`); exercise 2 also counts each
layer's collectives with ``CommDebugMode``. Exercise 3's answer is a formula, run in the kernel,
compared with what ``CommDebugMode`` counts on the cluster for models of several depths.

`F` and `G` are the notebook's Megatron f and g, importable, for tests that answer the
exercises outside the notebook.
"""

from __future__ import annotations

import itertools
import numbers

import torch

from . import expect

#: Seconds a check may take on the cluster: three steps of a DTensor model on busy ranks.
TIMEOUT = 30.0

STEPS = 3
ATTENTION_SHARDS = {"layers.*.attn.wq.weight": 0, "layers.*.attn.wk.weight": 0,
                    "layers.*.attn.wv.weight": 0, "layers.*.attn.wo.weight": 1}


class F(torch.autograd.Function):
    """Megatron's f: the identity forward, an all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        import torch.distributed as dist

        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class G(torch.autograd.Function):
    """Megatron's g: an all-reduce forward, the identity backward."""

    @staticmethod
    def forward(ctx, x):
        import torch.distributed as dist

        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


def _train(model, recorder, loss_context=None, count=False):
    """STEPS AdamW steps of `model` on the whole batch (every TP rank sees all of it); returns
    the recorder and, with ``count``, each step's collectives of every block per direction."""
    import contextlib

    from torch.distributed.tensor.debug import CommDebugMode

    from .. import gpt

    config = model.config
    opt = gpt.make_optimizer(model.parameters())
    counts = []
    for step in range(STEPS):
        tokens, targets = gpt.batch(step, 8, config)
        with contextlib.ExitStack() as stack:
            cm = stack.enter_context(CommDebugMode()) if count else None
            if loss_context is not None:
                stack.enter_context(loss_context())
            loss = gpt.loss(model(tokens), targets)
            loss.backward()
        if count:
            counts.append([
                {way: {str(op).split(".")[-1]: n for op, n in ops.items() if n}
                 for way, ops in cm.comm_module_counts.get(f"GPT.layers.{i}", {}).items()}
                for i in range(config.layers)
            ])
        opt.step()
        recorder.record(step, loss, model, opt)
        opt.zero_grad()
    return recorder, counts


def _failed(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


# -- exercise 1: attention split by heads, by hand ---------------------------------------------


#: World sizes the answer is also called with, on fresh modules, besides the cluster's: its
#: shares are compared with the weights' chunks (a split hard-coded for 2 ranks fails here).
OTHER_WORLDS = (1, 4)


def _shares(attn) -> dict:
    return {name: tuple(p.shape) for name, p in attn.named_parameters()}


def _other_worlds(answer) -> dict | None:
    """Call the answer on fresh modules as rank r of each world in `OTHER_WORLDS` (no forward
    runs); the first share that is not the weights' chunk, or None."""
    import torch

    from .. import gpt

    whole = gpt.GPT(gpt.Config(), seed=0).layers[0].attn
    for world in OTHER_WORLDS:
        for rank in range(world):
            attn = gpt.GPT(gpt.Config(), seed=0).layers[0].attn
            out = answer(attn, rank, world)
            out = out if isinstance(out, torch.nn.Module) else attn
            for name, dim in (("wq", 0), ("wk", 0), ("wv", 0), ("wo", 1)):
                want = getattr(whole, name).weight.detach().chunk(world, dim)[rank]
                got = getattr(getattr(out, name, None), "weight", None)
                if got is None or got.shape != want.shape or not torch.equal(got.detach(), want):
                    shape = None if got is None else tuple(got.shape)
                    return {"world": world, "rank": rank, "name": f"{name}.weight",
                            "want": tuple(want.shape), "got": shape, "dim": dim}
    return None


def _sharded_attention_run(answer):
    import warnings

    import torch.distributed as dist
    from torch import nn

    from .. import gpt, gradcheck

    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    rank, world = dist.get_rank(), dist.get_world_size()
    before = dict(vars(gpt.Attention))
    model = gpt.GPT(gpt.Config(), seed=0)
    for layer in model.layers:
        out = answer(layer.attn, rank, world)
        if not isinstance(out, nn.Module):
            return {"returned": expect.describe(out)}
        layer.attn = out
    changed = sorted(k for k, v in vars(gpt.Attention).items() if before.get(k) is not v)
    if changed:
        return {"class": changed}
    shapes = [_shares(layer.attn) for layer in model.layers]
    other = _other_worlds(answer)
    try:
        recorder, _ = _train(model, gradcheck.Recorder(shards=ATTENTION_SHARDS))
    except RuntimeError as e:
        return {"failed": _failed(e), "shapes": shapes, "other": other}
    return {"recorder": recorder, "shapes": shapes, "other": other}


def exercise_1(shard_attention, cluster) -> None:
    """``shard_attention(attn, rank, world_size)`` turns a tiny-GPT ``Attention`` into this
    rank's heads (``wq``/``wk``/``wv`` rows, ``wo`` columns, contiguous blocks) with Megatron's
    f before and g after, in place (this module, not its class), and returns it. On the
    cluster every block gets it and every block's shares are checked, as are the shares it
    gives fresh modules for 1 and 4 ranks; three AdamW steps must equal one process's
    (gradcheck, the shards gathered by dim)."""
    from .. import gpt, gradcheck

    results = expect.run(_sharded_attention_run, shard_attention, cluster=cluster,
                         timeout=TIMEOUT)
    world = len(results)
    h = gpt.Config().hidden
    want = {"wq.weight": (h // world, h), "wk.weight": (h // world, h),
            "wv.weight": (h // world, h), "wo.weight": (h, h // world)}
    for rank, r in enumerate(results):
        if "returned" in r:
            raise AssertionError(
                f"shard_attention should return the attention module; on rank {rank} it "
                f"returned {r['returned']}"
            )
        if "class" in r:
            raise AssertionError(
                f"shard_attention changed the class gpt.Attention ({', '.join(r['class'])}): "
                "that changes every attention module of every model on the rank, the other "
                "ranks' and later cells' too. Change this module only: attn.forward = "
                "types.MethodType(forward, attn). (distlab put the class back.)"
            )
        for block, shapes in enumerate(r["shapes"]):
            for name, shape in want.items():
                if shapes.get(name) != shape:
                    raise AssertionError(
                        f"on rank {rank}, in block {block}, attn.{name} should hold this rank's "
                        f"share, shape {shape} (wq, wk, wv: rows = output features = heads; wo: "
                        f"columns = its input features); it has shape {shapes.get(name)}"
                    )
        if "failed" in r:
            raise AssertionError(
                f"the weights have the right shapes, but a training step failed on rank {rank}: "
                f"{r['failed']}"
            )
    report = gradcheck.compare([r["recorder"] for r in results],
                               gpt.reference_run(gpt.Config(), steps=STEPS))
    if not report.ok:
        raise AssertionError(f"not the one-process run: {report.mismatch.text()}")
    for r in results:
        other = r["other"]
        if other is not None:
            k, total = other["want"][other["dim"]], h
            lo = other["rank"] * k
            part = "rows" if other["dim"] == 0 else "columns"
            got = ("the wrong values" if other["got"] == other["want"] else
                   f"shape {other['got']}")
            raise AssertionError(
                f"right on this 2-rank cluster, but called with rank {other['rank']} and "
                f"world_size={other['world']}, attn.{other['name']} should hold {part} "
                f"{lo}..{lo + k - 1} of {total}, shape {other['want']}; it holds {got}. Split "
                "by the world_size and rank you are given: a model may have any number of ranks"
            )


# -- exercise 2: Megatron's count ----------------------------------------------------------------


def _plan_run(answer):
    import warnings

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel, parallelize_module

    from .. import gpt, gradcheck

    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    plan = answer()
    if not isinstance(plan, dict):
        return {"returned": expect.describe(plan)}
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    try:
        model = parallelize_module(gpt.GPT(gpt.Config(), seed=0), mesh, plan)
        recorder, counts = _train(model, gradcheck.Recorder(), loss_parallel, count=True)
    except (RuntimeError, ValueError, TypeError, AttributeError) as e:
        return {"failed": _failed(e)}
    return {"recorder": recorder, "counts": counts}


def _text(ops: dict) -> str:
    return ", ".join(f"{op} x{n}" for op, n in sorted(ops.items())) or "no collective"


def exercise_2(megatron_plan, cluster) -> None:
    """``megatron_plan()`` -> a ``parallelize_module`` plan for the tiny GPT whose every block
    all-reduces twice in the forward and twice in the backward (and nothing else), and trains
    like one process."""
    from .. import gpt, gradcheck

    results = expect.run(_plan_run, megatron_plan, cluster=cluster, timeout=TIMEOUT)
    r = results[0]
    if "returned" in r:
        raise AssertionError(
            f"megatron_plan() should return a plan, a dict like gpt.tp_plan(); it returned "
            f"{r['returned']}"
        )
    if "failed" in r:
        raise AssertionError(f"parallelizing and training with your plan failed: {r['failed']}")
    for step, blocks in enumerate(r["counts"]):
        for (block, counted), way in itertools.product(enumerate(blocks),
                                                       ("forward", "backward")):
            ops = counted.get(way, {})
            if ops != {"all_reduce": 2}:
                extra = ""
                if ops.get("all_reduce", 0) == 4 and way == "backward":
                    extra = (
                        ": still one all-reduce per projection. Make attention's input a "
                        "replicated DTensor before wq, wk, wv see it (PrepareModuleInput on "
                        "layers.*.attn, use_local_output=False)"
                    )
                elif "all_gather_into_tensor" in ops or "reduce_scatter_tensor" in ops:
                    extra = ": that is sequence parallelism; the question asks for all-reduces"
                raise AssertionError(
                    f"each block should all-reduce twice in the {way} (Megatron's count); block "
                    f"{block} ran {_text(ops)} at step {step}{extra}"
                )
    report = gradcheck.compare([x["recorder"] for x in results],
                               gpt.reference_run(gpt.Config(), steps=STEPS))
    if not report.ok:
        raise AssertionError(
            f"the counts are right, but the model is not the one-process model: "
            f"{report.mismatch.text()}"
        )


# -- exercise 3: a whole step's collectives, as a formula -----------------------------------------

#: The depths exercise 3 measures at every check, for each of with and without sequence
#: parallelism apart: one from each tuple, so that a formula must tell what grows with the
#: layers from what does not. Never the notebook's own 2 layers (a number copied from its
#: table fits no case). Besides these the formula is asked for one depth from `FAR`, drawn
#: anew, that no check measures: a model's counts grow by the same collectives with every
#: layer, so the two measured depths give the line that one lies on. (A table of every case
#: earlier ✗ messages showed does not pass: there are thousands.)
SHALLOW = (1, 3, 4, 5)
DEEP = (6, 7, 8)
FAR = range(9, 4097)
NAMES = ("all_reduce", "all_gather", "reduce_scatter")
_SHORT = {"all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter"}


def _count_run(cases):
    """One training step per (n_layers, sequence_parallel) in ``cases`` under CommDebugMode and
    loss_parallel: ``{case: {"forward"|"backward": {name: count}}}`` for the whole model."""
    import warnings

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import loss_parallel, parallelize_module

    from .. import gpt

    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    counted = {}
    for n_layers, sp in cases:
        config = gpt.Config(layers=n_layers)
        model = parallelize_module(gpt.GPT(config, seed=0), mesh, gpt.tp_plan(sp))
        tokens, targets = gpt.batch(0, 8, config)
        with CommDebugMode() as cm, loss_parallel():
            gpt.loss(model(tokens), targets).backward()
        ways = cm.comm_module_counts.get("Global", {})
        counted[(n_layers, sp)] = {
            way: {_SHORT.get(str(op).split(".")[-1], str(op).split(".")[-1]): n
                  for op, n in ops.items() if n}
            for way, ops in ways.items()
        }
    return counted


def _as_counts(value, where: str) -> dict:
    """The learner's ``{"forward": {...}, "backward": {...}}``, zero counts dropped; else raise."""
    example = '{"forward": {"all_reduce": 8}, "backward": {"all_reduce": 9}}'
    if not isinstance(value, dict) or set(value) != {"forward", "backward"}:
        raise AssertionError(
            f"step_collectives{where} should return a dict with the keys 'forward' and "
            f"'backward', like {example}; it returned {expect.describe(value)}"
        )
    out = {}
    for way in ("forward", "backward"):
        ops = value[way]
        if not isinstance(ops, dict):
            raise AssertionError(
                f"step_collectives{where}[{way!r}] should be a dict of collective names to "
                f"counts, like {{'all_reduce': 8}}; it is {expect.describe(ops)}"
            )
        for name, n in ops.items():
            if name not in NAMES:
                raise AssertionError(
                    f"step_collectives{where}[{way!r}] names {name!r}; use the names "
                    f"{', '.join(NAMES)}"
                )
            if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
                raise AssertionError(
                    f"step_collectives{where}[{way!r}][{name!r}] should be an int count; it is "
                    f"{expect.describe(n)}"
                )
        out[way] = {name: int(n) for name, n in ops.items() if n}
    return out


def _on_the_line(shallow: dict, deep: dict, depths: tuple[int, int], n_layers: int) -> dict:
    """The counts at ``n_layers``, from those measured at two ``depths``: every layer adds the
    same collectives, so each count is a line in the depth (what it adds per layer divides
    evenly; the two measured depths say by how much)."""
    (a, b), out = depths, {}
    for way in ("forward", "backward"):
        ops = {}
        for name in set(shallow.get(way, {})) | set(deep.get(way, {})):
            low, high = shallow.get(way, {}).get(name, 0), deep.get(way, {}).get(name, 0)
            per, left = divmod(high - low, b - a)
            if left:
                raise RuntimeError(f"{name} in the {way} does not grow by whole calls per layer "
                                   f"({low} at {a} layers, {high} at {b}): distlab's bug")
            if low + per * (n_layers - a):
                ops[name] = low + per * (n_layers - a)
        out[way] = ops
    return out


def _hint(n_layers: int, sp: bool, way: str, got: dict, want: dict) -> str:
    if not sp and way == "backward" and got.get("all_reduce") == 2 * n_layers + 1:
        return (
            ": Megatron's 2 per layer in the backward is for a fused q/k/v Linear; gpt.tp_plan() "
            "has three ColwiseParallel projections, each all-reducing its input's gradient"
        )
    if sp and "all_gather" not in got:
        return (
            ": with sequence parallelism each layer all-gathers (PrepareModuleInput) and "
            "reduce-scatters (RowwiseParallel(output_layouts=Shard(1))) instead of all-reducing"
        )
    if all(got.get(k, 0) <= v for k, v in want.items()) and sum(got.values()) < sum(want.values()):
        return (
            ": too few. Besides the layers, count the rest of the step: the embeddings, the "
            "head, and loss_parallel's all-reduces"
        )
    return ""


def exercise_3(step_collectives, cluster) -> None:
    """``step_collectives(n_layers, sequence_parallel)`` -> ``{"forward": {name: count},
    "backward": {name: count}}``: the collectives of one training step of the whole tiny GPT
    (``gpt.tp_plan(sequence_parallel)``, ``loss_parallel``) on 2 ranks, names ``all_reduce``,
    ``all_gather``, ``reduce_scatter``. Compared with ``CommDebugMode``'s counts on the cluster
    for two depths drawn at every check (`SHALLOW`, `DEEP`), with and without sequence
    parallelism each, and at a third depth drawn from `FAR`, where they lie on the line through
    the two measured."""
    rng = expect.rng()
    depths = {sp: (rng.choice(SHALLOW), rng.choice(DEEP)) for sp in (False, True)}
    far = {sp: rng.choice(FAR) for sp in (False, True)}
    cases = tuple((n, sp) for sp in (False, True) for n in depths[sp])
    asked = (*cases, *((far[sp], sp) for sp in (False, True)))
    answers = {case: step_collectives(*case) for case in asked}  # the learner's formula first
    answers = {
        case: _as_counts(value, f"(n_layers={case[0]}, sequence_parallel={case[1]})")
        for case, value in answers.items()
    }
    measured = expect.run(_count_run, cases, cluster=cluster, timeout=TIMEOUT)[0]
    for sp in (False, True):
        shallow, deep = depths[sp]
        measured[(far[sp], sp)] = _on_the_line(measured[(shallow, sp)], measured[(deep, sp)],
                                               depths[sp], far[sp])
    for case in asked:
        n_layers, sp = case
        for way in ("forward", "backward"):
            got, want = answers[case][way], measured[case].get(way, {})
            if got != want:
                shallow, deep = depths[sp]
                same_depths = answers[(shallow, sp)] == answers[(deep, sp)]
                hint = (
                    f": your formula gives the same counts for {shallow} and {deep} layers; each "
                    "layer adds its own collectives"
                    if same_depths
                    else _hint(n_layers, sp, way, got, want)
                )
                counted = ("CommDebugMode counts" if case in cases else
                           f"CommDebugMode counts {shallow} and {deep} layers on the cluster; "
                           "every layer adds the same collectives, so here")
                raise AssertionError(
                    f"for n_layers={n_layers}, sequence_parallel={sp}, the {way}: {counted} "
                    f"{_text(want)}; your formula says {_text(got)}{hint}"
                )
