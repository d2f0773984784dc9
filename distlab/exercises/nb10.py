"""Graders for notebook 10, data parallelism by hand, then DDP (see `distlab.exercises`).

Every grader trains on 2 new ranks with a model and data of its own and compares with a
reference computed here in one process, or with what DDP's own hooks give on the same ranks.
The all-reduces an answer makes are counted from the ranks' profiler trace, not from a counter
the answer keeps. A comm hook is wrapped before DDP sees it: in torch 2.13 a hook that returns
None (a forgotten ``return``) crashes both processes with a segmentation fault, so the wrapper
stops it first and says so.
"""

from __future__ import annotations

from .. import _torch
from . import expect

WORLD = 2



def _model():
    import torch
    from torch import nn

    torch.manual_seed(0)  # the same initial weights wherever it is built
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def _batch(rows=12):
    import torch

    g = torch.Generator().manual_seed(1)
    return torch.randn(rows, 4, generator=g), torch.randn(rows, 2, generator=g)


# -- exercise 1: gradient accumulation by hand ------------------------------------------------

STEPS, MICRO = 3, 3


def _accumulating_on_rank(model_class):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = model_class(_model())
    X, Y = _batch()
    x, y = X.chunk(world_size)[rank], Y.chunk(world_size)[rank]
    for _ in range(STEPS):
        model.zero_grad()
        for k, (xm, ym) in enumerate(zip(x.chunk(MICRO), y.chunk(MICRO), strict=True)):
            model.require_sync = k == MICRO - 1  # sync in the last micro-batch only
            (F.mse_loss(model(xm), ym) / MICRO).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
    return [p.detach() for p in model.parameters()]


def _reference_1():
    import torch
    import torch.nn.functional as F

    model = _model()
    X, Y = _batch()
    for _ in range(STEPS):
        model.zero_grad()
        F.mse_loss(model(X), Y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
    return [p.detach() for p in model.parameters()]


def _probe_1(model_class):
    """A skeleton raises in ``_grad_ready`` even with require_sync off: try it here."""
    model = model_class(_model())
    model.require_sync = False
    p = next(iter(model.parameters()))
    p.grad = p.detach().clone()
    model._grad_ready(p)


def exercise_1(model_class) -> None:
    """``DataParallelNaiveAccumulating`` on 2 ranks: 3 steps of 3 micro-batches each (loss / 3),
    ``require_sync`` on in the last micro-batch only. The parameters equal one process trained
    on the whole batch, and the ranks all-reduce only in the last micro-batch: 4 parameters x 3
    steps = 12 all-reduces per rank, counted from the profiler."""
    expect.not_written(_probe_1, model_class)
    values, calls = expect.collectives(_accumulating_on_rank, model_class, world_size=WORLD)
    reference = _reference_1()
    names = ["0.weight", "0.bias", "2.weight", "2.bias"]
    for rank, params in enumerate(values):
        for name, p, ref in zip(names, params, reference, strict=True):
            expect.close(p, ref, f"rank {rank}'s {name} after {STEPS} steps",
                         rtol=1e-4, atol=1e-5)
    want = len(names) * STEPS
    for rank, names_called in enumerate(calls):
        n = sum("allreduce" in x for x in names_called)
        if n != want:
            raise AssertionError(
                f"rank {rank} made {n} all-reduces in {STEPS} steps of {MICRO} micro-batches; "
                f"syncing only in the last micro-batch of each step makes {want} (4 parameters "
                f"x {STEPS} steps). With require_sync off the hook should do nothing"
            )


# -- comm hooks: run them safely --------------------------------------------------------------

_NO_FUTURE = "distlab: the comm hook did not return a Future"


def _guarded(hook):
    """``hook`` with its result checked before DDP sees it (a None crashes torch 2.13)."""

    def guarded(state, bucket):
        fut = hook(state, bucket)
        if not isinstance(fut, _torch.future_type()):
            raise TypeError(f"{_NO_FUTURE}: {expect.describe(fut)}")
        return fut

    return guarded


def _hook_failed(failure) -> None:
    """Turn the guard's TypeError, raised on the ranks, into the learner's verdict."""
    if failure is not None and _NO_FUTURE in failure:
        got = failure.split(f"{_NO_FUTURE}: ", 1)[1]
        raise AssertionError(
            f"your hook returned {got}; DDP needs a torch.futures.Future whose value is the "
            "averaged bucket: return fut.then(...) (or the Future of default_hooks."
            "allreduce_hook). In torch 2.13, a hook that returns None crashes the process"
        )
    if failure is not None:
        raise AssertionError(f"DDP's backward raised on the ranks: {failure}")


class _Net:
    """test_c10d_common.py's Net, built on the ranks (fc1: 20, fc2: 500, fc3: 200 numbers)."""

    @staticmethod
    def build():
        import torch.nn.functional as F
        from torch import nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc1 = nn.Linear(2, 10, bias=False)
                self.fc2 = nn.Linear(10, 50, bias=False)
                self.fc3 = nn.Linear(50, 4, bias=False)
                self.relu = nn.ReLU()

            def forward(self, x):
                x = self.relu(self.fc1(x))
                x = self.relu(self.fc2(x))
                return F.softmax(self.fc3(x), dim=1)

        return Net()


# -- exercise 2: count the numbers ------------------------------------------------------------

CAPS = (25, 0.001, 0.0001)
ITERATIONS = 3


def _sizes_on_rank(hook, cap):
    """3 iterations of Net under DDP with ``hook`` (guarded) and with a spy of our own on a twin
    model: what the hook recorded, what DDP really sent, and both models' gradients."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    def spy(state, bucket):
        state["sizes"].append((state["iteration"], bucket.buffer().numel()))
        fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
        return fut.then(lambda f: f.value()[0] / dist.get_world_size())

    out = {}
    for who, h in (("yours", _guarded(hook)), ("truth", spy)):
        torch.manual_seed(0)
        model = DDP(_Net.build(), bucket_cap_mb=cap)
        state = {"sizes": []}
        model.register_comm_hook(state, h)
        g = torch.Generator().manual_seed(dist.get_rank())
        grads = []
        try:
            for state["iteration"] in range(ITERATIONS):
                model.zero_grad()
                model(torch.randn(4, 2, generator=g))[:, 0].sum().backward()  # not softmax's 1
                grads.append([p.grad.clone() for p in model.parameters()])
        except Exception as e:  # noqa: BLE001 -- the learner's hook failed: say how
            return None, None, f"{type(e).__name__}: {str(e).splitlines()[0]}"
        out[who] = (list(state["sizes"]), grads)
    return out["yours"], out["truth"], None


def exercise_2(counting_sizes) -> None:
    """``counting_sizes(state, bucket)``: appends ``(state["iteration"], numbers in the
    bucket)`` to ``state["sizes"]`` and returns the default all-reduce's Future. Run on 2 ranks,
    3 iterations of Net with bucket_cap_mb 25, 0.001 and 0.0001: what it records equals the
    buckets DDP really sent, and the gradients equal DDP's average."""
    expect.not_written(counting_sizes, {"sizes": [], "iteration": 0}, None)
    for cap in CAPS:
        for rank, (yours, truth, failure) in enumerate(
            expect.run(_sizes_on_rank, counting_sizes, cap, world_size=WORLD)
        ):
            _hook_failed(failure)
            sizes, grads = yours
            true_sizes, true_grads = truth
            for it, (g, t) in enumerate(zip(grads, true_grads, strict=True)):
                for i, (a, b) in enumerate(zip(g, t, strict=True)):
                    expect.close(a, b, f"bucket_cap_mb={cap}, iteration {it}: rank {rank}'s "
                                 f"gradient of fc{i + 1}.weight (DDP's average)",
                                 world_size=WORLD)
            if not isinstance(sizes, list):
                raise AssertionError(
                    f'state["sizes"] should be a list; got {expect.describe(sizes)}'
                )
            if sizes != true_sizes:
                raise AssertionError(
                    f"with bucket_cap_mb={cap}, DDP sent these buckets as (iteration, numbers): "
                    f"{true_sizes}; your hook recorded {sizes}. Record (state['iteration'], "
                    "bucket.buffer().numel()) once per call"
                )


# -- exercise 3: your own fp16 hook -----------------------------------------------------------


#: The largest gradient entry of exercise 3's loud case, on every rank: float16 holds it, and
#: half of it, but not the sum of two (float16's largest finite value is 65,504).
LOUD = 40_000.0


def _fp16_on_rank(hook, loud=False):
    """The gradients of one backward under the learner's hook, fp16_compress_hook and no hook.
    ``loud``: every rank trains on the same rows, with the loss scaled so that the largest
    gradient entry is `LOUD`: a hook that sums before it divides overflows float16."""
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    X, Y = _batch()
    x, y = X.chunk(WORLD)[0 if loud else rank], Y.chunk(WORLD)[0 if loud else rank]
    scale = 1.0
    if loud:
        model = _model()
        F.mse_loss(model(x), y).backward()
        scale = LOUD / max(float(p.grad.abs().max()) for p in model.parameters())
    out = {}
    for who, h in (("yours", _guarded(hook)), ("builtin", default_hooks.fp16_compress_hook),
                   ("exact", None)):
        model = DDP(_model())
        if h is not None:
            model.register_comm_hook(dist.group.WORLD, h)
        try:
            (F.mse_loss(model(x), y) * scale).backward()
        except Exception as e:  # noqa: BLE001 -- the learner's hook failed: say how
            return None, f"{type(e).__name__}: {str(e).splitlines()[0]}"
        out[who] = [p.grad.clone() for p in model.parameters()]
    return out, None


def exercise_3(my_fp16_hook) -> None:
    """``my_fp16_hook(process_group, bucket)`` on 2 ranks: the gradients equal, bit for bit,
    those of ``default_hooks.fp16_compress_hook`` (a float16 all-reduce of the bucket divided by
    the world size, cast back), on the rows of a batch and again with gradients of `LOUD` on
    every rank (whose sum float16 cannot hold)."""

    expect.not_written(my_fp16_hook, None, None)
    names = ["0.weight", "0.bias", "2.weight", "2.bias"]
    for loud in (False, True):
        _compare_fp16(expect.run(_fp16_on_rank, my_fp16_hook, loud, world_size=WORLD), names,
                      loud)


def _compare_fp16(results, names, loud) -> None:
    import torch

    for rank, (grads, failure) in enumerate(results):
        _hook_failed(failure)
        for name, mine, builtin, exact in zip(names, grads["yours"], grads["builtin"],
                                              grads["exact"], strict=True):
            what = f"rank {rank}'s gradient of {name}"
            if loud:
                what += f" (gradients up to {LOUD:,.0f} on every rank)"
            if loud and builtin.isfinite().all() and not mine.isfinite().all():
                raise AssertionError(
                    f"{what} holds inf: your hook adds the ranks' float16 values before it "
                    f"divides, and {WORLD} x {LOUD:,.0f} is more than float16 holds (65,504). "
                    "Divide by the world size before the all-reduce, as fp16_compress_hook does"
                )
            if mine.dtype != builtin.dtype:
                raise AssertionError(
                    f"{what} is {mine.dtype}; cast the all-reduced bucket back to the bucket's "
                    f"dtype ({builtin.dtype}) in the .then() callback"
                )
            if torch.equal(mine, builtin):
                continue
            if torch.allclose(mine, exact, rtol=1e-6, atol=1e-8):
                raise AssertionError(
                    f"{what} is the exact float32 average: nothing was compressed. Cast the "
                    "bucket to torch.float16 before the all-reduce"
                )
            expect.close(mine, builtin, what, rtol=1e-2, atol=1e-3, world_size=WORLD)
            raise AssertionError(
                f"{what} is close to fp16_compress_hook's but not bit for bit: divide by the "
                "world size and cast to float16 before the all-reduce, cast back after it"
            )
