"""distlab._torch_simulation: the door to torch's private code that `distlab.scale` stands on."""

from __future__ import annotations

import pytest
from torch.distributed import device_mesh

from distlab import _torch_simulation


def test_a_simulated_rank_creates_only_its_own_groups():
    with _torch_simulation.fake_world(5, 8):
        mesh = device_mesh.init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
        assert mesh["tp"].mesh.tolist() == [4, 5, 6, 7]
        assert mesh["dp"].mesh.tolist() == [1, 5]


def test_own_groups_only_takes_the_argument_torch_2_15_added():
    """torch 2.15 calls DeviceMesh._init_one_process_group with a fifth argument; on 2.14 the
    wrapper took four ("init_one() takes 4 positional arguments but 5 were given")."""
    calls = []
    with _torch_simulation.fake_world(0, 4):
        ours = device_mesh.DeviceMesh.__dict__["_init_one_process_group"].__func__

        def spy(*args, **kwargs):
            calls.append(args)
            return ours(*args, **kwargs)

        device_mesh.DeviceMesh._init_one_process_group = staticmethod(spy)
        try:
            device_mesh.init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "b"))
        finally:
            device_mesh.DeviceMesh._init_one_process_group = staticmethod(ours)
        assert calls
        assert ours(*calls[0], "an argument torch 2.15 added") is not None


def test_own_groups_only_passes_what_it_does_not_handle_to_torch(monkeypatch):
    seen = []

    def torchs(*args, **kwargs):
        seen.append((args, kwargs))
        return "torch's group"

    class Layout:
        def numel(self):
            return 2

    with _torch_simulation.fake_world(0, 4):
        monkeypatch.setattr(device_mesh.DeviceMesh, "_init_one_process_group",
                            staticmethod(torchs))
        with _torch_simulation.own_groups_only():
            layout = Layout()
            got = device_mesh.DeviceMesh._init_one_process_group(
                layout, None, "tp", ("gloo", None), "fifth", sixth=6)
        assert got == "torch's group"
        assert seen == [((layout, None, "tp", ("gloo", None), "fifth"), {"sixth": 6})]
        assert device_mesh.DeviceMesh.__dict__["_init_one_process_group"].__func__ is torchs


def test_a_second_fake_world_in_one_process_is_refused():
    with _torch_simulation.fake_world(0, 2), pytest.raises(RuntimeError, match="already"):
        with _torch_simulation.fake_world(0, 2):
            pass
