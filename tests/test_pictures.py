"""distlab.pictures: the text form, the PNG, the colours, and clear errors for bad input."""

from __future__ import annotations

import pytest
import torch

from distlab import _chart, pictures

pytestmark = pytest.mark.quick



def _assert_texts_inside(fig, *, vertically=True):
    """Every text of the figure's first axes drawn inside the figure (across; and up and down
    unless ``vertically`` is False)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    for text in fig.axes[0].texts:
        box = text.get_window_extent(renderer)
        assert box.x0 >= 0 and box.x1 <= fig.bbox.x1, text.get_text()
        if vertically:
            assert box.y0 >= 0 and box.y1 <= fig.bbox.y1, text.get_text()

def _broadcast_picture():
    return pictures.collective(
        "broadcast",
        before=[torch.tensor([1.0, 2.0]), torch.tensor([0.0, 0.0])],
        after=[torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0])],
        title="src=0",
        arrows=[(0, 1)],
    )


def test_text_shows_one_line_per_rank_before_and_after():
    assert repr(_broadcast_picture()) == (
        "broadcast: src=0\n"
        "rank 0: [1.0, 2.0]  ->  [1.0, 2.0]\n"
        "rank 1: [0.0, 0.0]  ->  [1.0, 2.0]\n"
        "moves: rank 0 -> rank 1"
    )
    assert str(_broadcast_picture()) == repr(_broadcast_picture())


def test_text_shows_lists_of_tensors_missing_tensors_and_integers():
    pic = pictures.collective(
        "gather",
        before=[torch.tensor([0, 0]), 1],
        after=[[torch.tensor([0, 0]), [1]], None],
    )
    assert pic.text() == "gather\nrank 0: [0, 0]  ->  [[0, 0], [1]]\nrank 1: [1]     ->  -"


def test_long_tensors_are_cut_to_max_cells_in_text_and_cells():
    pic = pictures.collective("long", before=[list(range(10))], after=[[]], max_cells=4)
    assert pic.text() == "long\nrank 0: [0, 1, 2, ... (+7)]  ->  []"
    assert [c.value for c in pic.cells()] == [0, 1, 2]


def test_floats_are_printed_rounded_and_with_a_decimal_point():
    pic = pictures.collective("x", before=[[1 / 3, 2.0, 1e7, True]], after=[[float("nan")]])
    assert pic.text() == "x\nrank 0: [0.3333, 2.0, 1e+07, True]  ->  [nan]"


def test_renders_to_png_bytes_the_same_each_time():
    pic = _broadcast_picture()
    data = pic.png()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert _broadcast_picture().png() == data  # deterministic: no version, no date inside
    png, meta = pic._repr_png_()
    assert png == data and meta["width"] > 0


def test_figure_is_a_matplotlib_figure_not_shown_by_pyplot():
    from matplotlib.figure import Figure

    fig = _broadcast_picture().figure()
    assert isinstance(fig, Figure)
    texts = {t.get_text() for t in fig.axes[0].texts}
    assert {"rank 0", "rank 1", "1.0", "2.0", "before", "after"} <= texts


def test_equal_values_have_equal_colours_before_and_after():
    pic = _broadcast_picture()
    by_value: dict[float, set[str]] = {}
    for cell in pic.cells():
        by_value.setdefault(float(cell.value), set()).add(cell.colour)
    assert all(len(colours) == 1 for colours in by_value.values()), by_value
    assert len({next(iter(c)) for c in by_value.values()}) == len(by_value)  # distinct values
    assert pic.colour(1) == pic.colour(1.0) == pic.colour(torch.tensor(1.0).item())


def test_many_distinct_values_still_get_distinct_colours():
    pic = pictures.collective("ramp", before=[list(range(12))], after=[list(range(12))])
    assert len({pic.colour(v) for v in range(12)}) == 12


def test_cell_text_contrasts_with_its_fill():
    pic = pictures.collective("ramp", before=[list(range(12))], after=[list(range(12))])
    for cell in pic.cells():
        fill = _chart.luminance(cell.colour)
        ink = _chart.luminance(cell.text_colour)
        lighter, darker = max(fill, ink), min(fill, ink)
        assert (lighter + 0.05) / (darker + 0.05) >= 4.5, cell  # WCAG AA for normal text


def test_before_and_after_with_different_rank_counts_is_a_value_error():
    with pytest.raises(ValueError, match="before has 2 ranks but after has 3"):
        pictures.collective("x", before=[[1], [2]], after=[[1], [2], [3]])


def test_a_rank_that_mixes_numbers_and_lists_is_a_value_error():
    with pytest.raises(ValueError, match=r"before\[1\] mixes numbers and tensors"):
        pictures.collective("x", before=[[1, 2], [3, [4]]], after=[[1], [2]])


def test_lists_nested_too_deeply_are_a_value_error():
    with pytest.raises(ValueError, match=r"after\[0\] nests lists too deeply"):
        pictures.collective("x", before=[[1]], after=[[[1], [[2]]]])


def test_a_2d_tensor_is_a_value_error_that_says_flatten():
    with pytest.raises(ValueError, match=r"2 dimensions .*t\.flatten\(\)"):
        pictures.collective("x", before=[torch.zeros(2, 2)], after=[torch.zeros(4)])


def test_not_a_list_of_ranks_is_a_type_error():
    with pytest.raises(TypeError, match="one entry per rank"):
        pictures.collective("x", before=torch.zeros(2), after=[torch.zeros(2)])


def test_non_numbers_and_bad_arrows_are_value_errors():
    with pytest.raises(ValueError, match="not a real number"):
        pictures.collective("x", before=[["a"]], after=[[1]])
    with pytest.raises(ValueError, match=r"names a rank outside 0\.\.1"):
        pictures.collective("x", before=[[1], [2]], after=[[1], [2]], arrows=[(0, 2)])
    with pytest.raises(ValueError, match=r"\(src, dst\) rank pairs"):
        pictures.collective("x", before=[[1], [2]], after=[[1], [2]], arrows=[0])


def test_long_titles_and_labels_fit_inside_the_figure():
    pic = pictures.collective(
        "pg.broadcast",
        before=[[[0.0], [1.0]], [[2.0], [3.0]]],
        after=[[[3.0], [3.0]], [[3.0], [3.0]]],
        title="rootRank=1, rootTensor=1, and a long explanation",
        labels=("before: a long label", "after: an even longer label here"),
    )
    _assert_texts_inside(pic.figure(), vertically=False)


def test_arrows_sharing_a_rank_fan_out_over_its_cell():
    # Three arrows into rank 3 (a gather): ordered by source, top to bottom, inside the cell.
    assert pictures._spread([3, 3, 3], [0, 1, 2]) == [0.3, 0.0, -0.3]
    # One arrow per end: each meets the middle of its cell.
    assert pictures._spread([0, 1], [2, 2]) == [0.0, 0.0]


# -- mesh: a whole training layout -------------------------------------------------------------


def _layout(**knobs):
    from distlab import scale

    return scale.Layout(**knobs)


PAPER_405B = dict(dp=128, tp=8, pp=16, microbatches=16, schedule="Interleaved1F1B",
                  virtual_stages=2)


def test_mesh_gives_each_pipeline_rank_its_interleaved_stages_and_their_layers():
    lines = pictures.mesh(_layout(**PAPER_405B), "Llama-3 405B").text().splitlines()
    assert lines[0] == ("Llama-3 405B on 16,384 GPUs: pp 16 x dp 128 x tp 8; Interleaved1F1B, "
                        "2 stages per pipeline rank")
    # rank r holds stages r and r + 16 (not 2r and 2r + 1); the first and last stage a layer
    # lighter, with the embedding and the output layer
    assert lines[1] == "pipeline rank  0: stages 0 (layers 0-2 + the embedding), 16 (layers 63-66)"
    assert lines[2] == "pipeline rank  1: stages 1 (layers 3-6), 17 (layers 67-70)"
    assert lines[16] == ("pipeline rank 15: stages 15 (layers 59-62), 31 (layers 123-125 + the "
                         "output layer)")
    assert len(lines) == 18
    assert lines[-1].startswith("inside a node (8 GPUs): tp 8, on NVLink; across nodes, on the "
                                "network: pp") and "among the 128 copies" in lines[-1]


def test_mesh_without_interleaving_holds_every_layer_once_in_order():
    pic = pictures.mesh(_layout(dp=4, tp=2, pp=4, cp=2), "Llama-3 8B")
    lines = pic.text().splitlines()
    assert lines[0] == ("Llama-3 8B on 64 GPUs: pp 4 x dp 4 x cp 2 x tp 2; 1F1B, 1 stage per "
                        "pipeline rank")
    assert lines[1] == "pipeline rank 0: stage 0 (layers 0-7 + the embedding)"
    assert lines[4] == "pipeline rank 3: stage 3 (layers 24-31 + the output layer)"
    assert lines[-1].startswith("inside a node (4 GPUs): tp 2 x cp 2, on NVLink")
    held = [layer for rank in range(4) for s in pic.stages(rank) for layer in pic.layers[s]]
    assert held == list(range(32))


def test_mesh_of_many_pipeline_ranks_shows_the_ends_and_draws_inside_its_figure():
    pic = pictures.mesh(_layout(dp=2, tp=8, pp=32, schedule="Interleaved1F1B", virtual_stages=2),
                        "Llama-3 405B", rows_shown=2)
    lines = pic.text().splitlines()
    assert [line.split(":")[0] for line in lines[1:6]] == [
        "pipeline rank  0", "pipeline rank  1", "...", "pipeline rank 30", "pipeline rank 31"]
    for layout, rows in ((_layout(**PAPER_405B), 3), (_layout(dp=2, tp=8, pp=32), 2)):
        _assert_texts_inside(pictures.mesh(layout, "Llama-3 405B", rows_shown=rows).figure())
    assert pic.png()[:8] == b"\x89PNG\r\n\x1a\n" and pic._repr_png_()[1]["width"] > 0


def test_mesh_refuses_what_it_cannot_draw_and_says_what_to_pass():
    from distlab.calculators import CalculatorError

    with pytest.raises(TypeError, match=r"layout must be a distlab.scale.Layout, got dict"):
        pictures.mesh(dict(dp=8), "Llama-3 8B")
    with pytest.raises(TypeError, match="rows_shown"):
        pictures.mesh(_layout(dp=8), "Llama-3 8B", rows_shown=1)
    with pytest.raises(ValueError, match="needs its layers"):
        pictures.mesh(_layout(dp=8), 10**9)
    with pytest.raises(CalculatorError, match="choose pp in"):  # 32 layers on 64 stages
        pictures.mesh(_layout(pp=16, schedule="Interleaved1F1B", virtual_stages=4), "Llama-3 8B")


def test_launch_path_draws_the_kernel_the_helper_and_each_rank():
    picture = pictures.launch_path(world_size=3)
    assert "rank 0, rank 1, rank 2" in repr(picture)
    assert picture.png().startswith(b"\x89PNG")
    labels = [t.get_text() for t in picture.figure().axes[0].texts]
    assert [t for t in labels if t.startswith("rank ")] == [f"rank {r}\nRANK={r}" for r in range(3)]


@pytest.mark.parametrize("world_size, error", [(0, ValueError), (5, ValueError), (2.0, TypeError)])
def test_launch_path_refuses_a_world_size_it_cannot_draw(world_size, error):
    with pytest.raises(error, match="world_size must be an int, 1 to 4"):
        pictures.launch_path(world_size)


# --- rank_grid (notebook 26) ------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 2, 2), (3, 2, 1), (1, 4, 2), (4, 1, 4), (2, 3, 2)])
def test_rank_grid_numbers_the_ranks_and_groups_them_as_init_device_mesh_does(shape):
    from distlab.exercises import nb26

    grid = pictures.rank_grid(*shape)
    want = nb26.expected_groups(*shape)  # from init_device_mesh's own layout, a torch tensor
    for axis in ("pp", "dp", "tp"):
        assert grid.groups(axis) == want[axis], axis
        assert f"{axis} groups: " + " ".join(str(g) for g in want[axis]) in repr(grid)
    for rank in range(grid.world_size):
        assert grid.coordinates(rank) == nb26.coordinates(rank, *shape)


def test_rank_grid_names_each_stage_with_its_ranks_and_draws_the_same_png_twice():
    grid = pictures.rank_grid(stages=["stage 0: tok, pos, block 0", "stage 1: block 1, norm"])
    text = repr(grid).splitlines()
    assert text[0] == ('8 ranks as ("pp", "dp", "tp") = (2, 2, 2): '
                       'rank = (pp_i * 2 + dp_i) * 2 + tp_i')
    assert text[1:3] == ["stage 0: tok, pos, block 0: ranks 0-3",
                         "stage 1: block 1, norm: ranks 4-7"]
    png = grid.png()
    assert png.startswith(b"\x89PNG") and pictures.rank_grid(
        stages=["stage 0: tok, pos, block 0", "stage 1: block 1, norm"]).png() == png


@pytest.mark.parametrize("call, error, says", [
    (lambda: pictures.rank_grid(5, 1, 1), ValueError, "pp"),
    (lambda: pictures.rank_grid(2, 4, 4), ValueError, "more than the 8 a row can show"),
    (lambda: pictures.rank_grid(2, 2.0, 2), TypeError, "dp"),
    (lambda: pictures.rank_grid(2, stages=["only one"]), ValueError, "one per stage"),
    (lambda: pictures.rank_grid(2, stages="ab"), TypeError, "list of 2 strings"),
])
def test_rank_grid_refuses_what_it_cannot_draw_and_says_why(call, error, says):
    with pytest.raises(error, match=says):
        call()
