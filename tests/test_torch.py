"""distlab._torch: the one door to torch's private and version-dependent calls.

These tests run on whichever torch the venv holds (`make test`: the locked one; `make
test-torch TORCH_VERSION=2.13.0` and `make test-latest`: the older and newer ones), so each
release the course supports is checked for calls that warn or are gone.
"""

from __future__ import annotations

import datetime
import functools
import sys
import warnings

import cloudpickle
import pytest
import torch.distributed as dist

import distlab
from distlab import _torch

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture
def one_rank_group():
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def test_set_pg_timeout_uses_a_call_that_does_not_warn(one_rank_group):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch 2.14's FutureWarning for _set_pg_timeout fails here
        assert _torch.set_pg_timeout(datetime.timedelta(seconds=7)) is True
    dist.all_reduce(__import__("torch").ones(1))  # the group still works afterwards


def _warns_nothing():
    return dist.get_world_size()


def test_ranks_print_no_warning_of_torch_about_distlab_code(capsys):
    # timeout != start_timeout: the rank meets with the longer one, then sets the learner's,
    # which is where torch 2.14 warned on every rank.
    assert distlab.launch(_warns_nothing, world_size=2, timeout=5) == [2, 2]
    with distlab.Cluster(world_size=2, timeout=5) as cluster:
        assert cluster.run(_warns_nothing) == [2, 2]
    out = capsys.readouterr()
    for category in ("FutureWarning", "DeprecationWarning", "UserWarning"):
        assert category not in out.out + out.err, out.out + out.err


def test_the_locked_torch_is_one_of_those_tried():
    # (that it is the Makefile's pin: tests/test_project_files.py, beside the Makefile's other pins)
    releases = [_torch._numbers(v) for v in _torch.TRIED]
    assert _torch.LOCKED in _torch.TRIED and releases == sorted(releases)


def test_doctor_names_the_torch_the_outputs_were_made_with(monkeypatch):
    import torch

    from distlab import doctor

    monkeypatch.setattr(torch, "__version__", _torch.LOCKED + "+cpu")
    assert doctor.check_torch().ok and "made with" not in doctor.check_torch().text
    other = "2.14.1+cu130" if _torch.LOCKED != "2.14.1" else "2.15.0+cu130"
    monkeypatch.setattr(torch, "__version__", other)
    check = doctor.check_torch()
    assert check.ok and f"made with {_torch.LOCKED}" in check.text and "Which torch" in check.text
    monkeypatch.setattr(torch, "__version__", "2.3.1")
    assert doctor.check_torch().ok is False and "2.4 or newer" in doctor.check_torch().fix


def test_torch_at_least_compares_releases_as_numbers(monkeypatch):
    import torch

    monkeypatch.setattr(torch, "__version__", "2.14.1+cu130")
    assert distlab.torch_at_least("2.14") and distlab.torch_at_least("2.14.1")
    assert distlab.torch_at_least("2.9")  # 14 > 9 as numbers, not as text
    assert not distlab.torch_at_least("2.15") and not distlab.torch_at_least("2.14.2")
    monkeypatch.setattr(torch, "__version__", "2.13.0")
    assert not distlab.torch_at_least("2.14")
    for bad in ("latest", "", None, 2.14):
        with pytest.raises(ValueError, match="dotted numbers"):
            distlab.torch_at_least(bad)


def test_sac_options_choose_the_legacy_cache_without_a_warning():
    import torch
    from torch.utils.checkpoint import (
        CheckpointPolicy,
        checkpoint,
        create_selective_checkpoint_contexts,
    )

    def keep_mm(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op.name() == "aten::mm" else (
            CheckpointPolicy.PREFER_RECOMPUTE)

    w = torch.randn(4, 4, requires_grad=True)
    context = functools.partial(create_selective_checkpoint_contexts, keep_mm)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 2.14's FutureWarning when a hook surrounds SAC
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            out = checkpoint(lambda x: (x @ w).relu() @ w, torch.ones(2, 4), use_reentrant=False,
                             context_fn=context, **_torch.sac_options())
        out.sum().backward()
    assert w.grad is not None
