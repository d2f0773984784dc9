"""Notebook 09, autograd through collectives."""

import math

import torch.distributed._functional_collectives as funcol

from distlab.exercises import nb09

from . import RIGHT, Answer

GRADERS = {
    1: (nb09.exercise_1, ["MyAllReduce"]),
    2: (nb09.exercise_2, ["AllReduceMax"]),
    3: (nb09.exercise_3, ["predicted_grads", "backward_with_loss_on_rank_0"]),
}

GIVEN = {"funcol": funcol, "math": math}

_MY_ALL_REDUCE = """
class MyAllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x.clone()
        dist.all_reduce(y)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        grad_x = grad_y.clone()
        dist.all_reduce(grad_x)
        return grad_x
"""

_MAX = """
class AllReduceMax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x.clone()
        dist.all_reduce(y, op=dist.ReduceOp.MAX)
        winner = (x == y).to(x.dtype)
        holders = winner.clone()
        dist.all_reduce(holders)
        ctx.save_for_backward(winner / holders)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        (share,) = ctx.saved_tensors
        total = grad_y.clone()
        dist.all_reduce(total)
        return total * share
"""

_BACKWARD = """
def backward_with_loss_on_rank_0(y):
    if dist.get_rank() == 0:
        y.sin().sum().backward()
    else:
        y.backward(torch.zeros_like(y))
"""

ANSWERS = [
    Answer(1, "the solution", _MY_ALL_REDUCE, RIGHT),
    Answer(1, "backward passes the gradient through unchanged", _MY_ALL_REDUCE.replace(
        "        dist.all_reduce(grad_x)\n", ""), "its own loss's gradient only"),
    Answer(1, "backward averages instead of summing", _MY_ALL_REDUCE.replace(
        "        return grad_x", "        return grad_x / dist.get_world_size()"),
        "exactly 1/3x the expected"),
    Answer(1, "forward all-reduces the caller's tensor in place", """
class MyAllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        dist.all_reduce(x)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad_y):
        grad_x = grad_y.clone()
        dist.all_reduce(grad_x)
        return grad_x
""", "x after the forward (all-reduce a copy"),
    Answer(1, "forward forgets the all-reduce", _MY_ALL_REDUCE.replace(
        "        dist.all_reduce(y)\n", ""), "rank 0's forward result"),
    Answer(1, "backward returns None", _MY_ALL_REDUCE.replace(
        "        return grad_x", "        dist.all_reduce(grad_x)"),
        "no gradient reached x"),
    Answer(2, "the solution", _MAX, RIGHT),
    Answer(2, "a tie gives every holder the whole gradient", _MAX.replace(
        "ctx.save_for_backward(winner / holders)", "ctx.save_for_backward(winner)"),
        "split it evenly between them"),
    Answer(2, "only this rank's upstream gradient", _MAX.replace(
        "        dist.all_reduce(total)\n", ""), "only this rank's own upstream gradient"),
    Answer(2, "the gradient everywhere, as plain all_reduce(MAX) would pass it", """
class AllReduceMax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x.clone()
        dist.all_reduce(y, op=dist.ReduceOp.MAX)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        return grad_y
""", "rank 0's x.grad should be"),
    Answer(2, "the winner found by argmax of its own input", """
class AllReduceMax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x.clone()
        dist.all_reduce(y, op=dist.ReduceOp.MAX)
        ctx.save_for_backward((x == x.max()).to(x.dtype))
        return y

    @staticmethod
    def backward(ctx, grad_y):
        (mine,) = ctx.saved_tensors
        total = grad_y.clone()
        dist.all_reduce(total)
        return total * mine
""", "x.grad should be"),
    Answer(3, "the solution", """
def predicted_grads():
    return [math.cos(3), math.cos(3)]
""" + _BACKWARD, RIGHT),
    Answer(3, "rank 1 skips the backward: a hang", """
def predicted_grads():
    return [math.cos(3), math.cos(3)]

def backward_with_loss_on_rank_0(y):
    if dist.get_rank() == 0:
        y.sin().sum().backward()
""", "every rank must run a backward"),
    Answer(3, "predicts 2 cos 3, the sum-of-losses value", """
def predicted_grads():
    return [2 * math.cos(3), 2 * math.cos(3)]
""" + _BACKWARD, "you predicted -1.98 for rank 0"),
    Answer(3, "predicts no gradient on rank 1", """
def predicted_grads():
    return [math.cos(3), 0.0]
""" + _BACKWARD, "you predicted 0 for rank 1"),
    Answer(3, "one number, not one per rank", """
def predicted_grads():
    return math.cos(3)
""" + _BACKWARD, "should return a list of 2 numbers"),
    Answer(3, "a tensor prediction", """
def predicted_grads():
    return [torch.full((5, 5), math.cos(3)), torch.full((5, 5), math.cos(3))]
""" + _BACKWARD, "predicted_grads()[0] should be a number"),
    Answer(3, "rank 1 runs a backward of its own loss too", """
def predicted_grads():
    return [math.cos(3), math.cos(3)]

def backward_with_loss_on_rank_0(y):
    y.sin().sum().backward()
""", "rank 1 ran a loss of its own"),
]
