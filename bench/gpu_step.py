"""Training steps on a real CUDA GPU, measured beside distlab's three predictions, at several
sizes in one command.

    python bench/gpu_step.py --json out.json           # one CUDA GPU (NCCL): every size
    python bench/gpu_step.py --sizes 1.5B              # one size
    python bench/gpu_step.py --write-predictions p.json     # predictions only, any machine
    python bench/gpu_step.py --predictions p.json --json out.json   # on the GPU, with those

The layouts (`SIZES`): Llama-style models (Llama 3's vocabulary and attention shape) of about
0.9, 1.5 and 3.2 B parameters, laid out by `distlab.scale`'s own plans on a one-GPU mesh: FSDP2
with bf16 compute and fp32 gradients (torchtitan's defaults), flash attention, no checkpointing,
fused AdamW. The same stage that `distlab.scale` builds on simulated ranks is built here on the
GPU, filled with random weights, and stepped for real. Printed side by side, per size:

- memory: the caching allocator's peak of **allocated** bytes over one steady-state step
  (`torch.cuda.max_memory_allocated`), against `distlab.scale.simulate_rank` (the same code on
  a fake rank: MemTracker's peak) and `distlab.calculators.memory_per_device` (the formulas,
  torchtitan's loss upcast); and the peak **reserved** bytes (what torchtitan reports), with
  the reserved segments at the step's end grouped by the stream that made them
  (`torch.cuda.memory_snapshot`), against the simulated rank's reserved floor
  (`RankReport.reserved`: the default stream's peak plus each side stream's) and the
  calculator's (`MemoryEstimate.reserved`), and the allocator's retries (``num_alloc_retries``:
  a retry empties the cache, and the floor no longer holds);
- time: the median of 5 steps, against `distlab.calculators.step_time` (its assumptions named:
  the H100's dense bf16 peak, which the H200 shares, at the measured matmul efficiency; the
  memory-bound kernels as eager PyTorch runs them, the simulated rank's ops, at the H100's
  HBM peak of 3.35 TB/s: the H200's is 4.8).

Each prediction comes from the code of this checkout: in the same run, or (``--predictions``)
from a file written by ``--write-predictions`` on the course's own torch, for a GPU machine
whose torch is another release. Where one cannot be made, its row says why instead of a number.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from distlab.calculators import Transformer  # noqa: E402

GiB = 1024**3
CONFIG = Transformer("bench 1.5B", vocab=128256, hidden=2048, intermediate=8192, layers=16,
                     heads=32, kv_heads=8)
SEQ_LEN, MICRO_BATCH = 4096, 2
#: name: (model, sequence length, sequences per step): the first two share CONFIG's width
SIZES = {
    "0.9B": (Transformer("bench 0.9B", vocab=128256, hidden=2048, intermediate=8192, layers=8,
                         heads=32, kv_heads=8), 4096, 2),
    "1.5B": (CONFIG, SEQ_LEN, MICRO_BATCH),
    "3.2B": (Transformer("bench 3.2B", vocab=128256, hidden=3072, intermediate=8192, layers=28,
                         heads=24, kv_heads=8), 4096, 2),
}
#: The last measurement (README, "Last run on a GPU"): one NVIDIA H200, torch 2.11.0+cu130,
#: 2026-11-27; bench/steptime_accuracy.py sets the package's predictions against it.
MEASURED = {"gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "date": "2026-11-27",
            "seconds": 0.197, "peak_allocated_gib": 42.46}


def _one_gpu_group() -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))


def _build(config, layout):
    from torch.distributed.device_mesh import init_device_mesh

    from distlab.scale.plan_order import build_stage

    shape = layout.mesh_shape
    mesh = init_device_mesh("cuda", tuple(shape.values()), mesh_dim_names=tuple(shape))
    model, _, _ = build_stage(config, layout, 0, mesh)
    model.to_empty(device="cuda")
    with torch.no_grad():
        for p in model.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            local.normal_(0.0, 0.02)
    return model


def _segments_by_stream() -> dict:
    """``{stream: (reserved bytes, allocated bytes)}`` of the caching allocator's segments now
    (the default stream is 0; FSDP2's copy-in and reduce-scatter streams are others)."""
    out = {}
    for seg in torch.cuda.memory_snapshot():
        total, used = out.get(seg["stream"], (0, 0))
        out[seg["stream"]] = (total + seg["total_size"], used + seg["allocated_size"])
    return dict(sorted(out.items()))


def measured(config, layout, seq_len, micro_batch) -> dict:
    """One size's steady-state step: ``peak`` allocated bytes, ``reserved`` (the peak reserved),
    ``held`` (allocated between steps), ``streams`` (segments by stream at the step's end),
    ``retries`` (the allocator's), ``seconds`` (the median of 5 steps)."""
    model = _build(config, layout)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    tokens = torch.randint(0, config.vocab, (micro_batch, seq_len), device="cuda")
    targets = torch.randint(0, config.vocab, (micro_batch, seq_len), device="cuda")

    def step():
        out = model(tokens)
        F.cross_entropy(out.flatten(0, 1).float(), targets.flatten()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(2):  # the optimizer's state exists from the first step on
        step()
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    out = {"peak": torch.cuda.max_memory_allocated(), "reserved": torch.cuda.max_memory_reserved(),
           "held": held, "streams": {str(k): v for k, v in _segments_by_stream().items()},
           "retries": stats.get("num_alloc_retries", 0)}
    times = []
    for _ in range(5):
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    out["seconds"] = statistics.median(times)
    return out


def predictions(config, layout, seq_len, micro_batch) -> dict:
    out, report = {}, None
    try:
        from distlab.scale import simulate_rank

        report = simulate_rank(config, layout)
        out["simulated"], out["simulated reserved"] = report.peak, report.reserved
    except Exception as e:  # an API that moved: say so in the table
        out["simulated"] = f"n/a ({type(e).__name__}: {e})"[:90]
    try:
        from distlab.calculators import memory_per_device

        est = memory_per_device(config, layout)  # the layout the GPU ran, as simulated
        out["calculator"], out["calculator reserved"] = est.peak, est.reserved
    except Exception as e:
        out["calculator"] = f"n/a ({type(e).__name__}: {e})"[:90]
    try:
        from distlab.calculators import step_time

        # the step runs in eager PyTorch: its memory-bound kernels are the simulated rank's ops
        st = step_time(config, layout, memory_bound="eager", report=report)
        out["step_time"] = st.seconds
    except Exception as e:
        out["step_time"] = f"n/a ({type(e).__name__}: {e})"[:90]
    return out


def _layout(seq_len, micro_batch):
    from distlab.scale import Layout

    return Layout(dp=1, seq_len=seq_len, micro_batch=micro_batch)


def _print(name, config, seq_len, micro_batch, got, guess) -> None:
    print(f"\n{name}: {config.parameters():,} parameters, seq {seq_len} x micro-batch "
          f"{micro_batch}")
    print(f"{'memory':28} {'GiB':>8} {'/ measured':>11}")
    for label, key, against in (("measured peak allocated", None, "peak"),
                                ("simulated", "simulated", "peak"),
                                ("calculator", "calculator", "peak"),
                                ("measured peak reserved", None, "reserved"),
                                ("simulated reserved floor", "simulated reserved", "reserved"),
                                ("calculator reserved floor", "calculator reserved", "reserved")):
        value = got[against] if key is None else guess.get(key, "n/a")
        if isinstance(value, int):
            print(f"{label:28} {value / GiB:8.2f} {value / got[against]:11.2f}")
        else:
            print(f"{label:28} {value}")
    print(f"{'held between steps':28} {got['held'] / GiB:8.2f}")
    for stream, (total, used) in got["streams"].items():
        print(f"  stream {stream:>20}: {total / GiB:7.2f} GiB reserved, {used / GiB:7.2f} in use "
              "at the step's end")
    print(f"  allocator retries: {got['retries']} (a retry empties the cache: the floor is "
          "then no bound)")
    tokens = seq_len * micro_batch
    print(f"{'step time':28} {'s':>8} {'tokens/s':>11}")
    print(f"{'measured (median of 5)':28} {got['seconds']:8.3f} {tokens / got['seconds']:11,.0f}")
    value = guess["step_time"]
    if isinstance(value, float):
        print(f"{'step_time model':28} {value:8.3f} {tokens / value:11,.0f}   "
              f"(predicted / measured {value / got['seconds']:.2f})")
    else:
        print(f"{'step_time model':28} {value}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    parser.add_argument("--write-predictions", type=Path, help="write the predictions; no GPU")
    parser.add_argument("--predictions", type=Path, help="read them instead of computing them")
    parser.add_argument("--json", type=Path, help="write what was measured and predicted")
    args = parser.parse_args()
    if args.predictions:
        guesses = json.loads(args.predictions.read_text())
    else:  # first: the simulator runs a fake process group of its own
        guesses = {name: predictions(c, _layout(s, b), s, b)
                   for name, (c, s, b) in SIZES.items() if name in args.sizes}
    if args.write_predictions:
        args.write_predictions.write_text(json.dumps(guesses, indent=1) + "\n")
        print(json.dumps(guesses, indent=1))
        return 0
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 1
    _one_gpu_group()
    print(f"FSDP2 bf16/fp32 on 1 GPU ({torch.cuda.get_device_name(0)}), torch "
          f"{torch.__version__}, PYTORCH_CUDA_ALLOC_CONF="
          f"{os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '(unset)')}")
    results = {}
    for name in args.sizes:
        config, seq_len, micro_batch = SIZES[name]
        got = measured(config, _layout(seq_len, micro_batch), seq_len, micro_batch)
        torch.cuda.empty_cache()  # the next size starts from an empty cache
        _print(name, config, seq_len, micro_batch, got, guesses[name])
        results[name] = {"measured": got, "predicted": guesses[name]}
    if args.json:
        args.json.write_text(json.dumps({"gpu": torch.cuda.get_device_name(0),
                                         "torch": torch.__version__, "sizes": results},
                                        indent=1) + "\n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
