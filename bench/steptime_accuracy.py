"""How far the package's predictions are from published, measured training runs: memory and
time side by side, one stated calibration, every other row validation.

    .venv/bin/python bench/steptime_accuracy.py          # about a minute: simulates the ranks

Predicted: memory by PyTorch's own code on simulated ranks (`distlab.scale.simulate_rank`: the
caching allocator's reserved floor, `RankReport.reserved`, against torchtitan's "max reserved";
the peak of allocated bytes where the measurement is that), time by the step-time model
(`distlab.calculators.step_time`). Measured: each row names its source.

**The calibration, declared before any fit was looked at.** Two inputs are taken from measured
runs; nothing else is fitted:
- ``sustained`` (`step_time`'s input): the share of the matmuls' and attention's own rate
  (the measured MAMF) that a training job's SMs sustain. It stands for power first of all (a
  500 W H100 runs its tensor cores slower than the 700 W part MAMF was measured on), then SMs
  shared with NCCL and launch gaps. The memory-bound kernels are not scaled by it: a power cap
  lowers the SMs' clock, not the HBM's (`step_time`'s module cites NVML and a measurement), so
  they run at the HBM's peak, a floor, and what they lose below it lands in this share. Power
  differs by GPU, so the share is taken once per power limit, from **one row each**
  (`CALIBRATION`):
  * 500 W: torchtitan's Table 1, Llama 3.1 8B on FSDP 8, PyTorch eager. Why this row: every
    input is published (one node, NVLink only, no pipeline schedule or microbatch size to
    guess), nothing in it is outside the model (bf16, no compile, no Float8, no async TP), and
    its eager memory-bound kernels are the simulated rank's own ops, so no kernel is assumed.
  * 700 W: the course's own H200 step (`bench/gpu_step.py`, measured by this project): every
    input known, bf16 eager on one GPU, the H200's tensor cores are the H100 SXM's at 700 W.
- ``RESERVE``: what the caching allocator holds beyond the reserved floor (blocks rounded up,
  fragmentation between the step's sizes, the root FSDP unit torchtitan wrapped then, cuBLAS
  workspaces), as a share of the floor, from the same 500 W row (the H200 step measures
  allocated bytes, which have no reserve).
Every other row is validation: its error is printed, and the median and the worst over the
validation rows. Where the model is still off, it is too fast, and by the most where it takes
async TP to hide TP's collectives whole (torchtitan measured 9-10% won in bf16): what async
TP's pieces cost (smaller GEMMs sharing SMs and memory with the copies, the patterns the
compiler's pass does not fuse) is not modelled, nor torchtitan's per-block compile leaving
the fp32 loss and (in 2024-12) the foreach optimizer eager. Rows whose runs used what the
model does not model (Float8 matmuls) are printed, predicted as bf16, and left out of the
statistics, marked.

What the Llama 3 paper does not publish (stages per pipeline rank v, the FLOP count behind its
MFU, sequences per microbatch) is shown as a range. The point estimate takes the paper's text:
"the first model chunk on the first stage has only the embedding" (section 3.3.2) implies one
layer per chunk, v = 8 (126 layers + embedding + output on 16 ranks x 8); the count is this
package's (causal attention, `attention_flops`); 1 sequence per microbatch (Table 4's "batch
size / DP" read as microbatches of one sequence; 16 of 2 is the range's other end).
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_step  # noqa: E402
import memory_vs_torchtitan as memory_bench  # noqa: E402
import mfu_vs_llama3 as mfu_bench  # noqa: E402

from distlab.calculators import H100_HBM2E, H100_PEAK, step_time  # noqa: E402

GIB = 2**30
H200_HBM = 4.8e12  #: H200 HBM3e bytes/s (NVIDIA datasheet): its peak
TITAN = "torchtitan benchmarks/llama3_h100_202412_torchtitan.md"
ASYNC_DOC = "torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md (PR #1299)"
PAPER = "Llama 3 paper (arXiv 2407.21783), Table 4"
COURSE = "bench/gpu_step.py, measured by this project"
TIME_BAND, MEMORY_BAND = 0.10, 0.05  #: the medians the validation rows must stay within

#: The declared calibration rows (see the module): the share is taken per power limit.
CALIBRATION = {"500 W": "T1 8B FSDP 8", "700 W": "course 1.5B, 1 H200"}


@dataclass(frozen=True)
class Run:
    """One measured run. ``time``: `step_time`'s arguments (``model`` among them); ``tps``:
    measured tokens/s per GPU, or ``mfu`` (%, the paper's); ``memory``: the label of its
    `memory_vs_torchtitan` row, or None; ``marks``: compile / Float8 / async TP, as run;
    ``modelled``: False where the run used what the model leaves out (then not in the
    statistics)."""

    name: str
    source: str
    power: str
    time: dict
    tps: float = 0.0
    mfu: float = 0.0
    memory: str | None = None
    marks: tuple = ()
    modelled: bool = True
    eager_from: dict | None = field(default=None)  # the layout whose simulated ops time eager


_8B_T1 = dict(model="Llama-3 8B", dp=8, seq_len=8192, micro_batch=2, microbatches=1,
              checkpointing="op-selective-alternate", dp_link="NVLink 4 (H100 SXM)",
              hbm_bandwidth=H100_HBM2E)
_8B_T3 = dict(_8B_T1, dp=128, dp_link=None)
_70B = dict(model="Llama-3 70B", tp=8, dp=32, seq_len=8192, micro_batch=16, microbatches=1,
            checkpointing="full", hbm_bandwidth=H100_HBM2E, memory_bound="fused")
_8B_TP = dict(model="Llama-3 8B", tp=8, dp=8, seq_len=8192, micro_batch=12, microbatches=1,
              checkpointing="op-selective-alternate", hbm_bandwidth=H100_HBM2E,
              memory_bound="fused")
_FLOAT8 = "Float8 matmuls (twice the bf16 peak for Linear layers): not modelled"


def _paper(name):
    return next(layout for n, layout, _, _ in mfu_bench.PAPER if n == name)


RUNS = (
    Run("T1 8B FSDP 8", TITAN, "500 W", dict(_8B_T1, memory_bound="eager"), tps=5762,
        memory="8B FSDP 8", eager_from=_8B_T1),
    Run("T1 8B FSDP 8 + compile", TITAN, "500 W", dict(_8B_T1, memory_bound="fused"),
        tps=6667, memory="8B FSDP 8 + compile", marks=("compile",)),
    Run("T1 8B FSDP 8 + compile + Float8", TITAN, "500 W", dict(_8B_T1, memory_bound="fused"),
        tps=8532, memory="8B FSDP 8 + compile + Float8", marks=("compile", "Float8"),
        modelled=False),
    Run("T3 8B FSDP 128", TITAN, "500 W", dict(_8B_T3, memory_bound="eager"), tps=5605,
        memory="8B FSDP 128", eager_from=_8B_T3),
    Run("T3 8B FSDP 128 + compile", TITAN, "500 W", dict(_8B_T3, memory_bound="fused"),
        tps=6514, memory="8B FSDP 128 + compile", marks=("compile",)),
    Run("T3 8B FSDP 128 + compile + Float8", TITAN, "500 W",
        dict(_8B_T3, memory_bound="fused"), tps=8380, memory="8B FSDP 128 + compile + Float8",
        marks=("compile", "Float8"), modelled=False),
    Run("70B FSDP 32 x TP 8, bf16", ASYNC_DOC, "500 W", _70B, tps=597.3, marks=("compile",)),
    Run("70B FSDP 32 x TP 8, bf16 + async TP", ASYNC_DOC, "500 W", dict(_70B, async_tp=True),
        tps=652.4, marks=("compile", "async TP")),
    Run("8B FSDP 8 x TP 8, bf16", ASYNC_DOC, "500 W", _8B_TP, tps=4378, marks=("compile",)),
    Run("8B FSDP 8 x TP 8, bf16 + async TP", ASYNC_DOC, "500 W", dict(_8B_TP, async_tp=True),
        tps=4809.4, marks=("compile", "async TP")),
    Run("T4 70B FSDP 32 x TP 8", TITAN, "500 W", _70B, tps=829, memory="70B FSDP 32 TP 8",
        marks=("compile", "Float8"), modelled=False),
    Run("T4 70B FSDP 32 x TP 8 + async TP", TITAN, "500 W", dict(_70B, async_tp=True), tps=876,
        memory="70B FSDP 32 TP 8 + async TP", marks=("compile", "Float8", "async TP"),
        modelled=False),
    *(Run(f"T2 8B FSDP {8 // cp} CP {cp}, {s // 1024}K", TITAN, "500 W",
          dict(model="Llama-3 8B", dp=8 // cp, cp=cp, seq_len=s, micro_batch=1,
               microbatches=1, checkpointing="full", dp_link="NVLink 4 (H100 SXM)",
               nvlink="NVLink 4 (H100 SXM)", network="NVLink 4 (H100 SXM)",
               hbm_bandwidth=H100_HBM2E), tps=tps,
          memory=f"8B FSDP {8 // cp} CP {cp}, {s // 1024}K", marks=("compile", "Float8"),
          modelled=False)
      for cp, s, tps in ((1, 32768, 3890), (2, 65536, 2540), (4, 131072, 1071),
                         (8, 262144, 548))),
    Run("T5 405B 3D, 1F1B", TITAN, "500 W",
        dict(model="Llama-3 405B", tp=8, pp=8, dp=8, seq_len=8192, micro_batch=4,
             microbatches=8, checkpointing="full", hbm_bandwidth=H100_HBM2E,
             memory_bound="fused", async_tp=True), tps=100, memory="405B 3D, 1F1B",
        marks=("compile", "Float8", "async TP"), modelled=False),
    Run("T5 405B 3D, interleaved v=2", TITAN, "500 W",
        dict(model="Llama-3 405B", tp=8, pp=8, dp=8, seq_len=8192, micro_batch=4,
             microbatches=8, schedule="Interleaved1F1B", virtual_stages=2, checkpointing="full",
             hbm_bandwidth=H100_HBM2E, memory_bound="fused", async_tp=True), tps=128,
        memory="405B 3D, Interleaved1F1B (v=2)", marks=("compile", "Float8", "async TP"),
        modelled=False),
    *(Run(f"Table 4: {name}", PAPER, "700 W",
          dict(model="Llama-3 405B", **_paper(name), schedule="Interleaved1F1B", virtual_stages=8,
               memory_bound="fused"), mfu=mfu)
      for name, _, mfu, _ in mfu_bench.PAPER),
    Run("course 1.5B, 1 H200", COURSE, "700 W",
        dict(model=gpu_step.CONFIG, seq_len=gpu_step.SEQ_LEN, micro_batch=gpu_step.MICRO_BATCH,
             microbatches=1, memory_bound="eager", hbm_bandwidth=H200_HBM),
        tps=gpu_step.SEQ_LEN * gpu_step.MICRO_BATCH / gpu_step.MEASURED["seconds"],
        eager_from=dict(model=gpu_step.CONFIG, dp=1, seq_len=gpu_step.SEQ_LEN,
                        micro_batch=gpu_step.MICRO_BATCH, checkpointing="none")),
)


def simulate_eager(layout: dict):
    """The simulated rank of a one-stage layout (its ops time eager PyTorch's kernels)."""
    from distlab import scale

    return scale.simulate_rank(layout["model"], scale.Layout(
        dp=layout["dp"], seq_len=layout["seq_len"], micro_batch=layout["micro_batch"],
        checkpointing=layout["checkpointing"]))


def predict_time(run: Run, sustained: float, reports: dict, **change):
    """`step_time` for ``run`` at ``sustained`` (``change``: arguments to vary)."""
    args = dict(run.time, **change)
    report = reports.get(run.name) if args.get("memory_bound") == "eager" else None
    return step_time(args.pop("model"), **args, sustained=sustained, report=report)


def measured_seconds(run: Run, t) -> float:
    """The run's measured step time: from tokens/s per GPU, or from the paper's MFU (% of
    989 TFLOP/s) by ``t``'s FLOP count (the package's: causal attention)."""
    if run.tps:
        return t.tokens / t.gpus / run.tps
    return t.flops_model * t.tokens / (run.mfu / 100 * H100_PEAK * t.gpus)


def time_error(run: Run, t) -> float:
    """Predicted / measured step time, less 1 (positive: the model is slower)."""
    return t.seconds / measured_seconds(run, t) - 1


def calibrate(run: Run, reports: dict) -> float:
    """The ``sustained`` share at which ``run``'s predicted step time is its measured one
    (bisection: time falls as the share rises)."""
    lo, hi = 0.05, 1.0
    if time_error(run, predict_time(run, hi, reports)) > 0:
        raise ValueError(f"{run.name}: slower than measured even at sustained=1")
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if time_error(run, predict_time(run, mid, reports)) > 0 else (lo, mid)
    return (lo + hi) / 2


def simulated_memory(runs=RUNS, simulate=memory_bench.simulated) -> dict:
    """``{memory row label: (simulated reserved GiB, 'simulated' or why the calculator)}``:
    each torchtitan row's rank on simulated ranks (rows alike simulated once); where the
    simulation cannot run here, the calculator's floor (`MemoryEstimate.reserved`) and why."""
    wanted = {r.memory for r in runs if r.memory}
    out, cache = {}, {}
    for row in memory_bench.ROWS:
        if row.label not in wanted:
            continue
        key = (row.model, tuple(sorted(row.layout.items())))
        if key not in cache:
            est = memory_bench.predict(row)
            try:
                cache[key] = (simulate(row, est.stage).reserved / GIB, "simulated")
            except Exception as e:  # say which, and fall back to the formulas
                cache[key] = (est.reserved / GIB, f"calculator ({type(e).__name__})")
        out[row.label] = cache[key]
    return out


def course_memory() -> tuple[float, float, str]:
    """(simulated peak allocated GiB, measured GiB, how) for the course's H200 step."""
    from distlab import scale

    report = scale.simulate_rank(gpu_step.CONFIG, scale.Layout(
        dp=1, seq_len=gpu_step.SEQ_LEN, micro_batch=gpu_step.MICRO_BATCH))
    return report.peak / GIB, gpu_step.MEASURED["peak_allocated_gib"], "simulated, allocated"


@dataclass(frozen=True)
class Line:
    """One row of the table: the run, whether it calibrates, the predicted and measured."""

    run: Run
    calibrates: bool
    t: object
    time_err: float
    memory: tuple | None  # (predicted GiB, measured GiB, how) or None
    ranges: dict

    @property
    def memory_err(self):
        return None if self.memory is None else self.memory[0] / self.memory[1] - 1


def table(simulate_eager=simulate_eager, simulate=memory_bench.simulated,
          course=course_memory) -> dict:
    """Everything the bench prints: ``sustained`` per power limit, ``reserve``, the `Line`\\ s,
    and the statistics over the validation rows."""
    reports = {r.name: simulate_eager(r.eager_from) for r in RUNS if r.eager_from}
    by_name = {r.name: r for r in RUNS}
    sustained = {power: calibrate(by_name[name], reports) for power, name in CALIBRATION.items()}
    floors = simulated_memory(simulate=simulate)
    measured = {row.label: row.measured_gib for row in memory_bench.ROWS}
    cal_mem = by_name[CALIBRATION["500 W"]].memory
    reserve = measured[cal_mem] / floors[cal_mem][0] - 1
    lines = []
    for run in RUNS:
        s = sustained[run.power]
        t = predict_time(run, s, reports)
        memory = None
        if run.memory:
            floor, how = floors[run.memory]
            memory = (floor * (1 + reserve), measured[run.memory], how)
        elif run.source == COURSE:
            memory = course()
        ranges = {}
        if run.mfu:  # what the paper does not publish, as a range
            errs = [time_error(run, predict_time(run, s, reports, virtual_stages=v))
                    for v in (2, 4, 8)]
            if run.name.endswith("8,192 GPUs, 8K"):
                errs.append(time_error(run, predict_time(run, s, reports, microbatches=16,
                                                         micro_batch=2)))
            full = t.flops_model * 2 - t.flops_6n  # the full square's count
            errs.append(t.seconds / (measured_seconds(run, t) * full / t.flops_model) - 1)
            ranges["time"] = (min(errs), max(errs))
        lines.append(Line(run, run.name in CALIBRATION.values(), t, time_error(run, t),
                          memory, ranges))
    val = [x for x in lines if not x.calibrates and x.run.modelled]
    mem = [x for x in lines if x.memory is not None and x.run.name != CALIBRATION["500 W"]]
    stats = {
        "time": [abs(x.time_err) for x in val],
        # memory's calibration is the 500 W row alone; a run with compile, Float8 or async TP
        # is predicted as bf16 eager: modelled only without them
        "memory": [abs(x.memory_err) for x in mem if not x.run.marks],
        "memory, all rows but the calibration": [abs(x.memory_err) for x in mem],
    }
    return {"sustained": sustained, "reserve": reserve, "lines": lines,
            "stats": {k: (statistics.median(v), max(v), len(v)) for k, v in stats.items()}}


def _pct(x):
    return "" if x is None else f"{100 * x:+6.1f}%"


def main() -> None:
    out = table()
    print("Predicted against measured: the step-time model (time) and simulated ranks "
          "(memory)")
    for power, name in CALIBRATION.items():
        print(f"  sustained ({power}): {out['sustained'][power]:.3f} of the matmuls' and "
              f"attention's own rate, from {name}")
    print(f"  allocator reserve over the simulated floor: {out['reserve']:+.1%}, from "
          f"{CALIBRATION['500 W']}\n")
    head = (f"  {'run':<40}{'as run; kernels timed':<33}{'pred s':>9}{'meas s':>9}{'time':>9}"
            f"{'range':>18}{'pred GiB':>10}{'meas GiB':>10}{'memory':>9}  source")
    for title, keep in (("calibration rows", lambda x: x.calibrates),
                        ("validation rows", lambda x: not x.calibrates and x.run.modelled),
                        ("not modelled (Float8): predicted as bf16, not in the statistics",
                         lambda x: not x.run.modelled)):
        print(title)
        print(head)
        for x in filter(keep, out["lines"]):
            rng = x.ranges.get("time")
            rng = f"{_pct(rng[0])}..{_pct(rng[1]).strip()}" if rng else ""
            mem = x.memory
            marks = ", ".join(x.run.marks) or "bf16"
            print(f"  {x.run.name:<40}{marks + '; ' + x.run.time.get('memory_bound', 'fused'):<33}"
                  f"{x.t.seconds:9.3f}{measured_seconds(x.run, x.t):9.3f}"
                  f"{_pct(x.time_err):>9}{rng:>18}"
                  + (f"{mem[0]:10.1f}{mem[1]:10.1f}{_pct(x.memory_err):>9}" if mem else
                     f"{'':28}")
                  + f"  {x.run.source.split(' (')[0]}" + (f"; memory {mem[2]}" if mem else ""))
        print()
    for what, (median, worst, n) in out["stats"].items():
        band = {"time": TIME_BAND, "memory": MEMORY_BAND}.get(what)
        verdict = "" if band is None else (
            f" (band {band:.0%}: {'met' if median <= band else 'NOT met'})")
        print(f"  {what:<40} median |error| {median:.1%}, worst {worst:.1%} over {n} "
              f"validation rows{verdict}")
    print("\ntime: predicted / measured step time - 1 (negative: the model is faster than the "
          "run). The range column (Table 4 rows): v = 2, 4 or 8 stages per rank, the full "
          "square's FLOP count (PaLM's, torchtitan's), and for the 8,192-GPU row 16 microbatches "
          "of 2 sequences. memory: the simulated reserved floor x (1 + reserve) against max "
          "reserved (the course's row: the simulated peak against the peak allocated, no "
          "reserve); the memory statistic is over the rows run in bf16 without compile, the "
          "next over every row. Memory rows marked 'calculator' could not be simulated here: "
          "torch 2.15's pipeline schedules emit actions the simulation does not replay yet.")


if __name__ == "__main__":
    main()
