"""A training layout drawn as nodes: `MeshPicture`, which `distlab.pictures.mesh` builds (that
function checks the input and splits the layers; this module only lays the picture out and
writes its text).

One column per pipeline rank, one row per data-parallel rank (the first few and the last), the
tensor-parallel GPUs of a node as slots inside each box, each pipeline rank's stages as coloured
strips (the interleaved schedule's stage r and r + pp side by side), the FSDP group of pipeline
rank 0 outlined, and which links each kind of parallelism crosses.
"""

from __future__ import annotations

from ._chart import BACKGROUND, COMM, FAINT, INK, OKABE_ITO, Chart, key


class MeshPicture(Chart):
    """A training layout drawn as nodes: one column per pipeline rank, one row per data-parallel
    rank (the first few and the last), the tensor-parallel GPUs of a node inside each box, each
    pipeline rank's stages as coloured strips. Build one with `distlab.pictures.mesh`.

    Shows as a PNG in Jupyter and as text elsewhere (``repr``: one line per pipeline rank with
    its stages and layers, then which links each kind of parallelism crosses).
    """

    def __init__(self, name, *, pp, dp, tp, cp, replicate, virtual_stages, schedule, layers,
                 rows_shown):
        self.name = name
        self.pp, self.dp, self.tp, self.cp = pp, dp, tp, cp
        self.replicate = replicate
        self.virtual_stages = virtual_stages
        self.schedule = schedule
        self.layers = layers  # per stage, stage s at index s: a range of layer indices
        self.rows_shown = min(rows_shown, dp)
        self._png: bytes | None = None

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.tp * self.cp * self.replicate

    def stages(self, rank: int) -> list[int]:
        """The pipeline stages pipeline rank ``rank`` holds: rank, rank + pp, ..."""
        return [rank + k * self.pp for k in range(self.virtual_stages)]

    def _layers_text(self, stage: int) -> str:
        r = self.layers[stage]
        text = "no layer" if not len(r) else (f"layer {r[0]}" if len(r) == 1
                                              else f"layers {r[0]}-{r[-1]}")
        if stage == 0:
            text += " + the embedding"
        if stage == len(self.layers) - 1:
            text += " + the output layer"
        return text

    # --- text -------------------------------------------------------------------------------

    def text(self) -> str:
        """The layout as text: a header, one line per pipeline rank, the links."""
        sizes = [f"pp {self.pp}", f"dp {self.dp}", f"tp {self.tp}"]
        if self.cp > 1:
            sizes.insert(2, f"cp {self.cp}")
        if self.replicate > 1:
            sizes.insert(1, f"replicate {self.replicate}")
        per = (f"{self.schedule}, {self.virtual_stages} stages per pipeline rank"
               if self.virtual_stages > 1 else f"{self.schedule}, 1 stage per pipeline rank")
        lines = [f"{self.name} on {self.world_size:,} GPUs: {' x '.join(sizes)}; {per}"]
        width = len(str(self.pp - 1))
        shown = range(self.pp) if self.pp <= 16 else [0, 1, None, self.pp - 2, self.pp - 1]
        for rank in shown:
            if rank is None:
                lines.append("...")
                continue
            stages = self.stages(rank)
            lines.append(f"pipeline rank {rank:>{width}}: stage{'s' if len(stages) > 1 else ''} "
                         + ", ".join(f"{s} ({self._layers_text(s)})" for s in stages))
        node = f"tp {self.tp}" + (f" x cp {self.cp}" if self.cp > 1 else "")
        lines.append(f"inside a node ({self.tp * self.cp} GPUs): {node}, on NVLink; across "
                     f"nodes, on the network: pp (activations and their gradients, to the next "
                     f"and previous pipeline rank) and dp (FSDP's all-gathers and "
                     f"reduce-scatters among the {self.dp} copies of a pipeline rank)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.text()

    __str__ = __repr__

    # --- drawing ----------------------------------------------------------------------------

    def figure(self):
        """A new matplotlib ``Figure`` of the layout (not shown by pyplot; save or display it)."""
        from matplotlib.collections import PatchCollection
        from matplotlib.figure import Figure
        from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

        pp, v, tp = self.pp, self.virtual_stages, self.tp
        cols = min(pp, 16)  # pipeline ranks drawn; more are elided at the right
        w, gap, row = 1.0, 0.45, 1.5
        rows = list(range(self.rows_shown - 1)) + [self.dp - 1]
        left, right = 1.9, 3.1
        width = left + cols * (w + gap) + right
        top, bottom = 2.0, 1.2
        height = top + len(rows) * row + bottom
        fig = Figure(figsize=(width * 0.62, height * 0.62), facecolor=BACKGROUND)
        ax = fig.add_axes((0, 0, 1, 1))
        ax.set_xlim(0, width)
        ax.set_ylim(-height + top, top)
        ax.set_axis_off()
        ax.set_facecolor(BACKGROUND)
        strips = [OKABE_ITO[1], OKABE_ITO[2], OKABE_ITO[6], OKABE_ITO[3]]  # a rank's 1st, 2nd..
        ax.text(0.15, top - 0.5, self.text().splitlines()[0], fontsize=11, fontweight="bold",
                color=INK, va="center")

        def x_of(col):
            return left + col * (w + gap)

        def y_of(i):  # the top of row i
            return -i * row

        fills, colours, slots, nodes = [], [], [], []  # drawn as three collections: fast
        for i, dp_rank in enumerate(rows):
            y = y_of(i)
            ax.text(left - 0.15, y - 0.5, f"dp {dp_rank}", ha="right", va="center", fontsize=8,
                    color=INK)
            if i == len(rows) - 1 and dp_rank != i:
                ax.text(left - 0.15, y + 0.27, "...", ha="right", va="center", fontsize=9,
                        color=FAINT)
            for col in range(cols):
                rank = col if col < cols - 1 or pp == cols else pp - 1
                x = x_of(col)
                for k in range(v):
                    fills.append(Rectangle((x + k * w / v, y - 1), w / v, 1.0))
                    colours.append(strips[k % len(strips)] + ("D9" if rank in (0, pp - 1)
                                                              else "8C"))  # alpha .85, .55
                slots.extend(Rectangle((x + 0.04, y - 1 + 0.04 + g * 0.92 / tp), w - 0.08,
                                       0.92 / tp * 0.8) for g in range(tp))  # the node's GPUs
                nodes.append(Rectangle((x, y - 1), w, 1.0))
                if i == 0:
                    ax.text(x + w / 2, y + 0.12, str(rank), ha="center", va="bottom",
                            fontsize=7, color=INK)
                    for k, stage in enumerate(self.stages(rank)):
                        ax.text(x + (k + 0.5) * w / v, y - 0.5, str(stage), ha="center",
                                va="center", fontsize=6.5 if v <= 2 else 5, color=INK,
                                fontweight="bold")
        ax.add_collection(PatchCollection(fills, facecolors=colours, edgecolors="none"))
        ax.add_collection(PatchCollection(slots, facecolors="none", edgecolors=INK,
                                          linewidths=0.35))
        ax.add_collection(PatchCollection(nodes, facecolors="none", edgecolors=INK,
                                          linewidths=0.8))
        ax.text(left - 0.15, y_of(0) + 0.2, "pipeline rank", ha="right", va="bottom",
                fontsize=7, color=INK)
        if pp > cols:
            ax.text(x_of(cols - 1) - gap / 2, y_of(0) - 0.5, "...", ha="center", va="center",
                    fontsize=9, color=FAINT)
        # The FSDP group of pipeline rank 0: its column, every dp rank.
        y_low = y_of(len(rows) - 1) - 1
        ax.add_patch(FancyBboxPatch((x_of(0) - 0.12, y_low - 0.12), w + 0.24,
                                    y_of(0) - y_low + 0.24, fill=False, edgecolor=COMM,
                                    linestyle="--", linewidth=1.1,
                                    boxstyle="round,pad=0.02,rounding_size=0.1"))
        ax.text(x_of(0) - 0.1, y_low - 0.3,
                f"FSDP group (dp {self.dp}) of pipeline rank 0: its {self.dp} copies shard "
                f"stages {', '.join(map(str, self.stages(0)))}; all-gather and reduce-scatter "
                "across nodes, on the network", fontsize=7.5, color=INK, va="top")
        # The links: pp between neighbouring nodes of a row, tp inside a node.
        if cols > 1:
            y = y_of(len(rows) - 1) - 0.5
            ax.add_patch(FancyArrowPatch((x_of(0) + w, y), (x_of(1), y), arrowstyle="-|>",
                                         mutation_scale=8, color=COMM, lw=1.2))
        xr = x_of(cols - 1) + w + 0.2
        ax.text(xr, y_of(0) - 0.5, f"a node: {tp * self.cp} GPUs (the slots)\n(tp {tp}"
                + (f" x cp {self.cp}" if self.cp > 1 else "") + "), NVLink", fontsize=7.5,
                color=INK, va="center")
        ax.text(xr, y_of(len(rows) - 1) - 0.5, "pp: activations to the\nnext node (arrow),\n"
                "on the network", fontsize=7.5, color=INK, va="center")
        entries = [(f"stage r + {k * pp}" if k else "stage r (pipeline rank r's first)",
                    strips[k % len(strips)]) for k in range(v)]
        key(fig, entries, above=False, ncol=max(v, 2), fontsize=7.5,
            bbox_to_anchor=(0.5, 0.0))
        return fig

