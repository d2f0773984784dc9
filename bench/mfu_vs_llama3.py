"""The step-time model (`distlab.calculators.step_time`) against measured H100 runs.

    .venv/bin/python bench/mfu_vs_llama3.py

Measured: the Llama 3 paper (arXiv 2407.21783), Table 4: Llama 3 405B pre-training on H100 SXM
(700 W, RoCE at 400 Gb/s per GPU), BF16 MFU and TFLOPs per GPU, 16M tokens per batch; and
torchtitan's benchmarks/llama3_h100_202412_torchtitan.md (tokens/s per GPU, 96 GB H100s at
500 W, 400 Gb/s RDMA per GPU, torch of 2024-12-23).

For each paper row (the paper's kernels are not said: memory-bound ones counted fused) the
model starts from notebook 25's naive assumptions (50% matmul efficiency,
full recomputation, plain 1F1B, the links' peaks) and moves to the paper's choices one
assumption at a time, printing what each moves. The paper's schedule is interleaved 1F1B; it
does not say how many stages per rank, so v = 2 (torchtitan's default for interleaved
schedules: `pipeline_parallel.py`, stages_per_rank = 2), and a line shows v = 4.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from distlab.calculators import H100_HBM2E, MATMUL_EFFICIENCY, step_time

BAND = 5.0  #: points of MFU the paper's rows should land within
#: the paper's inputs it does not publish: stages per pipeline rank, how its kernels ran
UNPUBLISHED = tuple((v, kernels) for v in (2, 4, 8) for kernels in ("fused", "eager"))


@dataclass(frozen=True)
class Choices:
    schedule: str = "1F1B"
    virtual_stages: int = 1
    checkpointing: str = "full"
    bandwidth: str = "peak"
    matmul_efficiency: float = 0.5


NAIVE = Choices()
STEPS = (  # (what changes, the field, its value): one assumption at a time
    ("schedule: interleaved 1F1B, v=2", {"schedule": "Interleaved1F1B", "virtual_stages": 2}),
    ("recomputation: none (the paper's at 8K)", {"checkpointing": "none"}),
    ("links: NCCL-measured busbw, not peak", {"bandwidth": "measured"}),
    (f"matmuls: measured MAMF, {MATMUL_EFFICIENCY:.1%}",
     {"matmul_efficiency": MATMUL_EFFICIENCY}),
)

#: Table 4 of the Llama 3 paper: (name, layout, measured MFU %, measured TFLOPs per GPU).
PAPER = (
    ("8,192 GPUs, 8K", dict(tp=8, cp=1, pp=16, dp=64, seq_len=8192, microbatches=32), 43, 430),
    ("16,384 GPUs, 8K", dict(tp=8, cp=1, pp=16, dp=128, seq_len=8192, microbatches=16), 41, 400),
    ("16,384 GPUs, CP 16, 128K",
     dict(tp=8, cp=16, pp=16, dp=8, seq_len=131072, microbatches=16), 38, 380),
)

_T1 = dict(dp=8, seq_len=8192, micro_batch=2, microbatches=1,
           checkpointing="op-selective-alternate", dp_link="NVLink 4 (H100 SXM)",
           hbm_bandwidth=H100_HBM2E)  # its GPUs' HBM2e, not the SXM's HBM3
_T3 = dict(_T1, dp=128, dp_link=None)
#: torchtitan's H100 tables: (row, step_time arguments or None, measured TPS/GPU, why not).
#: Its runs without torch.compile are PyTorch eager: their memory-bound kernels are timed from
#: the simulated rank's own ops (``memory_bound="eager"``); with compile, as fused kernels.
TORCHTITAN = (
    ("T1 8B FSDP 8, selective AC", dict(_T1, memory_bound="eager"), 5762, ""),
    ("T3 8B FSDP 128, selective AC", dict(_T3, memory_bound="eager"), 5605, ""),
    ("T1 8B FSDP 8 + compile", dict(_T1, memory_bound="fused"), 6667,
     "counted as fusing every elementwise region (it compiled per block: the fp32 loss, about "
     "70 GB a step, stayed eager)"),
    ("T1 8B FSDP 8 + compile + Float8", None, 8532,
     "Float8 matmuls: twice the peak for Linear layers (+28% over compile)"),
    ("T2 8B FSDP+CP, 32K-256K", None, 3890, "compile + Float8"),
    ("T4 70B FSDP 32 x TP 8", None, 829, "compile + Float8; async TP: 876"),
    ("T5 405B FSDP 8 x TP 8 x PP 8 1F1B", None, 100, "compile + Float8 + async TP"),
    ("T5 405B ... interleaved 1F1B", None, 128, "compile + Float8 + async TP"),
    ("T6 405B 4D, 32K-256K", None, 76, "compile + Float8 + async TP"),
)


def predict(layout: dict, choices: Choices, model="Llama-3 405B", **more):
    return step_time(model, **layout, **choices.__dict__, **more)


def paper_rows():
    """[(name, measured MFU, [(step, choices, StepTime)])] for each of Table 4's rows."""
    rows = []
    for name, layout, mfu, _ in PAPER:
        choices, steps = NAIVE, [("naive: notebook 25's assumptions", NAIVE)]
        for what, change in STEPS:
            choices = replace(choices, **change)
            steps.append((what, choices))
        steps.append(("(v=4 instead of 2, for scale)", replace(choices, virtual_stages=4)))
        rows.append((name, mfu, [(w, c, predict(layout, c)) for w, c in steps]))
    return rows


def final(row):
    """The prediction with the paper's choices (the last step before the v=4 line)."""
    return row[2][-2][2]


def main() -> None:
    print("Llama 3 405B, the paper's Table 4 (MFU with causal attention counted, % of 989 "
          "TFLOP/s; the 6N MFU beside it)")
    for name, mfu, steps in paper_rows():
        print(f"\n{name}: measured {mfu}%")
        print(f"  {'assumption, one at a time':<44} {'MFU':>6} {'6N':>6} {'moves':>7} "
              f"{'bubble':>7} {'step':>7}  vs measured")
        before = None
        for what, _, t in steps:
            moved = "" if before is None else f"{100 * (t.mfu - before):+.1f}"
            if not what.startswith("("):
                before = t.mfu
            print(f"  {what:<44} {100 * t.mfu:5.1f}% {100 * t.mfu_6n:5.1f}% {moved:>7} "
                  f"{float(t.bubble):6.1%} {t.seconds:6.2f}s  {t.mfu / (mfu / 100):.2f}x")
    print(f"\nWith the paper's choices (band: {BAND:.0f} points):")
    print(f"  {'row':<26} {'predicted':>10} {'measured':>9} {'gap':>6} {'TFLOP/s':>8} {'paper':>6}")
    for (name, mfu, steps), (_, _, _, tf) in zip(paper_rows(), PAPER, strict=True):
        t = final((name, mfu, steps))
        gap = 100 * t.mfu - mfu
        print(f"  {name:<26} {100 * t.mfu:9.1f}% {mfu:8d}% {gap:+6.1f} {t.tflops_per_gpu:8.0f} "
              f"{tf:6d}  {'within' if abs(gap) <= BAND else 'OUTSIDE'}")
    unpublished_table(unpublished())
    print("\ntorchtitan, Llama 3.1 on H100 (tokens/s per GPU; its GPUs are 500 W 96 GB parts "
          "with HBM2e at 2.4 TB/s, which the model uses; it assumes 989 TFLOP/s)")
    print(f"  {'row':<36} {'predicted':>10} {'measured':>9} {'ratio':>6}")
    for name, t, tps, why in torchtitan_rows():
        if t is None:
            print(f"  {name:<36} {'not modelled':>10} {tps:9,d}        {why}")
            continue
        p = t.tokens_per_second_per_gpu
        print(f"  {name:<36} {p:10,.0f} {tps:9,d} {p / tps:6.2f}  {why}")
    print("  not modelled in any row: torchtitan's GPUs capped at 500 W (the matmul efficiency "
          "is measured at 700 W), the CPU's kernel launches, the memory-bound kernels below "
          "the HBM peak")


def middle_rank(layout: dict):
    """A middle pipeline rank of a Table 4 row (8 layers, no embedding, no loss: the slowest
    stage), laid out as the paper ran it, simulated."""
    from distlab import scale

    return scale.simulate_rank("Llama-3 405B", scale.Layout(
        **layout, schedule="Interleaved1F1B", virtual_stages=2), stage=1)


def unpublished(simulate=middle_rank):
    """[(row, measured MFU %, {(v, kernels): StepTime})]: each Table 4 row with the paper's
    choices, at every pairing of the inputs it does not publish (`UNPUBLISHED`). The eager
    kernels are a simulated middle rank's at v = 2 (``simulate(layout)``; a rank's bytes per
    microbatch hardly depend on v: its 8 layers are the same, and at v = 8 the schedule's
    gathers between a stage's uses add 0.4%, measured)."""
    base = replace(NAIVE, **{k: v for _, change in STEPS for k, v in change.items()})
    rows = []
    for name, layout, mfu, _ in PAPER:
        report = simulate(layout)
        rows.append((name, mfu, {
            (v, kernels): predict(layout, replace(base, virtual_stages=v), memory_bound=kernels,
                                  report=report if kernels == "eager" else None)
            for v, kernels in UNPUBLISHED}))
    return rows


def closest(rows):
    """``((v, kernels), worst gap in points)``: the pairing whose farthest row is nearest."""
    def worst(pairing):
        return max(abs(100 * cells[pairing].mfu - mfu) for _, mfu, cells in rows)

    best = min(UNPUBLISHED, key=worst)
    return best, worst(best)


def unpublished_table(rows) -> None:
    print("\nWhat the paper does not publish: stages per pipeline rank (v) and how its "
          "memory-bound kernels ran\n(fused: each elementwise region one kernel; eager: a "
          "simulated middle rank's own ops, one kernel each)")
    heads = "".join(f"{f'v={v} {k}':>11}" for v, k in UNPUBLISHED)
    print(f"  {'row':<26}{heads}  measured  inside")
    for name, mfu, cells in rows:
        mfus = [100 * cells[pairing].mfu for pairing in UNPUBLISHED]
        inside = min(mfus) <= mfu <= max(mfus)
        print(f"  {name:<26}" + "".join(f"{x:10.1f}%" for x in mfus)
              + f"  {mfu:7d}%  {'yes' if inside else 'NO'}")
    (v, kernels), gap = closest(rows)
    print(f"  closest to all three rows: v={v}, {kernels}: the farthest row {gap:.1f} points "
          f"off (band {BAND:.0f})")


def simulated(layout: dict):
    """The 8B rank torchtitan ran, simulated (its ops give the eager kernels' bytes)."""
    from distlab import scale

    return scale.simulate_rank("Llama-3 8B", scale.Layout(
        dp=layout["dp"], seq_len=layout["seq_len"], micro_batch=layout["micro_batch"],
        checkpointing=layout["checkpointing"]))


def torchtitan_rows(simulate=simulated):
    """[(name, StepTime or None, measured TPS/GPU, note)] for torchtitan's rows; ``simulate``
    makes the simulated rank of a layout (once per dp)."""
    reports, rows = {}, []
    for name, layout, tps, why in TORCHTITAN:
        t = None
        if layout is not None:
            if layout["dp"] not in reports:
                reports[layout["dp"]] = simulate(layout)
            t = step_time("Llama-3 8B", **layout, report=reports[layout["dp"]])
        rows.append((name, t, tps, why))
    return rows


if __name__ == "__main__":
    main()
