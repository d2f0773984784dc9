"""Links for the alpha-beta model: alpha seconds per message, beta seconds per byte.

    from distlab.calculators import LINKS, save_fit, load_fit
    save_fit(alpha, beta)        # in notebook 08, after fitting them: kept for later notebooks
    load_fit()                   # in any later notebook or session: a `Link` named "your fit"
    LINKS["NVLink 4 (H100 SXM)"] # or a preset

Where the fit is kept: ``$DISTLAB_HOME/alpha_beta.json``, or ``~/.cache/distlab/alpha_beta.json``
when ``DISTLAB_HOME`` is not set. A small JSON file: alpha, beta, the ranks it was fitted on and a
note; delete it to forget the fit.

The presets' ``beta`` is the hardware's peak bandwidth, per direction; their latencies are the
per-step hardware latencies NCCL's own cost model assumes for its default Simple protocol
(``hwLat`` in NVIDIA/nccl's src/graph/tuning.cc: ring, NVLink 3.4 µs, network 9.6 µs; the
low-latency LL protocol, used for small messages, has 0.47 and 2.7 µs). Real collectives reach
less than the peak: each preset also carries ``busbw``, the bus bandwidth NCCL reaches on it as
nccl-tests measures it (its source in ``busbw_source``), and ``link.measured()`` is the same link
with beta = 1 / busbw. Which one a result used is in its link's name ("... NCCL-measured").

Knows nothing about collectives: `comm` uses the links.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from ._text import CalculatorError, Printed, human_bytes, seconds

__all__ = ["LINKS", "Link", "fit_path", "get_link", "load_fit", "save_fit"]


@dataclass(frozen=True, repr=False)
class Link(Printed):
    """A link in the alpha-beta model: a message of S bytes takes ``alpha + S * beta`` seconds.

    Args:
        name: what to call it.
        alpha: seconds per message (latency).
        beta: seconds per byte (1 / bandwidth).
        source: where the numbers come from (not shown in text).
        busbw: the bus bandwidth NCCL measures on this link (nccl-tests' ``busbw``, bytes per
            second), when someone has measured it; None otherwise.
        busbw_source: where ``busbw`` comes from.
    """

    name: str
    alpha: float
    beta: float
    source: str = ""
    busbw: float | None = None
    busbw_source: str = ""

    @property
    def bandwidth(self) -> float:
        """Bytes per second, 1 / beta."""
        return 1 / self.beta

    def measured(self) -> Link:
        """This link at the bandwidth NCCL measures on it (``busbw``), named "... NCCL-measured".
        Raises `CalculatorError` when no measurement is known (give ``busbw=``)."""
        if self.busbw is None:
            raise CalculatorError(
                f"{self.name} has no NCCL-measured bandwidth: build it with busbw= (bytes per "
                "second, from nccl-tests' busbw column), or use its peak"
            )
        return Link(f"{self.name}, NCCL-measured", self.alpha, 1 / self.busbw,
                    self.busbw_source, self.busbw, self.busbw_source)

    def text(self) -> str:
        return (f"{self.name}: alpha = {seconds(self.alpha)} per message, "
                f"1/beta = {human_bytes(self.bandwidth)}/s")


_NCCL = "per-step latency: NCCL's src/graph/tuning.cc, hwLat, ring, Simple protocol"
_NVLINK_BUSBW = (
    "nccl-tests on 8 H100 SXM: 'with the protocol overhead (~20%) NCCL can get an effective "
    "NVLink bandwidth of 370GB/s', seen as busbw of ring collectives (NVIDIA/nccl-tests#212, "
    "S. Jeaugey); 'practical measurements typically show ... around 360 GB/s' "
    "(NVIDIA/nccl-tests#312); 360 GB/s taken (all_reduce with NVLink SHARP reports more busbw "
    "than goes on the wire)")
_NETWORK_BUSBW = (
    "nccl-tests across H100 nodes, NDR 400 Gb/s per NIC: 'you should see 46-48GB/s per NIC' "
    "(NVIDIA/nccl-tests#290, NVIDIA's AddyLaddy, ring algorithm); 46 GB/s taken")

#: Preset links. The loopback one is notebook 08's fit as saved in its outputs (2 ranks, gloo,
#: this course's 2-core machine); your own fit, once saved, is `load_fit`.
LINKS = {
    link.name: link
    for link in (
        Link("NVLink 4 (H100 SXM)", 3.4e-6, 1 / 450e9,
             "NVIDIA H100 datasheet: NVLink 900 GB/s per GPU, both directions together, so "
             f"450 GB/s each way; {_NCCL} (NVLink)",
             busbw=360e9, busbw_source=_NVLINK_BUSBW),
        Link("InfiniBand NDR (400 Gb/s)", 9.6e-6, 1 / 50e9,
             "NVIDIA ConnectX-7 / Quantum-2: NDR InfiniBand, 400 Gb/s = 50 GB/s per port and "
             f"direction (a DGX H100 has one port per GPU; RoCE at 400 Gb/s per GPU, as on the "
             f"Llama 3 and torchtitan clusters, has the same line rate); {_NCCL} (network)",
             busbw=46e9, busbw_source=_NETWORK_BUSBW),
        Link("loopback, gloo (notebook 08)", 162e-6, 1 / 1.33e9,
             "notebooks/08, the alpha-beta fit in its saved outputs: 162 µs, 1.33 GB/s"),
    )
}


def fit_path() -> Path:
    """Where `save_fit` writes: ``$DISTLAB_HOME/alpha_beta.json``, else
    ``~/.cache/distlab/alpha_beta.json``."""
    home = os.environ.get("DISTLAB_HOME")
    folder = Path(home) if home else Path.home() / ".cache" / "distlab"
    return folder / "alpha_beta.json"


def _check(alpha, beta) -> tuple[float, float]:
    for name, value in (("alpha", alpha), ("beta", beta)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CalculatorError(f"{name} must be a number of seconds, got {value!r}")
        if not (math.isfinite(value) and value > 0):
            raise CalculatorError(f"{name} must be a positive number of seconds, got {value!r}")
    if alpha >= 1:
        raise CalculatorError(
            f"alpha={alpha!r} would be {alpha} seconds per message; alpha is in seconds, "
            f"so {alpha} microseconds is {alpha}e-6"
        )
    if beta >= 1e-3:
        raise CalculatorError(
            f"beta={beta!r} looks like a bandwidth; beta is seconds per byte: pass "
            "1 / bandwidth (1.33 GB/s is beta = 1 / 1.33e9)"
        )
    return float(alpha), float(beta)


def save_fit(alpha, beta, *, ranks=2, note="", path=None) -> Path:
    """Keep a fitted alpha and beta for later notebooks (see `fit_path`).

    Args:
        alpha: seconds per message.
        beta: seconds per byte (not a bandwidth: 1 / bandwidth).
        ranks: the number of ranks it was fitted on (notebook 08: 2).
        note: a word on where it comes from (shown by `load_fit`'s link name).
        path: write here instead of `fit_path()`.

    Returns:
        The file written.

    Raises:
        CalculatorError (a ValueError): alpha or beta not a positive finite number, alpha of a
            second or more (microseconds given as seconds?), beta of a millisecond per byte or
            more (a bandwidth given instead of its inverse?).
        OSError: the folder cannot be written (set DISTLAB_HOME to one that can).
    """
    alpha, beta = _check(alpha, beta)
    path = Path(path) if path is not None else fit_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"alpha": alpha, "beta": beta, "ranks": ranks, "note": note}))
    os.replace(tmp, path)  # never a half-written file
    return path


def load_fit(path=None) -> Link:
    """The alpha and beta `save_fit` kept, as a `Link` named "your fit".

    Args:
        path: read this file instead of `fit_path()`.

    Raises:
        FileNotFoundError: nothing saved yet: run notebook 08's fit, then ``save_fit(alpha,
            beta)`` (or use a preset from `LINKS`).
        CalculatorError (a ValueError): the file is not what `save_fit` writes (delete it and
            save again).
    """
    path = Path(path) if path is not None else fit_path()
    if not path.exists():
        raise FileNotFoundError(
            f"no alpha-beta fit saved at {path}: run notebook 08's fit, then "
            "distlab.calculators.save_fit(alpha, beta); or use a preset from LINKS"
        )
    try:
        saved = json.loads(path.read_text())
        alpha, beta = _check(saved["alpha"], saved["beta"])
    except (ValueError, KeyError, TypeError) as e:
        raise CalculatorError(
            f"{path} is not an alpha-beta fit saved by save_fit ({e}); delete it and save again"
        ) from None
    note = f", {saved['note']}" if saved.get("note") else ""
    return Link(f"your fit ({saved.get('ranks', '?')} ranks{note})", alpha, beta, str(path))


def get_link(link) -> Link:
    """``link`` as a `Link`: a `Link` as is, a preset's name, or "fit" (`load_fit`). Raises
    `CalculatorError` for an unknown name (listing the presets)."""
    if isinstance(link, Link):
        return link
    if link == "fit":
        return load_fit()
    if link in LINKS:
        return LINKS[link]
    raise CalculatorError(
        f"no link named {link!r}: give a Link(name, alpha, beta), 'fit' (your saved fit), or "
        f"one of {', '.join(repr(n) for n in LINKS)}"
    )
