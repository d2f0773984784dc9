"""distlab._output: per-rank blocks, and what is dropped from them."""

from __future__ import annotations

from distlab import _output


def test_output_lines_are_prefixed_and_grouped_in_rank_order():
    assert _output.prefix(3, "a\n\nb") == "[rank 3] a\n[rank 3]\n[rank 3] b\n"
    text = _output.render({1: "one\n", 0: "zero\n", 2: ""})
    assert text == "[rank 0] zero\n[rank 1] one\n"


def test_faulthandlers_list_of_extension_modules_is_dropped_and_nothing_else():
    crash = (
        "Fatal Python error: Segmentation fault\n\n"
        'Current thread 0x00007f (most recent call first):\n  File "<cell>", line 3 in work\n\n'
        "Extension modules: numpy._core._multiarray_umath, torch._C (total: 2)\n"
        "after\n"
    )
    tidy = _output.tidy(crash)
    assert "Extension modules" not in tidy
    assert tidy == crash.replace(
        "Extension modules: numpy._core._multiarray_umath, torch._C (total: 2)\n", ""
    )
    assert _output.tidy("no crash here\n") == "no crash here\n"
    # streamed lines go through prefix() alone, and lose the line too
    assert "Extension modules" not in _output.prefix(1, crash)
