"""How `distlab.launch` starts ranks, drawn: `LaunchPath`, which `distlab.pictures.launch_path`
builds (that function checks the input; this module only lays the picture out and writes its
text). Notebook 00's first picture.
"""

from __future__ import annotations

import itertools

from ._chart import BACKGROUND, FAINT, INK, OKABE_ITO, Chart


class LaunchPath(Chart):
    """Who starts whom and who talks to whom when `distlab.launch` runs: the notebook's kernel,
    distlab's helper process (the "zygote"), and the ranks it forks. Build one with
    `launch_path`. Shows as a PNG in Jupyter and as text elsewhere (``repr``)."""

    def __init__(self, world_size: int):
        self.world_size = world_size

    def __repr__(self) -> str:
        ranks = ", ".join(f"rank {r}" for r in range(self.world_size))
        return (f"distlab.launch: kernel -> helper (zygote) -> fork() -> {ranks}; each rank: "
                "task/result socket and output pipe to the kernel; ranks: gloo over 127.0.0.1")

    def figure(self):
        from matplotlib.figure import Figure
        from matplotlib.patches import FancyBboxPatch

        fig = Figure(figsize=(7.5, 3.6), facecolor=BACKGROUND)
        ax = fig.subplots()
        ax.set_xlim(0, 10)
        ax.set_ylim(0, 4.8)
        ax.axis("off")
        fork, task, out, gloo = OKABE_ITO[5], OKABE_ITO[4], OKABE_ITO[6], OKABE_ITO[2]

        def box(x, y, w, h, text):
            ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.08", fc="white",
                                        ec=INK))
            ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=9, color=INK)

        def arrow(start, end, label, colour, style="-|>", at=0.5, ls="-"):
            ax.annotate("", xy=end, xytext=start,
                        arrowprops=dict(arrowstyle=style, color=colour, lw=1.4, ls=ls))
            x, y = start[0] + at * (end[0] - start[0]), start[1] + at * (end[1] - start[1])
            ax.text(x, y, label, ha="center", va="center", fontsize=7.5, color=colour,
                    bbox=dict(fc=BACKGROUND, ec="none", pad=0.5))

        box(0.3, 3.5, 2.6, 1.0, "notebook kernel\n(your cells)")
        box(6.6, 3.5, 3.0, 1.0, "helper (zygote)\ntorch imported, 1 thread")
        arrow((2.95, 4.0), (6.55, 4.0), "fork request + the rank's pipe ends\n(Unix socket)", fork)
        width = 2.2 if self.world_size <= 2 else 1.8
        step = 4.6 if self.world_size <= 2 else (9.6 - 1.0 - width) / (self.world_size - 1)
        xs = [1.0 + i * step for i in range(self.world_size)]
        few = self.world_size <= 2  # room for a label on every arrow
        for r, x in enumerate(xs):
            box(x, 0.75, width, 0.9, f"rank {r}\nRANK={r}")
            arrow((8.1, 3.45), (x + width / 2, 1.7), "fork()" if few or r == 0 else "", fork,
                  ls="--", at=0.2)
        arrow((1.2, 3.45), (xs[0] + 0.4, 1.7), "task ↓ / result ↑\n(socket)", task, "<|-|>")
        arrow((xs[0] + width - 0.3, 1.7), (2.5, 3.45), "stdout+stderr\n(pipe)", out)
        for left, right in itertools.pairwise(xs):
            arrow((left + width + 0.05, 1.2), (right - 0.05, 1.2),
                  "gloo (TCP, 127.0.0.1)" if few else "", gloo, "<|-|>")
        if not few:
            ax.text(5.0, 0.5, "ranks ↔ ranks: gloo (TCP, 127.0.0.1)", ha="center", fontsize=7.5,
                    color=gloo)
        ax.text(5.0, 0.2, "every rank has its own task socket and output pipe to the kernel",
                ha="center", fontsize=7.5, color=FAINT)
        ax.set_title("distlab.launch: kernel → helper → ranks", fontsize=10, color=INK)
        return fig
