"""distlab.calculators.widgets: each calculator's widget redraws its numbers and its picture when
a control moves, shows a bad setting's error in place, and saves a readable default state."""

from __future__ import annotations

import base64
import html

import pytest

from distlab.calculators import (
    CalculatorError,
    Layout,
    memory_per_device,
    pipeline_schedule,
    ring_steps,
    save_fit,
    widgets,
)

pytestmark = pytest.mark.quick

#: (widget, a control, a new value that changes the numbers)
MOVES = [
    ("memory", "tp", 2),
    ("comm", "ranks", 64),
    ("step_comm", "ranks", 64),
    ("pipeline", "m", 12),
    ("stepper", "step", 4),
]


@pytest.mark.parametrize("name, key, value", MOVES)
def test_moving_a_control_redraws_the_numbers_and_the_picture(name, key, value):
    w = getattr(widgets, name)()
    text, png = w.text, bytes(w._image.value)
    assert png[:4] == b"\x89PNG" and text in html.unescape(w._text.value)
    w._controls[key].value = value
    assert w.text != text and bytes(w._image.value) != png
    assert w.text in html.unescape(w._text.value)
    assert len(w.timings) == 2 and all(t > 0 for t in w.timings)


def test_default_text_is_the_pure_functions():
    assert widgets.pipeline().text == pipeline_schedule(4, 8, 1, "1F1B").text()
    est = memory_per_device("Llama-3 8B", Layout(dp=8))  # the one Layout's defaults, on 8 ranks
    assert widgets.memory().text == est.text() + "\nits peak fits in an 80 GB device"
    assert widgets.stepper().text.startswith(ring_steps("all_reduce", 4, 1024).text())


def test_a_setting_that_cannot_work_shows_its_error_and_keeps_the_picture():
    w = widgets.memory()
    png = bytes(w._image.value)
    w._controls["tp"].value = 3
    assert w.text.startswith("✗ tp=3 does not divide the 32 attention heads of Llama-3 8B")
    assert "distlab-calculator-error" in w._text.value and bytes(w._image.value) == png
    w._controls["tp"].value = 4
    assert not w.text.startswith("✗") and bytes(w._image.value) != png


def test_saved_output_has_the_default_table_and_chart_besides_the_widget_view():
    a, b = widgets.pipeline(), widgets.pipeline()
    bundle = a._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "image/png", "application/vnd.jupyter.widget-view+json"}
    assert bundle["text/plain"] == pipeline_schedule().text()
    png = base64.b64decode(bundle["image/png"])
    assert png == pipeline_schedule().chart().png()  # the saved resolution, same bytes each run
    assert b._repr_mimebundle_()["image/png"] == bundle["image/png"]
    a._controls["m"].value = 9  # what was saved stays the default state
    assert a._repr_mimebundle_()["text/plain"] == bundle["text/plain"]


def test_stepper_slider_follows_the_number_of_steps_of_the_collective():
    w = widgets.stepper()
    step = w._controls["step"]
    assert step.max == 6
    step.value = 6
    w._controls["op"].value = "all_gather"
    assert step.max == 3 and "step 3 of 3" in w.text
    w._controls["ranks"].value = 8
    assert step.max == 7


def test_comm_widget_offers_your_saved_fit(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTLAB_HOME", str(tmp_path))
    assert "fit" not in [v for _, v in _options(widgets.comm()._controls["link"])]
    save_fit(162e-6, 1 / 1.33e9)
    w = widgets.comm(link="fit")
    assert "over your fit (2 ranks)" in w.text


def _options(dropdown):
    return [o if isinstance(o, tuple) else (o, o) for o in dropdown.options]


def test_every_control_has_a_label_and_a_class_the_browser_test_finds():
    for name, *_ in MOVES:
        w = getattr(widgets, name)()
        assert f"distlab-calculator-{name}" in w._dom_classes
        for key, control in w._controls.items():
            assert control.description and f"distlab-control-{key}" in control._dom_classes


def test_a_starting_value_that_cannot_work_raises_at_once_with_the_fix():
    with pytest.raises(CalculatorError, match="tp=3 does not divide the 32 attention heads"):
        widgets.memory(tp=3)
    with pytest.raises(CalculatorError, match="1F1B needs at least as many microbatches"):
        widgets.pipeline(m=2)
    with pytest.raises(CalculatorError, match="ranks=1: this widget's control goes from 2 to 8"):
        widgets.stepper(ranks=1)  # ipywidgets alone would quietly make it 2
    with pytest.raises(CalculatorError, match="model='Llama-3 9B' is not offered"):
        widgets.memory(model="Llama-3 9B")


def test_stepper_draws_each_step_once_and_shows_it_again_from_memory():
    w = widgets.stepper()
    first = bytes(w._image.value)
    w._controls["step"].value = 4
    w._controls["numel"].value = 10  # other bytes, the same picture: nothing to draw
    assert "cut into 4 chunks of 12 / 12 / 8 / 8 bytes" in w.text
    assert len(w._pngs) == 2
    w._controls["step"].value = 1
    assert bytes(w._image.value) == first and len(w._pngs) == 2
