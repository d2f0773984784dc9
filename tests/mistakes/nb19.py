"""Notebook 19, mixed precision."""

from distlab.exercises import nb19

from . import RIGHT, Answer

GRADERS = {
    1: (nb19.exercise_1, ["global_grad_norm", "cluster"]),
    2: (nb19.exercise_2, ["scaled_step"]),
    3: (nb19.exercise_3, ["fsdp_bytes", "cluster"]),
}

CLUSTER = {"world_size": 2, "threads": 1}

ANSWERS = [
    Answer(1, "the solution", """
def global_grad_norm(model):
    squares = torch.zeros((), dtype=torch.float64)
    for p in model.parameters():
        if p.grad is not None:
            squares += p.grad.to_local().double().square().sum()
    dist.all_reduce(squares)
    return squares.sqrt().item()
""", RIGHT),
    Answer(1, "torch's own get_total_norm: DTensor combines the shards in one all_reduce", """
def global_grad_norm(model):
    return torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]).full_tensor().item()
""", RIGHT),
    Answer(1, "this rank's shards only: no collective", """
import math
def global_grad_norm(model):
    return math.sqrt(sum(float(p.grad.to_local().square().sum()) for p in model.parameters()))
""", "the norm of this rank's shards only"),
    Answer(1, "all-reduces the ranks' norms instead of their squares", """
def global_grad_norm(model):
    norm = torch.stack([p.grad.to_local().norm() for p in model.parameters()]).norm()
    dist.all_reduce(norm)
    return norm.item()
""", "norms do not add, their squares do"),
    Answer(1, "forgets the square root", """
def global_grad_norm(model):
    squares = sum(p.grad.to_local().square().sum() for p in model.parameters())
    dist.all_reduce(squares)
    return squares.item()
""", "take its square root"),
    Answer(1, "averages the squares over the ranks", """
def global_grad_norm(model):
    squares = sum(p.grad.to_local().square().sum() for p in model.parameters())
    dist.all_reduce(squares, op=dist.ReduceOp.AVG)
    return squares.sqrt().item()
""", "the squares must be summed, not averaged"),
    Answer(1, "gathers every gradient with full_tensor()", """
def global_grad_norm(model):
    return torch.cat([p.grad.full_tensor().flatten() for p in model.parameters()]).norm().item()
""", "gathering gradients moves all of them"),
    Answer(1, "one all_reduce per parameter", """
def global_grad_norm(model):
    total = 0.0
    for p in model.parameters():
        s = p.grad.to_local().square().sum()
        dist.all_reduce(s)
        total += s.item()
    return total ** 0.5
""", "ran 15 all_reduces"),
    Answer(1, "returns the tensor", """
def global_grad_norm(model):
    squares = sum(p.grad.to_local().square().sum() for p in model.parameters())
    dist.all_reduce(squares)
    return squares.sqrt()
""", "should return a Python float"),
    Answer(1, "squares the gradients in place", """
def global_grad_norm(model):
    squares = torch.zeros(())
    for p in model.parameters():
        squares += p.grad.to_local().square_().sum()
    dist.all_reduce(squares)
    return squares.sqrt().item()
""", "changed rank 0's gradients"),
    Answer(1, "all_reduce on rank 0 only: a hang", """
def global_grad_norm(model):
    squares = sum(p.grad.to_local().square().sum() for p in model.parameters())
    if dist.get_rank() == 0:
        dist.all_reduce(squares)
    return squares.sqrt().item()
""", "hangs"),
    Answer(1, "the number from an earlier ✗ message, with a dummy all_reduce", """
def global_grad_norm(model):
    dist.all_reduce(torch.zeros(()))
    return 1.302515960615287
""", "rank 0's norm should be"),
    Answer(1, "only the last parameter's gradient", """
def global_grad_norm(model):
    last = list(model.parameters())[-1].grad.to_local().double().square().sum()
    dist.all_reduce(last)
    return last.sqrt().item()
""", "(one process, the whole gradient)"),
    Answer(1, "right, in float64, leaving the default dtype float64 on the ranks", """
def global_grad_norm(model):
    torch.set_default_dtype(torch.float64)
    squares = torch.zeros(())
    for p in model.parameters():
        squares += p.grad.to_local().square().sum()
    dist.all_reduce(squares)
    return squares.sqrt().item()
""", RIGHT),
    Answer(2, "the solution", """
def scaled_step(model, optimizer, loss, scale):
    (loss * scale).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not all(g.isfinite().all() for g in grads):
        return scale / 2
    for g in grads:
        g /= scale
    optimizer.step()
    return scale
""", RIGHT),
    Answer(2, "never skips: steps on inf gradients", """
def scaled_step(model, optimizer, loss, scale):
    (loss * scale).backward()
    for p in model.parameters():
        p.grad /= scale
    optimizer.step()
    return scale
""", "step 0 overflowed (gradients not finite at scale 2^24): the optimizer step must be skipped"),
    Answer(2, "checks the loss instead of the gradients", """
def scaled_step(model, optimizer, loss, scale):
    scaled = loss * scale
    scaled.backward()
    if not torch.isfinite(scaled):
        return scale / 2
    for p in model.parameters():
        p.grad /= scale
    optimizer.step()
    return scale
""", "the loss times the scale is finite in fp32"),
    Answer(2, "skips, but keeps the scale", """
def scaled_step(model, optimizer, loss, scale):
    (loss * scale).backward()
    if all(p.grad.isfinite().all() for p in model.parameters()):
        for p in model.parameters():
            p.grad /= scale
        optimizer.step()
    return scale
""", "the scale for the next step should be 2^23 (halved after an overflow); got 2^24"),
    Answer(2, "forgets to unscale before the step", """
def scaled_step(model, optimizer, loss, scale):
    (loss * scale).backward()
    if not all(p.grad.isfinite().all() for p in model.parameters()):
        return scale / 2
    optimizer.step()
    return scale
""", "divide every gradient by the scale"),
    Answer(2, "halves after every step, good or not", """
def scaled_step(model, optimizer, loss, scale):
    (loss * scale).backward()
    if all(p.grad.isfinite().all() for p in model.parameters()):
        for p in model.parameters():
            p.grad /= scale
        optimizer.step()
    return scale / 2
""", "(kept after a good step); got 2^18"),
    Answer(2, "returns nothing", """
def scaled_step(model, optimizer, loss, scale):
    (loss * scale).backward()
    if all(p.grad.isfinite().all() for p in model.parameters()):
        for p in model.parameters():
            p.grad /= scale
        optimizer.step()
""", "should return the next scale as a number"),
    Answer(2, "GradScaler instead of scaling by hand", """
_scalers = {}
def scaled_step(model, optimizer, loss, scale):
    scaler = _scalers.setdefault(id(optimizer), torch.amp.GradScaler(
        "cpu", init_scale=scale, growth_interval=10**6))
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return scaler.get_scale()
""", "used torch.amp.GradScaler"),
    Answer(2, "looks at the last parameter's gradient only", """
def scaled_step(model, optimizer, loss, scale):
    (loss * scale).backward()
    if not list(model.parameters())[-1].grad.isfinite().all():
        return scale / 2
    for p in model.parameters():
        p.grad /= scale
    optimizer.step()
    return scale
""", "the optimizer step must be skipped"),
    Answer(2, "checks the matrices' gradients only (LayerNorm weights and biases never)", """
def scaled_step(model, optimizer, loss, scale):
    (loss * scale).backward()
    if not all(p.grad.isfinite().all() for p in model.parameters() if p.ndim == 2):
        return scale / 2
    for p in model.parameters():
        p.grad /= scale
    optimizer.step()
    return scale
""", "(a vector: a LayerNorm's) holds"),
    Answer(2, "right, written with torch.stack of per-gradient flags", """
def scaled_step(model, optimizer, loss, scale):
    (loss * scale).backward()
    params = [p for p in model.parameters() if p.grad is not None]
    if not torch.stack([torch.isfinite(p.grad).all() for p in params]).all():
        return 0.5 * scale
    torch._foreach_div_([p.grad for p in params], scale)
    optimizer.step()
    return scale
""", RIGHT),
    Answer(2, "looks for inf only: a nan gradient steps", """
def scaled_step(model, optimizer, loss, scale):
    (loss * scale).backward()
    if any(p.grad.isinf().any() for p in model.parameters()):
        return scale / 2
    for p in model.parameters():
        p.grad /= scale
    optimizer.step()
    return scale
""", "Check every gradient with isfinite()"),
    Answer(2, "the default dtype float64 in the kernel, left behind", """
def scaled_step(model, optimizer, loss, scale):
    torch.set_default_dtype(torch.float64)
    (loss * scale).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not all(g.isfinite().all() for g in grads):
        return scale / 2
    for g in grads:
        g /= scale
    optimizer.step()
    return scale
""", RIGHT),
    Answer(3, "the solution", """
def fsdp_bytes(n, param_dtype, reduce_dtype):
    return 4 / n, 4 / n, 8 / n
""", RIGHT),
    Answer(3, "the same, as exact fractions", """
from fractions import Fraction
def fsdp_bytes(n, param_dtype, reduce_dtype):
    return Fraction(4, n), Fraction(4, n), Fraction(8, n)
""", RIGHT),
    Answer(3, "the ZeRO paper's 2 + 2 + 12 for bf16", """
def fsdp_bytes(n, param_dtype, reduce_dtype):
    if param_dtype is None:
        return 4 / n, 4 / n, 8 / n
    return 2 / n, 2 / n, 12 / n
""", "a rank holds params 2 bytes per parameter (measured); fsdp_bytes(2, torch.bfloat16, "
         "torch.float32) says 1"),
    Answer(3, "forgets to divide by the ranks", """
def fsdp_bytes(n, param_dtype, reduce_dtype):
    return 4, 4, 8
""", "with no policy on 2 ranks, a rank holds params 2 bytes per parameter"),
    Answer(3, "gradients kept in the reduce dtype", """
def fsdp_bytes(n, param_dtype, reduce_dtype):
    grads = 2 / n if (reduce_dtype or param_dtype) == torch.bfloat16 else 4 / n
    return 4 / n, grads, 8 / n
""", "with bf16, reduce_dtype=None on 2 ranks, a rank holds grads 2 bytes per parameter"),
    Answer(3, "a list instead of a tuple", """
def fsdp_bytes(n, param_dtype, reduce_dtype):
    return [4 / n, 4 / n, 8 / n]
""", "should return a tuple of 3 numbers"),
    Answer(3, "bytes per rank instead of per parameter", """
def fsdp_bytes(n, param_dtype, reduce_dtype):
    psi = 17_088
    return 4 * psi / n, 4 * psi / n, 8 * psi / n
""", "that is per rank, not per parameter?"),
    Answer(3, "a formula right for 1 and 2 ranks only", """
def fsdp_bytes(n, param_dtype, reduce_dtype):
    return (3 - n) * 2, (3 - n) * 2, (3 - n) * 4
""", "on 3 ranks, a rank holds params 1.33333 bytes per parameter"),
    Answer(3, "integer division: 4 // n (right for n = 1, 2 and 4 only)", """
def fsdp_bytes(n, param_dtype, reduce_dtype):
    return 4 // n, 4 // n, 8 // n
""", "on 3 ranks, a rank holds params 1.33333 bytes per parameter (measured); fsdp_bytes(3, "
         "None, None) says 1"),
    Answer(3, "the cases the check tried, from its ✗ messages", """
SEEN = {(2, None, None): (2, 2, 4), (2, torch.bfloat16, torch.float32): (2, 2, 4),
        (2, torch.bfloat16, None): (2, 2, 4), (1, None, None): (4, 4, 8),
        (1, torch.bfloat16, torch.float32): (4, 4, 8), (1, torch.bfloat16, None): (4, 4, 8)}
def fsdp_bytes(n, param_dtype, reduce_dtype):
    return SEEN.get((n, param_dtype, reduce_dtype), (4, 4, 8))
""", "bytes per parameter (measured)"),
]
