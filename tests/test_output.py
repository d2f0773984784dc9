"""distlab._output: per-rank blocks, and what is dropped from them."""

from __future__ import annotations

from distlab import _output


def test_every_line_gets_its_rank_prefix_and_blocks_come_in_rank_order():
    text = _output.render({1: "b\n", 0: "a\n\nc\n", 2: ""})
    assert text == "[rank 0] a\n[rank 0]\n[rank 0] c\n[rank 1] b\n"


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
