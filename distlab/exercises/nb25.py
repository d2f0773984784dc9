"""Graders for notebook 25, at scale on a laptop (see `distlab.exercises`).

Exercise 1 compares the learner's count with what FSDP2 allocates on the first rank of each
stage: every tensor sharded on its own, its dim 0 padded up to whole rows (`held`, equal to
`distlab.scale`'s simulation of PyTorch's own code on these layouts: tests/test_drawn_cases.py),
over layouts drawn at every check. Exercise 2 is arithmetic, checked on clusters drawn at every
check. Both draw anew each time, so a table of the cases copied from earlier ✗ messages does
not pass.
"""

from __future__ import annotations

import functools
import math
import numbers
from fractions import Fraction

from . import expect

#: The sizes of Llama 3 405B (config.json of meta-llama/Llama-3.1-405B), kept here so that an
#: answer that rebinds ``PRESETS["Llama-3 405B"]`` changes neither the check nor later cells.
LLAMA_405B = {"vocab": 128256, "hidden": 16384, "intermediate": 53248, "layers": 126,
              "heads": 128, "kv_heads": 8}
PRESET = "Llama-3 405B"
#: Bytes per parameter of a rank's shard: fp32 parameters, fp32 gradients, Adam's two moments.
BYTES = 4 + 4 + 8


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def held(stage: int, tp: int, pp: int, dp: int, *, layers: int | None = None,
         kv_heads: int | None = None, norms_tp: int = 1, ends: bool = True,
         rows=None) -> int:
    """The parameters FSDP2 keeps on the first dp rank of pipeline ``stage`` of Llama 3 405B
    (TP ``tp``, PP ``pp``, FSDP over ``dp``): each tensor's tensor-parallel shard split by
    rows over ``dp``, ``ceil(rows / dp)`` rows each (FSDP pads every tensor's dim 0 to a
    multiple of dp). The keywords make the mistakes hints look for: ``layers`` on every
    stage, ``kv_heads`` for k and v, norms split by ``norms_tp``, no embedding or output
    layer (``ends=False``), and ``rows(n_rows, n_cols)``, another rounding."""
    from ..calculators import stage_layers

    m = LLAMA_405B
    h, d = m["hidden"], m["hidden"] // m["heads"]
    kv = m["kv_heads"] if kv_heads is None else kv_heads
    share = rows or (lambda r, c: _ceil(r, dp) * c)
    layer = (share(m["heads"] * d // tp, h)  # wq: column-parallel, its heads split by tp
             + 2 * share(kv * d // tp, h)  # wk, wv: grouped-query attention's kv heads
             + share(h, m["heads"] * d // tp)  # wo: row-parallel, its columns split by tp
             + 2 * share(m["intermediate"] // tp, h)  # w1, w3: column-parallel
             + share(h, m["intermediate"] // tp)  # w2: row-parallel
             + 2 * share(h // norms_tp, 1))  # the two RMSNorm weights, whole on every tp rank
    n = layer * (len(stage_layers(m["layers"], pp)[stage]) if layers is None else layers)
    vocab = _ceil(m["vocab"], tp)  # the embedding's and output layer's rows on this tp rank
    if ends and stage == 0:
        n += share(vocab, h)
    if ends and stage == pp - 1:
        n += share(h // norms_tp, 1) + share(vocab, h)
    return n


def _valid_pp(pp: int) -> bool:
    from ..calculators import stage_layers
    from ..calculators._text import CalculatorError

    try:
        stage_layers(LLAMA_405B["layers"], pp)
    except CalculatorError:
        return False
    return True


#: (tp, pp, dp) layouts the check tried before it drew its own (its ✗ messages printed the
#: answers for them), the paper's first: never drawn.
SEEN = ((8, 16, 128), (8, 8, 16), (4, 9, 32), (2, 1, 8), (1, 2, 3), (8, 5, 64))


def _draw_layouts() -> list[tuple[int, int, int]]:
    """(tp, pp, dp) layouts for one check: one whose middle stages hold a layer more than its
    first and last (as the paper's 16 stages), one of one stage, one of two, two anything;
    dp mostly a size that does not divide the rows (so padding shows); none of `SEEN`."""
    rng = expect.rng()
    tps = (1, 2, 4, 8)
    valid = [pp for pp in range(3, 127) if _valid_pp(pp)]
    dp = lambda: rng.choice((rng.randrange(3, 1024), rng.randrange(2, 64)))  # noqa: E731
    draws = [lambda: (8, rng.choice((4, 8, 16, 32, 64)), dp()),
             lambda: (rng.choice(tps), rng.choice(valid), dp()),
             lambda: (rng.choice(tps), 1, dp()),
             lambda: (rng.choice(tps), 2, dp()),
             lambda: (rng.choice(tps), rng.choice(valid), dp())]
    layouts = []
    for draw in draws:
        layout = draw()
        while layout in SEEN:
            layout = draw()
        layouts.append(layout)
    return layouts


def _stages(pp: int) -> list[int]:
    """Every stage kind: the first, the second, a middle one drawn, the one before last, the
    last."""
    middle = expect.rng().randrange(pp)
    return sorted({0, min(1, pp - 1), middle, max(pp - 2, 0), pp - 1})


def _sizes(model) -> dict:
    return {k: getattr(model, k, None) for k in LLAMA_405B}


def _preset_unchanged() -> None:
    """``PRESETS["Llama-3 405B"]`` is still Llama 3 405B; else put it back and say so."""
    from ..calculators import PRESETS, Transformer

    if PRESET in PRESETS and _sizes(PRESETS[PRESET]) == LLAMA_405B:
        return
    PRESETS[PRESET] = Transformer(PRESET, **LLAMA_405B,
                                  source="config.json of meta-llama/Llama-3.1-405B")
    raise AssertionError(
        f'your code changed PRESETS["{PRESET}"], which the notebook\'s other cells (and the '
        "solution) read: distlab has put Llama 3 405B back. Read the sizes from it, or from a "
        "copy (dataclasses.replace), without assigning to PRESETS"
    )


def exercise_1(state_bytes) -> None:
    """``state_bytes(stage, tp, pp, dp)``: the bytes of parameters, gradients and Adam state the
    first dp rank holds on pipeline ``stage`` of Llama-3 405B with FSDP2 in bf16 mixed
    precision (16 bytes per parameter of its shard; every tensor sharded on its own over dp,
    padded up to whole rows), for layouts drawn at every check and every stage kind. An answer
    that changes ``PRESETS["Llama-3 405B"]`` is told so (and the preset put back)."""
    _preset_unchanged()  # an earlier cell may have changed it
    for tp, pp, dp in _draw_layouts():
        for stage in _stages(pp):
            want = BYTES * held(stage, tp, pp, dp)
            try:
                got = state_bytes(stage, tp, pp, dp)
            finally:
                _preset_unchanged()
            what = f"state_bytes({stage}, {tp}, {pp}, {dp})"
            if not isinstance(got, numbers.Integral) or isinstance(got, bool):
                hint = " (bytes are whole numbers: FSDP pads each tensor to whole rows per rank)" \
                    if isinstance(got, float) else ""
                raise AssertionError(f"{what} should be an int of bytes, got "
                                     f"{expect.describe(got)}{hint}")
            if got != want:
                raise AssertionError(
                    f"{what} gave {got:,} bytes; the first rank of stage {stage} holds {want:,}"
                    f"{_hint_1(got, want, stage, tp, pp, dp)}")


def _hint_1(got, want, stage, tp, pp, dp) -> str:
    from ..calculators import stage_layers

    m, variant = LLAMA_405B, lambda **k: BYTES * held(stage, tp, pp, dp, **k)  # noqa: E731
    layers = len(stage_layers(m["layers"], pp)[stage])
    exact = held(stage, tp, pp, dp, rows=lambda r, c: r * c)  # before FSDP: one tp rank
    if got == BYTES * exact:
        return " (FSDP shards over the dp ranks too: divide each tensor's rows by dp)"
    if got * 8 == want:  # 2 bytes per parameter: the bf16 parameters only
        return (" (16 bytes per parameter of the shard: fp32 parameters 4, fp32 gradients 4, "
                "Adam's two moments 8; the bf16 copies FSDP2 gathers are freed after use)")
    first = len(stage_layers(m["layers"], pp)[0])
    if 0 < stage < pp - 1 and layers != first and got == variant(layers=first):
        return (f" ({m['layers']} layers do not divide into {pp} equal stages: a middle stage "
                f"holds {layers} layers, the first and last stages fewer; read each stage's own "
                f"count, len(calculators.stage_layers({m['layers']}, {pp})[{stage}]))")
    if pp > 1 and m["layers"] % pp and got == variant(layers=m["layers"] // pp):
        return (f" ({m['layers']} layers do not divide into {pp} equal stages: the Llama 3 "
                f"paper gives the first and last stages fewer; this stage has {layers}, "
                "calculators.stage_layers says how many)")
    if got == variant(ends=False):
        return " (the first stage also holds the embedding, the last the norm and output layer)"
    if got == variant(kv_heads=m["heads"]):
        return (f" (grouped-query attention: k and v have {m['kv_heads']} heads, the queries "
                f"{m['heads']})")
    if tp > 1 and got == variant(norms_tp=tp):
        return " (tensor parallelism leaves the norms whole: every tp rank holds all h weights)"
    padded = -(-m["vocab"] // tp)
    example = (f"; here the embedding's {padded:,} rows on a tp rank are "
               f"{-(-padded // dp):,} rows per dp rank, not {padded / dp:,.4g}")
    if got == BYTES * _ceil(exact, dp):
        return (" (FSDP2 shards each tensor on its own, not the stage as one block: every "
                f"tensor's rows are padded up to a multiple of dp, ceil(rows / dp) rows per rank"
                f"{example if padded % dp else ''})")
    if got == variant(rows=lambda r, c: r // dp * c):
        return (" (round up, not down: FSDP pads each tensor to ceil(rows / dp) rows; the first "
                "rank holds the full share)")
    if got == variant(rows=lambda r, c: _ceil(r * c, dp)):
        return (" (FSDP2 splits each tensor's dim 0: whole rows, ceil(rows / dp) of them, not "
                "ceil(elements / dp))")
    return ""


# -- exercise 2: when FSDP's all-gather hides --------------------------------------------------


def _whole_cluster(rng) -> tuple[int, float, float] | None:
    """(dp, flops, bandwidth) whose exact answer is a whole number of tokens, also as floats
    compute it in any usual order (so that the ceiling of a learner's float is that number, and
    "at least x" is x itself, not x + 1); None for a draw where some order rounds."""
    dp = rng.choice((2, 4, 8, 16, 32, 64, 128, 3, 5, 6, rng.randrange(2, 1025)))
    tokens = rng.randrange(1000, 50_000)
    unit = rng.randrange(1, 2**12)  # bandwidth = (dp - 1) * unit: flops stays a whole float
    bandwidth, flops = float((dp - 1) * unit * 2**20), float(tokens * dp * unit * 2**20)
    orders = ((dp - 1) / dp * flops / bandwidth, flops / bandwidth * (dp - 1) / dp,
              (dp - 1) * flops / (dp * bandwidth), flops * (1 - 1 / dp) / bandwidth,
              flops / bandwidth * (1 - 1 / dp), (dp - 1) * flops / dp / bandwidth)
    if not 1e14 <= flops <= 4e15 or any(x != tokens for x in orders):
        return None
    return dp, flops, bandwidth


def _draw_clusters(n: int = 6) -> list[tuple[int, float, float]]:
    """(dp, flops, bandwidth) of ``n`` clusters: one whose exact answer is a whole number of
    tokens (then "at least x" is x: one more is wrong), the others never whole, half with a
    fraction below 0.5 (rounding to the nearest is then not the ceiling), half above
    (truncating is not), from a thousand to fifty thousand tokens (so that a token's tenth is
    more than the 1e-6 the check forgives). In a drawn order: which case comes first is not
    known in advance."""
    rng = expect.rng()
    cases = []
    for i in range(n - 1):
        # dp = 2 not first: a ring's dp / (dp - 1) is then 2, another mistake's ratio too
        dp = rng.choice((3, 8, rng.randrange(3, 1025)) if i == 0 else
                        (2, 3, 8, rng.randrange(2, 1025)))
        flops = rng.uniform(1e14, 2e15)
        fraction = rng.uniform(0.1, 0.4) if i % 2 == 0 else rng.uniform(0.6, 0.9)
        tokens = rng.randrange(1000, 50_000) + fraction  # a tenth of a token is > 1e-6 of it
        bandwidth = (dp - 1) / dp * flops / tokens
        cases.append((dp, flops, bandwidth))
    whole = None
    while whole is None:
        whole = _whole_cluster(rng)
    cases.insert(rng.randrange(1, n), whole)  # after the first: dp = 2 is not first either
    return cases


def _exact_tokens(dp: int, flops: float, bandwidth: float) -> Fraction:
    """The exact ratio (dp - 1) / dp x flops / bandwidth of the floats given (no rounding)."""
    return Fraction(dp - 1, dp) * Fraction(flops) / Fraction(bandwidth)


def exercise_2(min_tokens) -> None:
    """``min_tokens(dp, flops, bandwidth)``: the fewest tokens per rank at which a layer's
    forward matmuls (2 FLOPs per parameter per token, at ``flops`` FLOP/s) take at least as long
    as FSDP's all-gather of that layer's bf16 parameters over ``dp`` ranks (a ring: each rank
    receives (dp - 1) / dp of them, at ``bandwidth`` bytes/s), so that prefetching hides it.
    Either the exact ratio (within 1e-6) or its ceiling, the fewest whole tokens, is right;
    clusters drawn at every check, one with a whole answer."""
    for dp, flops, bandwidth in _draw_clusters():
        exact = _exact_tokens(dp, flops, bandwidth)
        want, fewest = float(exact), math.ceil(exact)
        got = min_tokens(dp, flops, bandwidth)
        what = f"min_tokens({dp}, {flops:.17g}, {bandwidth:.17g})"
        if not isinstance(got, numbers.Real) or isinstance(got, bool) or not math.isfinite(got):
            raise AssertionError(f"{what} should be a number of tokens, got "
                                 f"{expect.describe(got)}")
        if math.isclose(got, want, rel_tol=1e-6) or got == fewest:
            continue
        ratio = got / want if want else float("inf")
        hints = ((dp / (dp - 1), "a ring all-gather moves (dp - 1) / dp of the bytes, not all"),
                 (2.0, "both sides count 2 per parameter: 2 bytes in bf16, 2 FLOPs per token"),
                 (0.5, "both sides count 2 per parameter: 2 bytes in bf16, 2 FLOPs per token"),
                 (8.0, "bandwidth is in bytes per second, not bits"),
                 (1 / 3, "the forward only: one all-gather against the forward's matmuls"))
        found = [h for r, h in hints if math.isclose(ratio, r, rel_tol=1e-3)]
        hint = f" ({'; or: '.join(found)})" if found else ""
        if not hint and exact.denominator == 1 and got == fewest + 1:
            hint = (f" (here the ratio is exactly {fewest:,} tokens, a whole number: at "
                    f"{fewest:,} the matmuls take exactly as long as the all-gather, which is "
                    "\"at least as long\". math.floor(x) + 1 is one too many when x is whole; "
                    "math.ceil(x) is the fewest whole tokens)")
        elif not hint and got in (math.floor(want), round(want)):
            hint = (" (the fewest whole tokens round up: a token fewer and the all-gather "
                    "outlasts the matmuls; or give the exact ratio)")
        whole = " (a whole number)" if exact.denominator == 1 else ""
        raise AssertionError(f"{what} gave {got!r}; the all-gather hides behind the forward "
                             f"from {want:,.2f} tokens per rank{whole} (the exact ratio; its "
                             f"ceiling, {fewest:,}, is right too){hint}")


#: Exercise 3's layout, all but the pipeline: TP 8, FSDP over 8, 1F1B with pp microbatches,
#: full recomputation, FSDP2's bf16 mixed precision, 8K-token sequences.
CHOOSE = dict(tp=8, dp=8, seq_len=8192, checkpointing="full")
#: The pipeline sizes a learner tries, fewest first.
PP_TRIED = tuple(range(1, 17))


def fewest_stages_truth(model, capacity: int):
    """The fewest stages in `PP_TRIED` with which every stage's peak (the calculator, through
    `distlab.scale.Layout.memory`) is at most ``capacity`` bytes; None if none."""
    for pp in PP_TRIED:
        peaks = _peaks(model, pp)
        if peaks and max(peaks) <= capacity:
            return pp
    return None


def _splits(model, pp: int) -> bool:
    """Whether ``model``'s layers split into ``pp`` stages (`calculators.stage_layers`: every
    stage ``ceil(layers / pp)`` layers, the difference taken from the first and last stages a
    layer at a time; no split when that empties one)."""
    from ..calculators import CalculatorError, stage_layers

    try:
        stage_layers(model.layers, pp)
    except CalculatorError:
        return False
    return True


@functools.lru_cache(maxsize=4096)
def _peaks(model, pp: int) -> tuple[int, ...]:
    """Each stage's peak with ``pp`` stages; () when the layers do not split so."""
    from ..scale import Layout

    if not _splits(model, pp):
        return ()
    layout = Layout(pp=pp, **CHOOSE)
    return tuple(layout.memory(model, stage).peak for stage in range(pp))


def _draw_model(rng, layers: int | None = None):
    """A Llama-like model no notebook shows: hidden a multiple of 1,024, heads of 128, 8
    key-value heads, the MLP about 3.5 x hidden, ``layers`` layers (drawn from 24-96 if not
    given), a 32K to 256K vocabulary."""
    from ..calculators import Transformer

    hidden = 1024 * rng.randrange(4, 17)
    vocab = rng.choice((32768, 65536, 128256, 256000))
    layers = rng.randrange(24, 97) if layers is None else layers
    return Transformer(f"drawn-{hidden}-{vocab}", vocab=vocab, hidden=hidden,
                       intermediate=256 * round(3.5 * hidden / 256), layers=layers,
                       heads=hidden // 128, kv_heads=8)


#: The kinds of case exercise 3 draws, one each, in this order: a capacity exactly the
#: answer's worst peak ("at most" includes it); the answer the largest degree, 16; the answer
#: past a degree the layers do not split into (a search that stops there, or skips what follows,
#: fails); a later stage of the pipeline one smaller deciding (a middle one, a layer heavier
#: when the layers do not split evenly, or the last); the first stage deciding; anything.
KINDS = ("exact", "largest", "past a gap", "a later stage decides", "the first stage decides",
         "any")


def _draw_case(rng, kind: str):
    """One (model, capacity) of ``kind`` (`KINDS`), or None when this draw cannot make one. The
    capacity lies between the answer's worst peak and the smallest worst peak of the fewer
    stages the layers split into: the answer is the fewest that fit, by construction."""
    if kind == "largest":  # ceil(layers / 16) < ceil(layers / 15): 16 stages hold fewer layers
        k = rng.randrange(2, 7)
        layers = rng.randrange(15 * k + 1, 16 * k + 1)
    else:
        layers = rng.randrange(24, 41) if kind == "past a gap" else None  # few layers: gaps
    model = _draw_model(rng, layers)
    tried = [pp for pp in PP_TRIED if _splits(model, pp)]
    if kind == "largest":
        answers = [pp for pp in tried[1:] if pp == PP_TRIED[-1]]
    elif kind == "past a gap":
        answers = [pp for pp in tried[1:] if any(q not in tried for q in range(1, pp))]
    else:
        answers = tried[1:]
    if not answers:
        return None
    pp = rng.choice(answers)
    worst = max(_peaks(model, pp))
    fewer = [q for q in tried if q < pp]
    before = min(fewer, key=lambda q: max(_peaks(model, q)))  # the nearest to fitting
    peaks = _peaks(model, before)
    upper = max(peaks)
    if worst >= upper:
        return None  # one stage more does not help here: not a question with one answer
    rest = max(peaks[1:], default=0)  # a later stage: a middle one, a layer heavier, or the last
    if kind == "exact":
        return model, worst
    if kind == "a later stage decides":  # `before`'s first stage fits, a later one does not
        low = max(worst, peaks[0])
    elif kind == "the first stage decides":
        low = max(worst, rest)
    else:
        low = worst
    if low >= upper:
        return None
    return model, rng.randrange(low, upper)


def _draw_choices():
    """(model, capacity) cases, yielded as drawn: one of each of `KINDS` (a kind this draw of
    models cannot make after 200 tries is left out: tests/test_drawn_cases.py sees it never
    is), then one where no pipeline of `PP_TRIED` fits."""
    rng = expect.rng()
    for kind in KINDS:
        for _ in range(200):
            case = _draw_case(rng, kind)
            if case is not None:
                yield case
                break
    model = _draw_model(rng)
    yield model, max(_peaks(model, 1)) // 100  # a hundredth: nothing fits


def _why_none(model, want: int) -> str:
    """Why a search may have missed ``want`` stages: it stopped short of 16, or at a degree the
    layers do not split into."""
    skipped = [pp for pp in range(1, want) if not _splits(model, pp)]
    why = []
    if want == PP_TRIED[-1]:
        why.append("try every pp from 1 to 16, 16 included: range(1, 17)")
    if skipped:
        why.append(f"{model.layers} layers do not split into {_listed(skipped)} stages, but do "
                   f"into {want}: skip a pp that does not split and go on to the next")
    return " (" + ("; ".join(why) or "try every pp the layers split into, fewest first; a peak "
                   "equal to the capacity fits") + ")"


def _listed(numbers_: list[int]) -> str:
    return ", ".join(map(str, numbers_[:-1])) + (" or " if len(numbers_) > 1 else "") + str(
        numbers_[-1])


def exercise_3(fewest_stages) -> None:
    """``fewest_stages(model, capacity)``: the fewest pipeline stages (1 to 16, those the model's
    layers split into: `calculators.stage_layers`) with which
    every stage of ``model`` (a `calculators.Transformer`), laid out as `CHOOSE`, peaks at
    ``capacity`` bytes or less by the calculator; None when none does. Models and capacities
    drawn at every check, one of each of `KINDS` (a capacity exactly a peak, 16 stages, a
    pipeline past a degree the layers do not split into, a later stage or the first
    deciding), then one where nothing fits."""
    for model, capacity in _draw_choices():
        want = fewest_stages_truth(model, capacity)
        what = (f"fewest_stages(Transformer(hidden={model.hidden}, layers={model.layers}, "
                f"vocab={model.vocab}, ...), {capacity:,})")
        got = fewest_stages(model, capacity)
        if want is None:
            if got is not None:
                raise AssertionError(f"{what} gave {expect.describe(got)}: no pipeline of 1 to "
                                     "16 stages fits there (its stages' peaks are all above "
                                     "the capacity); return None")
            continue
        if got is None:
            raise AssertionError(f"{what} gave None, but {want} stages fit there"
                                 f"{_why_none(model, want)}")
        if not isinstance(got, numbers.Integral) or isinstance(got, bool):
            raise AssertionError(f"{what} should be a whole number of stages (or None), got "
                                 f"{expect.describe(got)}")
        if got == want:
            continue
        hint = ""
        if got < want:
            peaks = _peaks(model, got)
            over = [s for s, p in enumerate(peaks) if p > capacity]
            hint = (f": with pp={got}, stage {over[0]} of 0 to {got - 1} peaks at "
                    f"{peaks[over[0]]:,} bytes, above the capacity (check every stage: the "
                    "first holds the embedding and the most microbatches, the last the "
                    "output layer and the loss; and compare bytes with bytes)") if over else ""
        else:
            hint = (": a pipeline with fewer stages fits already (try every pp the layers "
                    "split into, fewest first; a peak equal to the capacity fits)")
        if got not in PP_TRIED or not _splits(model, got):
            hint = (f": {model.layers} layers do not split into {got} stages (try only what "
                    "calculators.stage_layers accepts)")
        raise AssertionError(f"{what} gave {got}, not the fewest stages that fit{hint}")
