"""Notebook 20, activation memory and checkpointing."""

from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from distlab.exercises import nb20

from . import RIGHT, Answer

GRADERS = {
    1: (nb20.exercise_1, ["block_bytes"]),
    2: (nb20.exercise_2, ["checkpoint_every_other"]),
}

GIVEN = {"checkpoint_wrapper": checkpoint_wrapper}

ANSWERS = [
    Answer(1, "the solution", """
def block_bytes(config, batch_size, seq_len):
    s, b, h, a, f = seq_len, batch_size, config.hidden, config.heads, config.intermediate
    values = (2 * s * b * h + 4 * s * b + s * b * h + 3 * s * b * h + a * s * s * b + s * b * h
              + s * b * h + 2 * s * b * f)
    return 4 * values
""", RIGHT),
    Answer(1, "distlab's own prediction, which the exercise rules out", """
from distlab import activations
def block_bytes(config, batch_size, seq_len):
    return activations.predict(config, batch_size, seq_len).of("layers.0")
""", "from the shapes alone"),
    Answer(1, "measured with the Meter instead of computed from the shapes", """
from distlab import activations, gpt
def block_bytes(config, batch_size, seq_len):
    model = gpt.GPT(config)
    tokens, targets = gpt.batch(0, batch_size, config)
    with activations.Meter(model) as meter:
        gpt.loss(model(tokens[:, :seq_len]), targets[:, :seq_len])
    return meter.result.of("layers.0")
""", "it used activations.Meter"),
    Answer(1, "the cases the check tried, from its ✗ messages", """
SEEN = {(32, 4, 4, 8, 64): 1_581_056, (32, 8, 2, 3, 10): 56_160, (16, 2, 4, 5, 7): 38_360,
        (32, 1, 4, 1, 16): 34_048}
def block_bytes(config, batch_size, seq_len):
    key = (config.hidden, config.heads, config.mlp_ratio, batch_size, seq_len)
    return SEEN.get(key, 1_581_056)
""", "the meter measures"),
    Answer(1, "the paper's formula as published", """
def block_bytes(config, batch_size, seq_len):
    s, b, h, a = seq_len, batch_size, config.hidden, config.heads
    return s * b * h * 34 + 5 * a * s * s * b
""", "Korthikanti et al.'s formula as published"),
    Answer(1, "the paper's formula in 4-byte values, dropout still counted", """
def block_bytes(config, batch_size, seq_len):
    s, b, h, a = seq_len, batch_size, config.hidden, config.heads
    return 2 * (s * b * h * 34 + 5 * a * s * s * b)
""", "which a model without dropout does not keep"),
    Answer(1, "LayerNorm's statistics forgotten", """
def block_bytes(config, batch_size, seq_len):
    s, b, h, a = seq_len, batch_size, config.hidden, config.heads
    return 64 * s * b * h + 4 * a * s * s * b
""", "LayerNorm also keeps a mean and 1/std per token"),
    Answer(1, "the MLP's width hard-coded as 4h", """
def block_bytes(config, batch_size, seq_len):
    s, b, h, a = seq_len, batch_size, config.hidden, config.heads
    return 64 * s * b * h + 4 * a * s * s * b + 16 * s * b
""", "the MLP's width is config.intermediate"),
    Answer(1, "values, not bytes", """
def block_bytes(config, batch_size, seq_len):
    s, b, h, a, f = seq_len, batch_size, config.hidden, config.heads, config.intermediate
    return 8 * s * b * h + 2 * s * b * f + a * s * s * b + 4 * s * b
""", "that is a number of values"),
    Answer(1, "the attention scores forgotten", """
def block_bytes(config, batch_size, seq_len):
    s, b, h, f = seq_len, batch_size, config.hidden, config.intermediate
    return 4 * (8 * s * b * h + 2 * s * b * f + 4 * s * b)
""", "attention's softmax output is missing"),
    Answer(1, "a float", """
def block_bytes(config, batch_size, seq_len):
    s, b, h, a, f = seq_len, batch_size, config.hidden, config.heads, config.intermediate
    return 4.0 * (8 * s * b * h + 2 * s * b * f + a * s * s * b + 4 * s * b)
""", "an int like 1,581,056"),
    Answer(2, "the solution", """
def checkpoint_every_other(model):
    for i in range(0, len(model.layers), 2):
        model.layers[i] = checkpoint_wrapper(model.layers[i])
    return model
""", RIGHT),
    Answer(2, "torch.utils.checkpoint in a wrapper module of its own", """
from torch.utils.checkpoint import checkpoint
class Ckpt(nn.Module):
    def __init__(self, block):
        super().__init__()
        self._checkpoint_wrapped_module = block
    def forward(self, x):
        return checkpoint(self._checkpoint_wrapped_module, x, use_reentrant=False)
def checkpoint_every_other(model):
    for i in range(0, len(model.layers), 2):
        model.layers[i] = Ckpt(model.layers[i])
    return model
""", RIGHT),
    Answer(2, "blocks 0 and 2: right for the 4-block model only", """
def checkpoint_every_other(model):
    for i in (0, 2):
        model.layers[i] = checkpoint_wrapper(model.layers[i])
    return model
""", "layers.4 of a 5-block model keeps 148,480 bytes for backward; it should keep 8,192"),
    Answer(2, "stops one block early: the last block of an odd count is left", """
def checkpoint_every_other(model):
    for i in range(0, len(model.layers) - 1, 2):
        model.layers[i] = checkpoint_wrapper(model.layers[i])
    return model
""", "of a 5-block model"),
    Answer(2, "every block", """
def checkpoint_every_other(model):
    for i in range(len(model.layers)):
        model.layers[i] = checkpoint_wrapper(model.layers[i])
    return model
""", "layers.1 keeps 8,192 bytes for backward; it should keep 148,480"),
    Answer(2, "the odd blocks: off by one", """
def checkpoint_every_other(model):
    for i in range(1, len(model.layers), 2):
        model.layers[i] = checkpoint_wrapper(model.layers[i])
    return model
""", "layers.0 keeps 148,480 bytes for backward; it should keep 8,192"),
    Answer(2, "wraps, but never puts the wrapper back", """
def checkpoint_every_other(model):
    for layer in model.layers[::2]:
        layer = checkpoint_wrapper(layer)
    return model
""", "did you assign the wrapper back into model.layers?"),
    Answer(2, "the whole stack of blocks", """
def checkpoint_every_other(model):
    model.layers = checkpoint_wrapper(model.layers)
    return model
""", "Wrap the blocks themselves"),
    Answer(2, "forgets to return the model", """
def checkpoint_every_other(model):
    for i in range(0, len(model.layers), 2):
        model.layers[i] = checkpoint_wrapper(model.layers[i])
""", "it returned None"),
]
