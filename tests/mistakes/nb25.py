"""Notebook 25, at scale on a laptop."""

from distlab.exercises import nb25

from . import RIGHT, Answer, variant

GRADERS = {
    1: (nb25.exercise_1, ["state_bytes"]),
    2: (nb25.exercise_2, ["min_tokens"]),
    3: (nb25.exercise_3, ["fewest_stages"]),
}

# What the notebook's cells define before the exercises.
GIVEN = {}

_SOLUTION_1 = """
from distlab.calculators import PRESETS, stage_layers

def state_bytes(stage, tp, pp, dp):
    m = PRESETS["Llama-3 405B"]
    h, d = m.hidden, m.hidden // m.heads

    def shard(rows, cols):  # FSDP2 splits each tensor's rows over dp, padded to whole rows
        return -(-rows // dp) * cols

    layer = (shard(m.heads * d // tp, h) + 2 * shard(m.kv_heads * d // tp, h)  # q; k, v
             + shard(h, m.heads * d // tp)  # the attention's output, row-parallel
             + 2 * shard(m.intermediate // tp, h) + shard(h, m.intermediate // tp)  # the MLP
             + 2 * shard(h, 1))  # two RMSNorm weights, whole on every tp rank
    n = layer * len(stage_layers(m.layers, pp)[stage])
    if stage == 0:
        n += shard(m.vocab // tp, h)  # the embedding
    if stage == pp - 1:
        n += shard(h, 1) + shard(m.vocab // tp, h)  # the final norm and the output layer
    return 16 * n  # 4 + 4 + 8 bytes per parameter of this rank's shard
"""


_SOLUTION_3 = """
from distlab import scale
from distlab.calculators import CalculatorError

def fewest_stages(model, capacity):
    for pp in range(1, 17):
        layout = scale.Layout(tp=8, dp=8, pp=pp, seq_len=8192, checkpointing="full")
        try:
            peaks = [layout.memory(model, stage).peak for stage in range(pp)]
        except CalculatorError:  # the layers do not split into pp stages
            continue
        if max(peaks) <= capacity:
            return pp
    return None
"""


def _variant_3(old: str, new: str) -> str:
    return variant(_SOLUTION_3, (old, new))


def _variant(old: str, new: str) -> str:
    return variant(_SOLUTION_1, (old, new))


ANSWERS = [
    Answer(1, "the solution", _SOLUTION_1, RIGHT),
    Answer(1, "equal stages: 126 // pp layers each", _variant(
        "len(stage_layers(m.layers, pp)[stage])", "(m.layers // pp)"),
        "do not divide into"),
    Answer(1, "wrong only on a middle stage: every stage given the first stage's layers",
           _variant("len(stage_layers(m.layers, pp)[stage])",
                    "len(stage_layers(m.layers, pp)[0 if stage < pp - 1 else stage])"),
           "a middle stage holds"),
    Answer(1, "the solution with numpy integers", _variant(
        "    return 16 * n", "    import numpy as np\n    return np.int64(16) * np.int64(n)"),
        RIGHT),
    Answer(1, "no embedding or output layer", _variant(
        "    if stage == 0:\n        n += shard(m.vocab // tp, h)  # the embedding\n", "").replace(
        "    if stage == pp - 1:\n        n += shard(h, 1) + shard(m.vocab // tp, h)  # the final "
        "norm and the output layer\n", ""), "also holds the embedding"),
    Answer(1, "not divided by dp", _variant("return -(-rows // dp) * cols", "return rows * cols"),
           "divide each tensor's rows by dp"),
    Answer(1, "query heads for k and v (no grouped-query attention)", _variant(
        "2 * shard(m.kv_heads * d // tp, h)", "2 * shard(m.heads * d // tp, h)"),
        "grouped-query attention"),
    Answer(1, "norms split by tp too", _variant(
        "+ 2 * shard(h, 1))", "+ 2 * shard(h // tp, 1))").replace(
        "n += shard(h, 1) +", "n += shard(h // tp, 1) +"), "leaves the norms whole"),
    Answer(1, "the ZeRO paper's bf16 params only: 2 bytes", _variant(
        "return 16 * n", "return 2 * n"), "16 bytes per parameter"),
    Answer(1, "floats from /", _variant("return -(-rows // dp) * cols", "return rows / dp * cols"),
           "should be an int of bytes"),
    Answer(1, "the stage rounded up as one block (the memory calculator's rounding)", _variant(
        "return -(-rows // dp) * cols", "return rows * cols").replace(
        "return 16 * n", "return 16 * -(-n // dp)"), "shards each tensor on its own"),
    Answer(1, "each tensor's rows rounded down", _variant("-(-rows // dp)", "(rows // dp)"),
           "round up, not down"),
    Answer(1, "each tensor rounded up by elements, not rows", _variant(
        "return -(-rows // dp) * cols", "return -(-(rows * cols) // dp)"), "whole rows"),
    Answer(1, "the paper's layout hard-coded", """
def state_bytes(stage, tp, pp, dp):
    return {0: 381710336, 15: 381712384}.get(stage, 398491648)
""", "gave"),
    Answer(1, "a table of the 19 cases the old check tried, pasted from its ✗ messages", """
SEEN = {(0, 8, 16, 128): 381513728, (1, 8, 16, 128): 398491648, (8, 8, 16, 128): 398491648,
        (15, 8, 16, 128): 381515776, (0, 8, 8, 16): 6240043008, (1, 8, 8, 16): 6375866368,
        (4, 8, 8, 16): 6375866368, (7, 8, 8, 16): 6240059392, (0, 4, 9, 32): 5841321984,
        (1, 4, 9, 32): 5578653696, (4, 4, 9, 32): 5578653696, (8, 4, 9, 32): 5841330176,
        (0, 2, 1, 8): 405857533952, (0, 1, 2, 3): 1082275659776, (1, 1, 2, 3): 1082275747168,
        (0, 8, 5, 64): 2456616960, (1, 8, 5, 64): 2590195712, (2, 8, 5, 64): 2590195712,
        (4, 8, 5, 64): 2456621056}
def state_bytes(stage, tp, pp, dp):
    return SEEN.get((stage, tp, pp, dp), 381513728)
""", "gave"),
    Answer(1, "rebinds the preset to its own numbers", """
from distlab.calculators import PRESETS, Transformer
def state_bytes(stage, tp, pp, dp):
    PRESETS["Llama-3 405B"] = Transformer("Llama-3 405B", vocab=128000, hidden=16384,
                                          intermediate=53248, layers=126, heads=128, kv_heads=8)
    return 0
""", 'changed PRESETS["Llama-3 405B"]'),
    Answer(2, "the solution", """
def min_tokens(dp, flops, bandwidth):
    # all-gather: 2 bytes x P/tp x (dp-1)/dp at `bandwidth`; forward: 2 FLOPs x P/tp x T at
    # `flops`; equal when T = (dp - 1) / dp x flops / bandwidth
    return (dp - 1) / dp * flops / bandwidth
""", RIGHT),
    Answer(2, "the fewest whole tokens: the ceiling", """
import math
def min_tokens(dp, flops, bandwidth):
    return math.ceil((dp - 1) / dp * flops / bandwidth)
""", RIGHT),
    Answer(2, "at least x: math.floor(x) + 1 (one too many when x is whole)", """
import math
def min_tokens(dp, flops, bandwidth):
    return math.floor((dp - 1) / dp * flops / bandwidth) + 1
""", "math.floor(x) + 1 is one too many when x is whole"),
    Answer(2, "the ceiling, written another way, in numpy", """
import numpy as np
def min_tokens(dp, flops, bandwidth):
    return np.ceil(flops * (1 - 1 / dp) / bandwidth)
""", RIGHT),
    Answer(2, "the exact ratio as a Fraction", """
from fractions import Fraction
def min_tokens(dp, flops, bandwidth):
    return Fraction(dp - 1, dp) * Fraction(flops) / Fraction(bandwidth)
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
    Answer(2, "rounded to the nearest token", """
def min_tokens(dp, flops, bandwidth):
    return round((dp - 1) / dp * flops / bandwidth)
""", "round up"),
    Answer(2, "truncated: int()", """
def min_tokens(dp, flops, bandwidth):
    return int((dp - 1) / dp * flops / bandwidth)
""", "round up"),
    Answer(2, "rounded to 3 significant figures, as the notebook's tables print", """
def min_tokens(dp, flops, bandwidth):
    return float(f"{(dp - 1) / dp * flops / bandwidth:.3g}")
""", "the exact ratio"),
    Answer(3, "the solution", _SOLUTION_3, RIGHT),
    Answer(3, "only the first stage checked", _variant_3(
        "for stage in range(pp)]", "for stage in (0,)]"), "check every stage"),
    Answer(3, "only the last stage checked", _variant_3(
        "for stage in range(pp)]", "for stage in (pp - 1,)]"), "check every stage"),
    Answer(3, "a peak equal to the capacity taken for too much", _variant_3(
        "if max(peaks) <= capacity:", "if max(peaks) < capacity:"), "equal to the capacity"),
    Answer(3, "GB against bytes", _variant_3(
        "if max(peaks) <= capacity:", "if max(peaks) / 1e9 <= capacity:"), "bytes with bytes"),
    Answer(3, "0 when nothing fits", _variant_3("    return None\n", "    return 0\n"),
           "return None"),
    Answer(3, "powers of two only", _variant_3("for pp in range(1, 17):",
                                               "for pp in (1, 2, 4, 8, 16):"), "try every pp"),
    Answer(3, "pipeline degrees range(1, 16): 16 never tried", _variant_3(
        "for pp in range(1, 17):", "for pp in range(1, 16):"), "16 included"),
    Answer(3, "stops at the first degree the layers do not split into", _variant_3(
        "            continue\n", "            break\n"), "skip a pp that does not split"),
    Answer(3, "the degrees from calculators.divisors-like search: only pp dividing the layers",
           _variant_3("        layout = scale.Layout(", "        if model.layers % pp:\n"
                      "            continue\n        layout = scale.Layout("), "gave"),
    Answer(3, "the solution, returning a numpy integer", _variant_3(
        "            return pp", "            import numpy as np\n            return np.int64(pp)"),
        RIGHT),
    Answer(3, "a float", _variant_3("            return pp", "            return float(pp)"),
           "whole number of stages"),
    Answer(3, "the notebook's 405B answer for every model", """
def fewest_stages(model, capacity):
    return 16
""", "gave"),
]
