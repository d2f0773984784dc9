"""A small device mesh drawn rank by rank: `rank_grid` (public as `distlab.pictures.rank_grid`:
it checks the input) builds a `RankGrid`, which lays the picture out and writes its text.

The ranks of a ``("pp", "dp", "tp")`` mesh numbered as ``init_device_mesh`` numbers them,
row-major with ``tp`` innermost: one row per pipeline stage, a tensor-parallel group and a
data-parallel group outlined, each rank's pipeline neighbour straight below it. Notebook 26's
first picture.
"""

from __future__ import annotations

from ._chart import BACKGROUND, INK, OKABE_ITO, Chart
from ._config import check_int
from .errors import InputError, InputTypeError

AXES = ("pp", "dp", "tp")


class RankGrid(Chart):
    """The ranks of a ``("pp", "dp", "tp")`` device mesh, each with its coordinates, and the
    process groups along each axis. Build one with `distlab.pictures.rank_grid`. Shows as a PNG
    in Jupyter and as text elsewhere (``repr``: the numbering, each stage's ranks, the groups)."""

    def __init__(self, pp: int, dp: int, tp: int, stages: tuple[str, ...]):
        self.pp, self.dp, self.tp = pp, dp, tp
        self.stages = stages

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.tp

    def coordinates(self, rank: int) -> tuple[int, int, int]:
        """``(pp, dp, tp)`` coordinates of ``rank``: row-major, ``tp`` innermost, as the
        simulator numbers every mesh (`distlab.scale.mesh.coords_of`)."""
        from .scale.mesh import coords_of

        where = coords_of(rank, {"pp": self.pp, "dp": self.dp, "tp": self.tp})
        return where["pp"], where["dp"], where["tp"]

    def groups(self, axis: str) -> list[list[int]]:
        """The process groups along ``axis`` ("pp", "dp" or "tp"): the ranks whose other two
        coordinates agree, in rank order, the groups ordered by those coordinates."""
        i = AXES.index(axis)
        by_rest: dict[tuple, list[int]] = {}
        for r in range(self.world_size):
            c = self.coordinates(r)
            by_rest.setdefault(c[:i] + c[i + 1:], []).append(r)
        return [by_rest[key] for key in sorted(by_rest)]

    def text(self) -> str:
        per = self.dp * self.tp
        lines = [f'{self.world_size} ranks as ("pp", "dp", "tp") = ({self.pp}, {self.dp}, '
                 f"{self.tp}): rank = (pp_i * {self.dp} + dp_i) * {self.tp} + tp_i"]
        for p, label in enumerate(self.stages):
            lines.append(f"{label}: ranks {p * per}-{(p + 1) * per - 1}")
        for axis in ("tp", "dp", "pp"):
            lines.append(f"{axis} groups: " + " ".join(str(g) for g in self.groups(axis)))
        return "\n".join(lines)

    __repr__ = __str__ = text

    def figure(self):
        from matplotlib.figure import Figure
        from matplotlib.patches import FancyArrowPatch, Rectangle

        pp, dp, tp = self.pp, self.dp, self.tp
        w, h, row = 1.35, 0.8, 2.1  # a rank's box; stage 0 on top
        width = dp * (tp * 1.5 + 0.5) - 0.65
        top = (pp - 1) * row + h + 0.95
        fig = Figure(figsize=(7.6 * (width + 2.9) / 9.25, 0.9 + 1.4 * pp), facecolor=BACKGROUND)
        ax = fig.add_axes([0.01, 0.01, 0.98, 1 - 0.45 / (0.9 + 1.4 * pp)])
        ax.set_axis_off()
        tp_colour, dp_colour = OKABE_ITO[1], OKABE_ITO[2]

        def box(rank):  # lower-left corner: tp groups side by side, the dp groups a gap apart
            p, d, t = self.coordinates(rank)
            return d * (tp * 1.5 + 0.5) + t * 1.5, (pp - 1 - p) * row

        for p, label in enumerate(self.stages):
            y = (pp - 1 - p) * row
            ax.add_patch(Rectangle((-0.15, y - 0.15), width + 0.3, h + 0.3,
                                   facecolor=OKABE_ITO[p % len(OKABE_ITO)], alpha=0.15,
                                   edgecolor=INK, linewidth=0.6))
            ax.text(width + 0.3, y + h / 2, label, va="center", color=INK, fontsize=8)
        for rank in range(self.world_size):
            x, y = box(rank)
            _, d, t = self.coordinates(rank)
            ax.add_patch(Rectangle((x, y), w, h, facecolor="white", edgecolor=INK))
            ax.text(x + w / 2, y + 0.5, f"rank {rank}", ha="center", color=INK, fontsize=8)
            ax.text(x + w / 2, y + 0.17, f"dp {d}, tp {t}", ha="center", color=INK, fontsize=7)
            if rank + dp * tp < self.world_size:  # its pipeline neighbour: straight below
                ax.add_patch(FancyArrowPatch((x + w / 2, y - 0.17), (x + w / 2, y - row + h + 0.17),
                                             arrowstyle="-|>", mutation_scale=10, color=INK,
                                             linewidth=1.0))
        if tp > 1:  # the first tp group of the last stage
            group = self.groups("tp")[(pp - 1) * dp]
            x, y = box(group[0])
            ax.add_patch(Rectangle((x - 0.07, y - 0.07), 1.5 * (tp - 1) + w + 0.14, h + 0.14,
                                   facecolor="none", edgecolor=tp_colour, linewidth=2.0,
                                   linestyle="--"))
            ax.text(x, y - 0.4, f"tp group {group}: Megatron's all-reduces", color=tp_colour,
                    fontsize=8, fontweight="bold")
        if dp > 1:  # the first dp group of the first stage, its ends joined by an arc
            group = self.groups("dp")[0]
            (x0, y0), (x1, _) = box(group[0]), box(group[-1])
            ax.add_patch(FancyArrowPatch((x0 + w / 2, y0 + h + 0.05), (x1 + w / 2, y0 + h + 0.05),
                                         arrowstyle="<|-|>", mutation_scale=9, color=dp_colour,
                                         linewidth=2.0, connectionstyle="arc3,rad=-0.25"))
            ax.text(x0 + w / 2, y0 + h + 0.62, f"dp group {group}: FSDP's all-gathers and "
                    "reduce-scatters", color=dp_colour, fontsize=8, fontweight="bold")
        if pp > 1:
            ax.text(width + 0.3, (pp - 2) * row + (row + h) / 2,
                    "pp: activations go down to\nthe rank with the same dp\nand tp; gradients "
                    "come back", va="center", color=INK, fontsize=7.5)
        ax.set_xlim(-0.3, width + 2.6)
        ax.set_ylim(-0.55, top)
        fig.suptitle(self.text().splitlines()[0], color=INK, fontsize=9)
        return fig


def rank_grid(pp: int = 2, dp: int = 2, tp: int = 2, *, stages=None) -> RankGrid:
    """Draw the ranks of a small ``("pp", "dp", "tp")`` mesh as ``init_device_mesh`` numbers
    them (row-major, ``tp`` innermost): a row per pipeline stage, a tp and a dp group outlined,
    each rank's pipeline neighbour below it (notebook 26).

    Args:
        pp, dp, tp: the mesh's sizes, each 1 to 4, with ``dp * tp`` at most 8 (a row's boxes).
        stages: one label per pipeline stage (default "stage 0", "stage 1", ...).

    Returns:
        A `RankGrid`: an image in Jupyter; ``print`` gives the numbering and every group, and
        ``.groups(axis)`` the groups along "pp", "dp" or "tp".

    Raises:
        TypeError: a size is not an int, or ``stages`` is not a sequence of strings.
        ValueError: a size out of range, or ``len(stages) != pp``.
    """
    for name, size in (("pp", pp), ("dp", dp), ("tp", tp)):
        check_int(size, name, low=1, high=4, error=InputError, type_error=InputTypeError)
    if dp * tp > 8:
        raise InputError(f"dp * tp = {dp * tp} ranks a row is more than the 8 a row can show: "
                         "draw a smaller mesh (its numbering is the same at any size)")
    labels = tuple(f"stage {p}" for p in range(pp)) if stages is None else stages
    if isinstance(labels, str) or not all(isinstance(x, str) for x in labels):
        raise InputTypeError(f"stages must be a list of {pp} strings, one per pipeline stage, "
                             f"got {stages!r}")
    if len(labels) != pp:
        raise InputError(f"stages has {len(labels)} labels for pp={pp} pipeline stages: give "
                         "one per stage")
    return RankGrid(pp, dp, tp, tuple(labels))
