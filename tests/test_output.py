"""distlab._output: per-rank blocks, and what is dropped from them."""

from __future__ import annotations

import pytest

from distlab import _output

pytestmark = pytest.mark.quick


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


def test_ranks_are_tagged_as_runs_and_lists():
    assert _output.tag([2]) == "[rank 2]"
    assert _output.tag([3, 1, 0, 2]) == "[ranks 0-3]"
    assert _output.tag([0, 2]) == "[ranks 0,2]"
    assert _output.tag([0, 1]) == "[ranks 0,1]"
    assert _output.tag([0, 1, 2, 5, 7, 8, 9]) == "[ranks 0-2,5,7-9]"


def test_fold_shows_shared_leading_lines_once_then_what_differs():
    outputs = {r: f"UserWarning: same\nvalue {r % 2}\n" for r in range(4)}
    assert _output.render(outputs, fold=True) == (
        "[ranks 0-3] UserWarning: same\n[ranks 0,2] value 0\n[ranks 1,3] value 1\n"
    )
    # without fold: every rank's whole block, as before
    assert _output.render(outputs).count("UserWarning") == 4


def test_fold_groups_the_first_and_last_rank_around_a_middle_one_that_differs():
    out = _output.render({0: "a\nsame\n", 1: "a\nother\n", 2: "a\nsame\n"}, fold=True)
    assert out == "[ranks 0-2] a\n[ranks 0,2] same\n[rank 1] other\n"


def test_fold_keeps_blank_lines_and_ranks_that_printed_nothing():
    outputs = {0: "a\n\nb\n", 1: "a\n\nb\n", 2: "", 3: "a\n\nc\n"}
    assert _output.render(outputs, fold=True) == (
        "[ranks 0,1,3] a\n[ranks 0,1,3]\n[ranks 0,1] b\n[rank 3] c\n"
    )
    # one rank alone is never relabelled
    assert _output.render({1: "x\n", 0: ""}, fold=True) == "[rank 1] x\n"


def test_environment_paths_are_shortened_in_rank_output():
    import sysconfig

    site = sysconfig.get_paths()["purelib"]
    stdlib = sysconfig.get_paths()["stdlib"]
    text = (
        f"{site}/torch/distributed/c10d_logger.py:83: UserWarning: careful\n"
        f'  File "{stdlib}/threading.py", line 320, in wait\n'
        '  File "/home/me/project/train.py", line 3, in main\n'
    )
    assert _output.prefix(0, text) == (
        "[rank 0] <site-packages>/torch/distributed/c10d_logger.py:83: UserWarning: careful\n"
        '[rank 0]   File "<stdlib>/threading.py", line 320, in wait\n'
        '[rank 0]   File "/home/me/project/train.py", line 3, in main\n'
    )


def test_distlabs_own_files_read_the_same_wherever_it_is_installed():
    from pathlib import Path

    import distlab

    here = Path(distlab.__file__).parent / "exercises" / "nb15.py"
    assert _output.prefix(1, f"{here}:30: UserWarning: hooks\n") == (
        "[rank 1] distlab/exercises/nb15.py:30: UserWarning: hooks\n"
    )


def test_torchs_own_rank_prefix_goes_so_the_same_warning_folds():
    outputs = {r: f"[rank{r}]:W1121 c10d warning\nmine {r}\n" for r in range(2)}
    assert _output.render(outputs, fold=True) == (
        "[ranks 0,1] W1121 c10d warning\n[rank 0] mine 0\n[rank 1] mine 1\n"
    )
    # another rank's prefix is not this rank's to drop
    assert _output.prefix(0, "[rank1]:x\n") == "[rank 0] [rank1]:x\n"


def test_cpp_log_lines_lose_their_time_so_the_same_warning_folds():
    outputs = {
        0: "[W1121 14:05:01.123456789 ProcessGroupGloo.cpp:123] Warning: slow\n",
        1: "[W1121 14:05:01.987654321 12345 ProcessGroupGloo.cpp:123] Warning: slow\n",
    }
    assert _output.render(outputs, fold=True) == (
        "[ranks 0,1] [W ProcessGroupGloo.cpp:123] Warning: slow\n"
    )
