"""The memory calculator against PyTorch's own parallel code on simulated ranks.

For each preset x layout, `distlab.scale.lay_out` builds the model with parallelize_module and
fully_shard on a fake process group and runs one step under fake tensors; the calculator
(`distlab.calculators.memory_per_device`) is asked the same question. Prints one table per
layout and the worst difference. tests/test_scale_calculators.py keeps a few of these in step.

    python bench/calculator_vs_simulation.py            # every case below (a minute or two)
"""

from __future__ import annotations

import sys
import time

from distlab import scale

L = scale.Layout
CASES = [
    ("Llama-3 8B", L(dp=8, seq_len=4096)),
    ("Llama-3 8B", L(dp=8, seq_len=4096, attention="written")),
    ("Llama-3 8B", L(dp=8, seq_len=4096, checkpointing="full")),
    ("Llama-3 8B", L(dp=8, seq_len=4096, checkpointing="selective")),
    ("Llama-3 8B", L(dp=8, seq_len=4096, reshard_after_forward=False)),
    ("Llama-3 8B", L(dp=8, seq_len=4096, zero=0, checkpointing="full")),
    ("Llama-3 8B", L(dp=4, tp=2, cp=2, seq_len=8192, checkpointing="full")),
    ("Llama-3 70B", L(dp=8, tp=8, seq_len=8192, checkpointing="full")),
    ("Llama-3 70B", L(dp=4, tp=8, pp=4, seq_len=8192, micro_batch=1, microbatches=8)),
    ("Llama-3 70B", L(replicate=2, dp=4, tp=8, seq_len=8192, checkpointing="selective")),
    ("Llama-3 405B", L(dp=8, tp=8, pp=16, seq_len=8192)),
    ("Llama-3 405B", L(dp=4, tp=8, pp=16, cp=16, seq_len=131072, checkpointing="full")),
    ("Mixtral 8x7B", L(dp=8, ep=8, seq_len=4096, checkpointing="full")),
]


def main() -> int:
    worst = []
    for name, layout in CASES:
        start = time.perf_counter()
        comparison = scale.against_calculator(scale.lay_out(name, layout))
        print(comparison)
        print(f"worst |calculator / simulated - 1| = {comparison.worst():.2%}  "
              f"({time.perf_counter() - start:.1f} s)\n")
        worst.append((comparison.worst(), name, layout.text()))
    top = max(worst)
    print(f"over {len(CASES)} layouts, the worst difference is {top[0]:.2%} ({top[1]}, {top[2]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
