"""How long a calculator widget takes to redraw when a learner moves one of its controls.

Each calculator's widget is built once, then one control is moved back and forth --updates
times (the same change a learner makes with a dropdown, a number field or a slider); every
update recomputes, redraws the chart on the widget's reused figure at the live resolution and
encodes the PNG, as in JupyterLab (minus sending it to the browser). The baseline is the naive
way, in the same run: the same chart drawn on a new figure and saved at the resolution of
saved charts (``Chart.png()``): "baseline" in the table, and "ratio" is baseline / live.

The target is under 100 ms per update on a 2-core laptop.

Usage:  python bench/calculator_redraw.py [--updates 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("DISTLAB_NO_WARM", "1")  # no rank helper: nothing here launches ranks

from distlab.calculators import widgets  # noqa: E402

#: (calculator, control moved, the values it takes in turn)
MOVES = [
    ("memory", "tp", [1, 2, 4, 8]),
    ("comm", "ranks", [8, 16, 64, 512]),
    ("step_comm", "ranks", [8, 16, 64, 512]),
    ("pipeline", "m", [8, 9, 12, 16]),
    ("stepper", "step", [1, 2, 3, 4, 5, 6]),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=30)
    args = parser.parse_args()

    rows = []
    for name, key, values in MOVES:
        w = getattr(widgets, name)()
        control = w._controls[key]
        control.value = values[1]  # warm up: first use of fonts and caches
        w.timings.clear()
        naive = []
        for i in range(args.updates):
            w._pngs.clear()  # time the drawing, not the stepper's cache of pictures seen
            control.value = values[(i + 2) % len(values)]
            start = time.perf_counter()
            w._chart.__class__.png(_fresh(w._chart))  # the baseline: a new figure, saved DPI
            naive.append(time.perf_counter() - start)
        live = [t * 1e3 for t in w.timings]
        rows.append((name, key, statistics.mean(live), statistics.median(live), max(live),
                     statistics.mean(naive) * 1e3))

    print(f"{'calculator':12} {'control':8} {'mean ms':>8} {'median':>7} {'max ms':>7} "
          f"{'baseline mean':>14} {'ratio':>6}")
    for name, key, mean, median, top, naive in rows:
        print(f"{name:12} {key:8} {mean:8.1f} {median:7.1f} {top:7.1f} {naive:14.1f} "
              f"{naive / mean:5.1f}x")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"(mean and max of {args.updates} updates per calculator; target: under 100 ms; "
          f"load average {load} on {os.cpu_count()} cores)")


def _fresh(chart):
    """A copy of ``chart`` without its cached PNG, so that ``png()`` draws it anew."""
    copy = object.__new__(type(chart))
    copy.__dict__.update({k: v for k, v in vars(chart).items() if k != "_png"})
    return copy


if __name__ == "__main__":
    main()
