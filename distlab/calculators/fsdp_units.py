"""What FSDP gathers of a stage, unit by unit, and what FSDP2 makes on its side streams: the
parts of a `MemoryEstimate` that follow from how a stage is cut into FSDP units (as torchtitan
cuts it: the embedding, each block, the final norm with the output layer).

Knows the model's parameter counts (`models`), not the rest of the estimate: ``per`` is the
compute dtype's bytes (bf16: 2).
"""

from __future__ import annotations

from .models import Transformer, stage_layers


def units(m: Transformer, tp: int, pp: int, stage: int, layer: int) -> list[int]:
    """Parameters of each FSDP unit on ``stage`` (one tp rank), in forward order: the embedding
    (first stage), each of its layers (``layer`` parameters each), the final norm with the
    output layer (last stage); a stage's empty ends left out."""
    embedding = m.end_parameters(tp, 2, 0) if stage == 0 else 0
    output = m.end_parameters(tp, pp, stage) - embedding
    layers = len(stage_layers(m.layers, pp)[stage])
    return [u for u in (embedding, *[layer] * layers, output) if u]


def gathered(m, tp, pp, stage, zero, per, ep, reshard_after_forward) -> int:
    """Bytes of parameters gathered for computing, in the compute dtype (``per`` bytes; see
    `MemoryEstimate.peak`)."""
    if zero < 2 or not isinstance(m, Transformer):
        return 0
    dense, expert = m.layer_parameters(tp)
    cut = units(m, tp, pp, stage, dense + expert // ep)
    if zero == 2 or pp > 1 or not reshard_after_forward:  # every unit, forward to backward
        return sum(cut) * per
    # ZeRO-3 alone: the last block and (on the last stage) the norm and output layer stay
    # gathered for the backward that starts with them, as torchtitan sets its units up; then
    # the block computing and the one prefetched
    return (2 * (dense + expert // ep) + cut[-1]) * per


def side_streams(est, per: int) -> int:
    """``MemoryEstimate.side_streams`` (its docstring says what), for the estimate ``est``."""
    m, shards = est.model, est.dp * est.cp
    if est.zero < 2 or shards == 1 or not isinstance(m, Transformer):
        return 0
    if est.virtual_stages > 1:
        return est.grads
    cast = per if est.precision == "bf16-fsdp2" else 0  # fp32 shards, bf16 gathers
    dense, expert = m.layer_parameters(est.tp)
    # a mixture's experts are FSDP's over dp / ep ranks: none to gather when that is one
    experts = expert // est.ep if est.dp // est.ep * est.cp > 1 else 0
    cut = units(m, est.tp, est.pp, est.stage, dense + experts)
    in_flight = max(u * (per + cast / shards) + per * after
                    for u, after in zip(cut, [*cut[1:], 0], strict=True))
    return est.grads + int(in_flight)
