"""Graders for notebook 20, activation memory and checkpointing (see `distlab.exercises`).

Both run in this process: the truth is what `distlab.activations.Meter` measures on a tiny GPT
(`distlab.gpt`) the grader builds, and, for checkpointing, what one process computes without it
(`distlab.gradcheck`).
"""

from __future__ import annotations

import numbers
import warnings

from . import expect

#: (config options, batch size, sequence length) of the blocks exercise 1 measures: the
#: notebook's shape first, then other head counts, an MLP of width 2h, short sequences, small
#: batches.
SHAPES = (
    ({"seq_len": 64}, 8, 64),
    ({"heads": 8, "mlp_ratio": 2}, 3, 10),
    ({"hidden": 16, "heads": 2, "vocab": 40}, 5, 7),
    ({"heads": 1}, 1, 16),
)


def _random_shape():
    """One more (config options, batch size, sequence length), drawn anew at every check: a
    table of the shapes above, copied from earlier messages, does not pass."""
    from ..gpt import Config

    def key(options, b, s):  # what a block's activations depend on (not the vocabulary)
        c = Config(**options)
        return c.hidden, c.heads, c.mlp_ratio, b, s

    r, fixed = expect.rng(), {key(*shape) for shape in SHAPES}
    while True:
        heads = r.choice((1, 2, 3, 4, 6))
        seq_len = r.randrange(4, 33)
        options = {"hidden": heads * r.choice((4, 8)), "heads": heads,
                   "mlp_ratio": r.choice((1, 2, 3, 4)), "vocab": r.randrange(20, 80),
                   "seq_len": seq_len}
        shape = options, r.randrange(1, 7), r.randrange(1, seq_len + 1)
        if key(*shape) not in fixed:  # never one of the shapes above, by a rare chance
            return shape


class _from_the_shapes:
    """While the answer runs: measuring is refused (the exercise asks for the formula). The
    meter, `activations.predict` and running the tiny GPT each raise the learner's error."""

    def __enter__(self):
        import importlib

        from .. import activations, gpt

        predict_module = importlib.import_module("distlab.activations.predict")

        def refuse(what):
            def inner(*args, **kwargs):
                raise AssertionError(
                    f"block_bytes should compute the bytes from the shapes alone (s, b, h, a "
                    f"and the MLP's width); it used {what}, which measures or predicts them for "
                    "you: write the count as a formula"
                )

            return inner

        self._saved = [(activations.Meter, "__enter__", activations.Meter.__enter__),
                       (predict_module, "_gpt_modules", predict_module._gpt_modules),
                       (gpt.GPT, "forward", gpt.GPT.forward)]
        for owner, name, what in zip(
            [o for o, _, _ in self._saved], [n for _, n, _ in self._saved],
            ("activations.Meter", "activations.predict", "a tiny GPT's forward"), strict=True,
        ):
            setattr(owner, name, refuse(what))
        return self

    def __exit__(self, *exc):
        for owner, name, original in self._saved:
            setattr(owner, name, original)
        return False


def _measured_block(options, batch_size, seq_len):
    from .. import activations, gpt

    config = gpt.Config(**options)
    model = gpt.GPT(config, seed=0)
    tokens, targets = gpt.batch(0, batch_size, config)
    tokens, targets = tokens[:, :seq_len].contiguous(), targets[:, :seq_len].contiguous()
    with activations.Meter(model) as meter:
        gpt.loss(model(tokens), targets)
    return config, meter.result.of("layers.0")


def _block_hint(got: int, config, b: int, s: int) -> str:
    h, a, f = config.hidden, config.heads, config.intermediate
    sbh, as2b = s * b * h, a * s * s * b
    right = 4 * (8 * sbh + 2 * s * b * f + as2b + 4 * s * b)
    paper = sbh * 34 + 5 * as2b
    known = {
        paper: "Korthikanti et al.'s formula as published: 2-byte values, with dropout's masks "
               "and output; the tiny GPT here is fp32 and has no dropout",
        2 * paper: "the paper's formula in 4-byte values, but with dropout's masks and output, "
                   "which a model without dropout does not keep",
        right - 16 * s * b: "LayerNorm also keeps a mean and 1/std per token: 2 norms x 2sb values",
        right - 4 * as2b: "attention's softmax output is missing: a x s x s numbers per sequence",
        right + 8 * s * b * (4 * h - f): "the MLP's width is config.intermediate (mlp_ratio x "
                                         "h), not always 4h",
        right // 2: "fp32 values are 4 bytes",
        right // 4: "that is a number of values: the question asks for bytes (4 per fp32 value)",
    }
    return f" ({known[got]})" if got in known and got != right else ""


def exercise_1(block_bytes) -> None:
    """``block_bytes(config, batch_size, seq_len)`` -> int: the bytes one block of the tiny GPT
    keeps for backward (fp32, no dropout, written-out attention), from the shapes alone (the
    meter, ``predict`` and the model's forward refuse to run inside it), checked against the
    meter on several shapes and one drawn anew at every check."""
    for options, b, s in (*SHAPES, _random_shape()):
        config, truth = _measured_block(options, b, s)
        shape = (f"Config({', '.join(f'{k}={v}' for k, v in options.items())}), batch_size={b}, "
                 f"seq_len={s}")
        with _from_the_shapes():
            got = block_bytes(config, b, s)
        if isinstance(got, bool) or not isinstance(got, numbers.Integral):
            raise AssertionError(
                f"block_bytes({shape}) should be a number of bytes, an int like {truth:,}; got "
                f"{expect.describe(got)}"
            )
        if got != truth:
            raise AssertionError(
                f"for {shape} the meter measures {truth:,} bytes in a block; block_bytes says "
                f"{int(got):,}{_block_hint(int(got), config, b, s)}"
            )


# -- exercise 2: checkpoint every other block ---------------------------------------------------

LAYERS, BATCH = 4, 4
#: Depths whose blocks are measured: the trained model's, and an odd one (its last block is
#: checkpointed too), so that a list of the 4-block model's blocks does not pass.
DEPTHS = (LAYERS, 5)


def _wrapped(checkpoint_every_other, n_layers):
    """The answer applied to a fresh tiny GPT of ``n_layers`` blocks, checked for type."""
    import torch

    from .. import gpt

    config = gpt.Config(layers=n_layers)
    model = checkpoint_every_other(gpt.GPT(config, seed=0))
    if not isinstance(model, torch.nn.Module):
        raise AssertionError(
            f"checkpoint_every_other should return the model; it returned "
            f"{expect.describe(model)}"
        )
    if not isinstance(model.layers, torch.nn.ModuleList):
        raise AssertionError(
            f"model.layers is now {type(model.layers).__name__}, not the ModuleList of "
            "blocks: the model's forward iterates over it and runs the blocks as they are. "
            "Wrap the blocks themselves: model.layers[i] = checkpoint_wrapper(model.layers[i])"
        )
    return config, model


def _kept_per_block(config, model) -> None:
    """Measure what each block keeps; blocks 0, 2, ... only their input, the others all."""
    from .. import activations, gpt

    tokens, targets = gpt.batch(0, BATCH, config)
    try:
        with activations.Meter(model) as meter:
            loss = gpt.loss(model(tokens), targets)
        loss.backward()
    except Exception as e:  # noqa: BLE001 -- a broken model is the learner's, say so
        raise AssertionError(
            f"the returned model fails to run: {type(e).__name__}: {e}. Wrap the blocks "
            "themselves (model.layers[i]), not model.layers"
        ) from None
    kept = meter.result
    whole = {"layers", ""} & set(kept.checkpointed)
    if whole:
        raise AssertionError(
            "the whole stack of blocks runs as one checkpoint. Wrap the blocks themselves: "
            "model.layers[i] = checkpoint_wrapper(model.layers[i])"
        )
    s, h, n = config.seq_len, config.hidden, config.layers
    just_input = 4 * s * BATCH * h
    everything = activations.predict(config, BATCH).of("layers.0")
    of = "" if n == LAYERS else f" of a {n}-block model"
    for i in range(n):
        want = just_input if i % 2 == 0 else everything
        got = kept.of(f"layers.{i}")
        if got != want:
            what = ("only its input (it should be checkpointed; did you assign the wrapper "
                    "back into model.layers?)" if i % 2 == 0 else
                    "everything it computes (it should not be checkpointed)")
            if of and i % 2 == 0:
                what += "; every even block is, up to the last, whatever the depth"
            raise AssertionError(
                f"layers.{i}{of} keeps {got:,} bytes for backward; it should keep {want:,}: "
                f"{what}"
            )


def exercise_2(checkpoint_every_other) -> None:
    """``checkpoint_every_other(model)`` wraps blocks 0, 2, ... with ``checkpoint_wrapper`` and
    returns the model: on a 4-block and a 5-block tiny GPT, blocks 0, 2 (and 4) keep only their
    input, 1 and 3 everything, and two AdamW steps of the 4-block one equal one process's."""
    from .. import gpt, gradcheck

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # checkpoint_wrapper is private and may say so
        models = {n: _wrapped(checkpoint_every_other, n) for n in DEPTHS}
        for config, model in models.values():
            _kept_per_block(config, model)
        config, model = models[LAYERS]
        opt = gpt.make_optimizer(model.parameters())
        recorder = gradcheck.Recorder()
        model.zero_grad()
        for step in range(2):
            tokens, targets = gpt.batch(step, BATCH, config)
            loss = gpt.loss(model(tokens), targets)
            loss.backward()
            opt.step()
            recorder.record(step, loss, model, opt)
            opt.zero_grad()
    report = gradcheck.compare([recorder], gpt.reference_run(config, 2, batch_size=BATCH))
    if not report.ok:
        raise AssertionError(f"the blocks keep the right bytes, but training differs from one "
                             f"process: {report.mismatch.text()}")
