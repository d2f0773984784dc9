"""distlab.calculators: the alpha-beta model of collectives and training steps, and the fit that
notebook 08 saves for later notebooks."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import pytest

from distlab.calculators import (
    LINKS,
    CalculatorError,
    CollectiveChart,
    Link,
    StepCommChart,
    collective_time,
    fit_path,
    load_fit,
    save_fit,
    step_comm,
)

pytestmark = pytest.mark.quick

LINK = Link("test link", alpha=1e-5, beta=1e-9)


def _nb08_model_time(version, S, n, alpha, beta):
    """Notebook 08's model_time, copied from the notebook."""
    return {
        "naive": 2 * (n - 1) * (alpha + S * beta),
        "tree": 2 * math.log2(n) * (alpha + S * beta),
        "ring": 2 * (n - 1) * alpha + 2 * (n - 1) / n * S * beta,
    }[version]


@pytest.mark.parametrize("n", [2, 4, 8, 16, 64])
@pytest.mark.parametrize("size", [4, 4096, 10**9 + 7])
def test_all_reduce_equals_notebook_08s_model(n, size):
    for algorithm in ("ring", "tree"):
        t = collective_time("all_reduce", size, n, LINK, algorithm)
        want = _nb08_model_time(algorithm, size, n, LINK.alpha, LINK.beta)
        assert math.isclose(t.seconds, want, rel_tol=1e-12), algorithm


def test_ring_terms_are_exact():
    t = collective_time("all_reduce", 1000, 8, LINK)
    assert (t.messages, t.critical, t.sent) == (14, Fraction(1750), Fraction(1750))
    t = collective_time("all_gather", 1000, 3, LINK)
    assert (t.messages, t.critical) == (2, Fraction(2000, 3))
    assert collective_time("reduce_scatter", 1000, 3, LINK).critical == Fraction(2000, 3)
    assert collective_time("all_to_all", 1000, 4, LINK).critical == 750
    b = collective_time("broadcast", 1000, 8, LINK)
    assert (b.messages, b.critical) == (3 + 7, 1750)  # scatter, then a ring all-gather


def test_tree_terms_are_exact_and_round_up_log2_for_other_rank_counts():
    t = collective_time("all_reduce", 1000, 8, LINK, "tree")
    assert (t.messages, t.critical, t.sent) == (6, 6000, 3000)  # rank 0 sends 3 times
    assert collective_time("all_reduce", 1000, 5, LINK, "tree").messages == 2 * 3
    assert collective_time("broadcast", 1000, 8, LINK, "tree").critical == 3000
    assert collective_time("all_gather", 1000, 8, LINK, "tree").critical == 875
    assert collective_time("all_to_all", 1000, 8, LINK, "tree").critical == 1500  # Bruck


def test_the_tree_wins_on_tiny_messages_and_the_ring_on_large_ones_as_in_notebook_08():
    for n in (4, 8, 16):
        a, b = LINK.alpha, LINK.beta
        cross = a * (n - 1 - math.log2(n)) / (b * (math.log2(n) - (n - 1) / n))  # exercise 3
        below, above = int(cross * 0.9), int(cross * 1.1)
        assert (collective_time("all_reduce", below, n, LINK, "tree").seconds
                < collective_time("all_reduce", below, n, LINK, "ring").seconds)
        assert (collective_time("all_reduce", above, n, LINK, "tree").seconds
                > collective_time("all_reduce", above, n, LINK, "ring").seconds)


def test_bus_bandwidth_is_algbw_times_the_ring_factor():
    t = collective_time("all_reduce", 2**30, 8, "NVLink 4 (H100 SXM)")
    assert math.isclose(t.busbw, t.algbw * 2 * 7 / 8)
    assert math.isclose(collective_time("all_gather", 2**30, 8).busbw,
                        collective_time("all_gather", 2**30, 8).algbw * 7 / 8)
    # at large sizes a ring's busbw approaches the link's bandwidth
    big = collective_time("all_reduce", 2**36, 8, "NVLink 4 (H100 SXM)")
    assert 0.99 * 450e9 < big.busbw < 450e9


def test_text_states_the_formula_and_the_numbers():
    t = collective_time("all_reduce", 2**30, 8, "NVLink 4 (H100 SXM)")
    assert t.text().splitlines()[1] == (
        "  2(N-1) alpha + 2(N-1)/N S beta = 14 x 3.40 µs + 1.88 GB / 450 GB/s = 4.22 ms")
    assert repr(t) == t.text()


def test_presets_state_their_sources_and_bandwidths():
    assert LINKS["NVLink 4 (H100 SXM)"].bandwidth == pytest.approx(450e9)
    assert LINKS["InfiniBand NDR (400 Gb/s)"].bandwidth == pytest.approx(400e9 / 8)
    assert all(link.source and 0 < link.alpha < 1e-3 for link in LINKS.values())


def test_save_fit_keeps_alpha_and_beta_under_distlab_home_for_load_fit(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTLAB_HOME", str(tmp_path))
    assert fit_path() == tmp_path / "alpha_beta.json"
    path = save_fit(162e-6, 1 / 1.33e9, note="gloo, loopback")
    assert path == fit_path() and json.loads(path.read_text())["alpha"] == 162e-6
    link = load_fit()
    assert (link.alpha, link.beta) == (162e-6, 1 / 1.33e9)
    assert link.name == "your fit (2 ranks, gloo, loopback)"
    assert collective_time("all_reduce", 4096, 4, "fit").link == link


def test_fit_goes_to_the_cache_folder_in_home_without_distlab_home(tmp_path, monkeypatch):
    monkeypatch.delenv("DISTLAB_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert fit_path() == tmp_path / ".cache" / "distlab" / "alpha_beta.json"


def test_load_fit_before_any_save_says_how_to_save_one(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTLAB_HOME", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="run notebook 08's fit, then"):
        load_fit()
    (tmp_path / "alpha_beta.json").write_text("{not json")
    with pytest.raises(CalculatorError, match="delete it and save again"):
        load_fit()


@pytest.mark.parametrize(
    "alpha, beta, message",
    [
        (162e-6, 1.33e9, "looks like a bandwidth; beta is seconds per byte"),
        (162, 1e-9, "alpha is in seconds, so 162 microseconds is 162e-6"),
        (-1e-6, 1e-9, "alpha must be a positive number of seconds"),
        (1e-6, float("nan"), "beta must be a positive number of seconds"),
        ("1e-6", 1e-9, "alpha must be a number of seconds, got '1e-6'"),
    ],
)
def test_save_fit_rejects_what_is_not_seconds(tmp_path, alpha, beta, message):
    with pytest.raises(CalculatorError) as info:
        save_fit(alpha, beta, path=tmp_path / "fit.json")
    assert message in str(info.value)
    assert not (tmp_path / "fit.json").exists()


def test_fsdp_sends_one_and_a_half_times_ddps_bytes_per_step():
    # notebook 15: "FSDP moves 1.5x DDP's bytes (all-gather, all-gather, reduce-scatter)"
    ddp = step_comm("DDP", "notebook 15: 4 x Linear(64, 64)", 4, precision="fp32")
    fsdp = step_comm("FSDP", "notebook 15: 4 x Linear(64, 64)", 4, precision="fp32")
    assert ddp.sent == 2 * 3 * 4 * 16_640 // 4 == 99_840
    assert Fraction(fsdp.sent, ddp.sent) == Fraction(3, 2)
    assert fsdp.seconds > ddp.seconds


def test_tensor_and_pipeline_parallel_steps_move_activations():
    tp = step_comm("TP", "Llama-3 8B", 8, seq_len=4096, micro_batch=1, microbatches=2)
    (_, count, t), = tp.calls
    assert count == 4 * 32 * 2 and t.size == 4096 * 4096 * 2 and t.op == "all_reduce"
    pp = step_comm("PP", "Llama-3 8B", 4, seq_len=4096, microbatches=8)
    (_, count, t), = pp.calls
    assert count == 16 and t.sent == 4096 * 4096 * 2
    assert pp.sent == 16 * 4096 * 4096 * 2


def test_charts_are_pngs_that_change_with_the_numbers():
    a = CollectiveChart(collective_time("all_reduce", 2**20, 8)).png()
    b = CollectiveChart(collective_time("all_reduce", 2**20, 64)).png()
    assert a[:4] == b"\x89PNG" and a != b
    steps = [step_comm(layout, "Llama-3 8B", 8) for layout in ("DDP", "FSDP", "TP", "PP")]
    chart = StepCommChart(steps)
    assert chart.png()[:4] == b"\x89PNG" and repr(chart).count("per step and rank") == 4


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: collective_time("all_reduce", 1e9, 8), "size must be a whole number of bytes"),
        (lambda: collective_time("allreduce", 10, 8), "op='allreduce' is not one of"),
        (lambda: collective_time("all_reduce", 10, 0), "ranks must be a whole number >= 1"),
        (lambda: collective_time("all_reduce", 10, 8, "Ethernet"), "no link named 'Ethernet'"),
        (lambda: collective_time("all_reduce", 10, 8, algorithm="star"), "is not one of"),
        (lambda: step_comm("TP", "notebook 15: 4 x Linear(64, 64)", 2),
         "TP traffic depends on a transformer's hidden size"),
        (lambda: step_comm("ZeRO", "Llama-3 8B", 2), "layout='ZeRO' is not one of"),
    ],
)
def test_bad_input_says_what_to_choose(call, message):
    with pytest.raises(CalculatorError) as info:
        call()
    assert message in str(info.value)
