"""One layout's training step on a real CUDA GPU, measured beside distlab's three predictions.

    python bench/gpu_step.py            # on a machine with one CUDA GPU (NCCL)
    python bench/gpu_step.py --write-predictions p.json     # predictions only, any machine
    python bench/gpu_step.py --predictions p.json           # on the GPU, with those predictions

The layout: a Llama-style model of about 1.5 B parameters (Llama 3's vocabulary and attention
shape, 16 layers of width 2048) laid out by `distlab.scale`'s own plans on a one-GPU mesh: FSDP2
with bf16 compute and fp32 gradients (torchtitan's defaults), flash attention, no checkpointing,
fused AdamW. The same stage that `distlab.scale` builds on simulated ranks is built here on the
GPU, filled with random weights, and stepped for real. Printed side by side:

- memory: the caching allocator's peak of **allocated** bytes over one steady-state step
  (`torch.cuda.max_memory_allocated`; reserved, which torchtitan reports, is never below it),
  against `distlab.scale.simulate_rank` (the same code on a fake rank: MemTracker's peak) and
  `distlab.calculators.memory_per_device` (the formulas, torchtitan's loss upcast);
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


def _one_gpu_group() -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))


def _build(layout):
    from torch.distributed.device_mesh import init_device_mesh

    from distlab.scale.plan_order import build_stage

    shape = layout.mesh_shape
    mesh = init_device_mesh("cuda", tuple(shape.values()), mesh_dim_names=tuple(shape))
    model, _, _ = build_stage(CONFIG, layout, 0, mesh)
    model.to_empty(device="cuda")
    with torch.no_grad():
        for p in model.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            local.normal_(0.0, 0.02)
    return model


def measured(layout) -> tuple[int, int, float]:
    """(peak allocated bytes in a steady step, bytes held between steps, median step seconds)."""
    model = _build(layout)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    tokens = torch.randint(0, CONFIG.vocab, (MICRO_BATCH, SEQ_LEN), device="cuda")
    targets = torch.randint(0, CONFIG.vocab, (MICRO_BATCH, SEQ_LEN), device="cuda")

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
    peak = torch.cuda.max_memory_allocated()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return peak, held, statistics.median(times)


def predictions(layout) -> dict:
    out, report = {}, None
    try:
        from distlab.scale import simulate_rank

        report = simulate_rank(CONFIG, layout)
        out["simulated"] = report.peak
    except Exception as e:  # an API that moved: say so in the table
        out["simulated"] = f"n/a ({type(e).__name__}: {e})"[:90]
    try:
        from distlab.calculators import memory_per_device

        est = memory_per_device(CONFIG, layout)  # the layout the GPU ran, as simulated
        out["calculator"] = est.peak
    except Exception as e:
        out["calculator"] = f"n/a ({type(e).__name__}: {e})"[:90]
    try:
        from distlab.calculators import step_time

        # the step runs in eager PyTorch: its memory-bound kernels are the simulated rank's ops
        st = step_time(CONFIG, layout, memory_bound="eager", report=report)
        out["step_time"] = st.seconds
    except Exception as e:
        out["step_time"] = f"n/a ({type(e).__name__}: {e})"[:90]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write-predictions", type=Path, help="write the predictions; no GPU")
    parser.add_argument("--predictions", type=Path, help="read them instead of computing them")
    args = parser.parse_args()
    from distlab.scale import Layout

    layout = Layout(dp=1, seq_len=SEQ_LEN, micro_batch=MICRO_BATCH)
    if args.predictions:
        guess = json.loads(args.predictions.read_text())
    else:
        guess = predictions(layout)  # first: the simulator runs a fake process group of its own
    if args.write_predictions:
        args.write_predictions.write_text(json.dumps(guess, indent=1) + "\n")
        print(json.dumps(guess, indent=1))
        return 0
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 1
    _one_gpu_group()
    name = torch.cuda.get_device_name(0)
    peak, held, seconds = measured(layout)
    print(f"{CONFIG.parameters():,} parameters, seq {SEQ_LEN} x micro-batch {MICRO_BATCH}, "
          f"FSDP2 bf16/fp32 on 1 GPU ({name}), torch {torch.__version__}")
    print(f"{'memory (peak allocated)':28} {'GiB':>8} {'/ measured':>11}")
    print(f"{'measured':28} {peak / GiB:8.2f} {1:11.2f}   (held between steps: {held / GiB:.2f})")
    for what in ("simulated", "calculator"):
        value = guess[what]
        if isinstance(value, int):
            print(f"{what:28} {value / GiB:8.2f} {value / peak:11.2f}")
        else:
            print(f"{what:28} {value}")
    tokens = SEQ_LEN * MICRO_BATCH
    print(f"{'step time':28} {'s':>8} {'tokens/s':>11}")
    print(f"{'measured (median of 5)':28} {seconds:8.3f} {tokens / seconds:11,.0f}")
    value = guess["step_time"]
    if isinstance(value, float):
        print(f"{'step_time model':28} {value:8.3f} {tokens / value:11,.0f}   "
              f"(predicted / measured {value / seconds:.2f})")
    else:
        print(f"{'step_time model':28} {value}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
