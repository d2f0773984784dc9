"""Notebook 25, at scale on a laptop."""

from distlab.exercises import nb25

from . import RIGHT, Answer

GRADERS = {
    1: (nb25.exercise_1, ["state_bytes"]),
    2: (nb25.exercise_2, ["min_tokens"]),
}

# What the notebook's cells define before the exercises.
GIVEN = {}

_SOLUTION_1 = """
from distlab.calculators import PRESETS, stage_layers

def state_bytes(stage, tp, pp, dp):
    m = PRESETS["Llama-3 405B"]
    h, d = m.hidden, m.hidden // m.heads
    attention = h * (m.heads + 2 * m.kv_heads) * d // tp + m.heads * d * h // tp
    layer = attention + 3 * h * m.intermediate // tp + 2 * h  # + two RMSNorm weights, whole
    n = layer * len(stage_layers(m.layers, pp)[stage])
    if stage == 0:
        n += m.vocab // tp * h  # the embedding
    if stage == pp - 1:
        n += h + m.vocab // tp * h  # the final norm and the output layer
    return 16 * -(-n // dp)  # 4 + 4 + 8 bytes per parameter of this rank's shard
"""


def _variant(old: str, new: str) -> str:
    assert old in _SOLUTION_1, old
    return _SOLUTION_1.replace(old, new)


ANSWERS = [
    Answer(1, "the solution", _SOLUTION_1, RIGHT),
    Answer(1, "equal stages: 126 // pp layers each", _variant(
        "len(stage_layers(m.layers, pp)[stage])", "(m.layers // pp)"),
        "do not divide into"),
    Answer(1, "no embedding or output layer", _variant(
        "    if stage == 0:\n        n += m.vocab // tp * h  # the embedding\n", "").replace(
        "    if stage == pp - 1:\n        n += h + m.vocab // tp * h  # the final norm and the "
        "output layer\n", ""), "also holds the embedding"),
    Answer(1, "not divided by dp", _variant("16 * -(-n // dp)", "16 * n"),
           "divide by dp"),
    Answer(1, "query heads for k and v (no grouped-query attention)", _variant(
        "(m.heads + 2 * m.kv_heads)", "(3 * m.heads)"), "grouped-query attention"),
    Answer(1, "norms split by tp too", _variant(
        "+ 2 * h  # + two", "+ 2 * h // tp  # + two"), "holds"),
    Answer(1, "the ZeRO paper's bf16 params only: 2 bytes", _variant(
        "return 16 *", "return 2 *"), "holds"),
    Answer(1, "floats from /", _variant("16 * -(-n // dp)", "16 * n / dp"),
           "should be an int of bytes"),
    Answer(1, "the paper's layout hard-coded", """
def state_bytes(stage, tp, pp, dp):
    return {0: 381513728, 15: 381515776}.get(stage, 398491648) * 16 // 128 * 8
""", "gave"),
    Answer(2, "the solution", """
def min_tokens(dp, flops, bandwidth):
    # all-gather: 2 bytes x P/tp x (dp-1)/dp at `bandwidth`; forward: 2 FLOPs x P/tp x T at
    # `flops`; equal when T = (dp - 1) / dp x flops / bandwidth
    return (dp - 1) / dp * flops / bandwidth
""", RIGHT),
    Answer(2, "the whole parameters, not (dp-1)/dp", """
def min_tokens(dp, flops, bandwidth):
    return flops / bandwidth
""", "(dp - 1) / dp"),
    Answer(2, "4 bytes per parameter (fp32 on the wire)", """
def min_tokens(dp, flops, bandwidth):
    return 2 * (dp - 1) / dp * flops / bandwidth
""", "2 bytes in bf16"),
    Answer(2, "bits per second", """
def min_tokens(dp, flops, bandwidth):
    return 8 * (dp - 1) / dp * flops / bandwidth
""", "bytes per second, not bits"),
    Answer(2, "forward and backward FLOPs (6 per parameter per token)", """
def min_tokens(dp, flops, bandwidth):
    return (dp - 1) / dp * flops / bandwidth / 3
""", "the forward only"),
    Answer(2, "the paper's number for H100 and InfiniBand, for every input", """
def min_tokens(dp, flops, bandwidth):
    return 8652.34375
""", "gave"),
    Answer(2, "a string", """
def min_tokens(dp, flops, bandwidth):
    return f"{(dp - 1) / dp * flops / bandwidth:.0f}"
""", "should be a number of tokens"),
]
