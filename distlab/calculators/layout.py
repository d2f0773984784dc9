"""A layout: how one training step is spread over ranks, with one set of defaults and one check.

    from distlab.calculators import Layout
    Layout(dp=8, tp=8, pp=16, seq_len=8192)    # Llama 3 405B's pre-training layout

The one description of a layout that every tool reads, as torchtitan's job config feeds its
``ParallelDims``: the memory formulas (`memory_per_device`), the step-time model (`step_time`),
the simulator (`distlab.scale.lay_out`, `simulate_rank`: ``scale.Layout`` is this class), the
widgets and the benches. Each of those also takes the knobs as keywords
(``memory_per_device("Llama-3 8B", dp=8)``): they build this Layout, with these defaults.

Sizes multiply to the world size: ``replicate x dp x cp x tp x pp``; the mesh's dimensions are,
from outermost to innermost, ``pp``, ``replicate``, ``dp``, ``cp``, ``tp`` (tensor parallelism
innermost: inside a node, on NVLink), as torchtitan orders them. Expert parallelism borrows
``ep`` of the ``dp`` ranks (the ``dp`` dimension is then ``dp / ep`` x ``ep``).

Asks of a model only what `Layout.check` needs (heads, layers, experts);
what each tool can run beyond the layout (the simulator runs FSDP2: ZeRO 0 or 3, "bf16-fsdp2"
or "fp32") the tool checks itself.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .._config import check_int
from ._text import CalculatorError, choice, divisors, one_of
from .activation_terms import IMPLEMENTATIONS, LOSSES
from .pipeline import SCHEDULES

#: `memory_estimate.memory_per_device`, which registers itself here when it is imported (the
#: package imports it before anyone can hold a Layout): the formulas read a Layout, so this
#: module must not import them back (one-way imports, tests/test_imports.py).
_MEMORY_PER_DEVICE: list = []

__all__ = ["ACTIVATION_BYTES", "ATTENTIONS", "CHECKPOINTING", "IMPLEMENTATIONS", "LOSSES",
           "PRECISIONS", "SCHEDULES", "ZERO", "Layout", "as_layout"]

#: Bytes per parameter of (parameter, gradient, Adam's optimizer state), as each kind of
#: training keeps them between steps:
#:   bf16-fsdp2       4 + 4 + 8    FSDP2's MixedPrecisionPolicy(bf16, reduce fp32), and torch's
#:                                 autocast under DDP: fp32 weights are the master weights;
#:                                 bf16 copies exist only while computing (counted in the peak)
#:   fp32             4 + 4 + 8    everything in fp32
#:   bf16-mixed       2 + 2 + 12   the ZeRO paper's (and DeepSpeed's): bf16 weights and
#:                                 gradients, an fp32 master copy in the optimizer with m and v
#:                                 (also named "bf16-zero-paper")
#:   bf16-fp32-grads  2 + 4 + 12   Megatron-LM's: gradients accumulated and reduced in fp32
PRECISIONS = {"fp32": (4, 4, 8), "bf16-mixed": (2, 2, 12), "bf16-zero-paper": (2, 2, 12),
              "bf16-fp32-grads": (2, 4, 12), "bf16-fsdp2": (4, 4, 8)}
#: Bytes of one activation value: bf16 compute for every mixed precision.
ACTIVATION_BYTES = {name: 4 if name == "fp32" else 2 for name in PRECISIONS}
#: Activation recomputation, five modes: "none"; "selective" (Megatron's: attention's core
#: recomputed); "op-selective" (torchtitan's op-level policy: every matmul's, attention's and
#: collective's output kept, the rest recomputed); "op-selective-alternate" (torchtitan's policy
#: of December 2024: every other matmul's output kept); "full" (each layer's input kept).
CHECKPOINTING = ("none", "selective", "op-selective", "op-selective-alternate", "full")
ATTENTIONS = ("sdpa", "written")
ZERO = {0: "no ZeRO (DDP)", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3 / FSDP"}
#: Keywords some tools used to take, and what a Layout calls them now.
_RENAMED = {"v": "virtual_stages", "accumulate": "microbatches",
            "grad_sync": "sync_each_microbatch (True for 'each microbatch')"}


def _positive(value, name: str) -> int:
    return check_int(value, name, low=1, noun="a whole number", error=CalculatorError)


@dataclass(frozen=True)
class Layout:
    """How one training step is spread over ranks (the module says who reads it).

    Args:
        dp: data-parallel ranks (``zero`` says whether they shard the model or replicate it).
        replicate: HSDP: replicas of the dp-sharded model (across nodes); 1 for none.
        tp: tensor-parallel ranks (Megatron's split of every layer).
        pp: pipeline ranks, each holding ``virtual_stages`` stages, stepped by PyTorch's
            ``schedule`` with ``microbatches`` per step.
        cp: context-parallel ranks: each holds ``seq_len / cp`` tokens and all-gathers the
            others' keys and values (Llama 3's context parallelism).
        ep: expert-parallel ranks among the dp ranks (a mixture of experts only).
        zero: the ZeRO stage, sharding over the dp x cp ranks that hold the same parameters:
            3 (FSDP: parameters, gradients and optimizer state; the default), 0 (DDP: every
            rank holds everything), or the calculators' 1 (the optimizer state) and 2 (and the
            gradients), which FSDP2 does not run.
        reshard_after_forward: FSDP frees each unit's gathered parameters after its forward
            (True: the last block and the output layer excepted, as torchtitan does) or keeps
            them until backward (False: "ZeRO-2-like"); with pipelining always kept.
        checkpointing: activation recomputation, one of `CHECKPOINTING`'s five modes.
        micro_batch, seq_len: sequences per microbatch and tokens per sequence.
        microbatches: microbatches per optimizer step (default ``pp``): with pp > 1 the
            pipeline's; with pp = 1 gradient accumulation (FSDP reduce-scatters once, after the
            last, unless ``sync_each_microbatch``).
        schedule: the pipeline schedule, as ``torch.distributed.pipelining`` names it: "1F1B"
            (default), "GPipe", or "Interleaved1F1B" (with ``virtual_stages`` >= 2).
        virtual_stages: pipeline stages per pipeline rank (interleaving: rank r holds stages
            r, r + pp, ...); 1 without.
        sync_each_microbatch: reduce-scatter gradients after every microbatch (False: after the
            last; the unsharded gradients accumulate meanwhile, as ``PipelineStage`` and
            ``set_requires_gradient_sync(False)`` run FSDP2).
        precision: bytes per parameter, one of `PRECISIONS`: "bf16-fsdp2" (default: FSDP2's
            MixedPrecisionPolicy, bf16 compute, fp32 master weights, gradients and Adam state:
            4 + 4 + 8), "fp32", "bf16-mixed" (the ZeRO paper's 2 + 2 + 12), "bf16-fp32-grads".
        attention: "sdpa" (flash attention) or "written" (softmax of the scores kept).
        sequence_parallel: with tp > 1, norms and residuals sharded by sequence too.
        loss_parallel: with tp > 1, the logits stay sharded by vocabulary into the loss.
        implementation: whose activations: "eager" (PyTorch eager, as torchtitan runs it) or
            "megatron" (Megatron-LM's); see `activation_terms`.
        loss: "upcast" (torchtitan's: logits upcast to fp32 into ``cross_entropy``) or "fused".

    Raises:
        CalculatorError (a `distlab.DistlabError` and a ValueError): a size that is not a whole
            number >= 1; an unknown choice; ``virtual_stages`` that does not fit ``schedule``;
            microbatches torch's Interleaved1F1B refuses; ``ep`` that does not divide ``dp``;
            ``seq_len`` that ``cp`` does not split. Each message says what to choose.
    """

    dp: int = 1
    replicate: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    zero: int = 3
    reshard_after_forward: bool = True
    checkpointing: str = "none"
    micro_batch: int = 1
    seq_len: int = 8192
    microbatches: int | None = None
    schedule: str = "1F1B"
    virtual_stages: int = 1
    sync_each_microbatch: bool = False
    precision: str = "bf16-fsdp2"
    attention: str = "sdpa"
    sequence_parallel: bool = True
    loss_parallel: bool = True
    implementation: str = "eager"
    loss: str = "upcast"

    def __post_init__(self):
        for name in ("dp", "replicate", "tp", "pp", "cp", "ep", "micro_batch", "seq_len",
                     "virtual_stages"):
            _positive(getattr(self, name), name)
        if self.microbatches is not None:
            _positive(self.microbatches, "microbatches")
        if self.zero not in ZERO or isinstance(self.zero, bool):
            raise CalculatorError(
                f"zero={self.zero!r} is not a ZeRO stage: choose 0 (none: DDP), 1 (shard the "
                "optimizer state), 2 (and the gradients) or 3 (and the parameters: FSDP)")
        for name, options in (("checkpointing", CHECKPOINTING), ("precision", PRECISIONS),
                              ("attention", ATTENTIONS), ("schedule", SCHEDULES),
                              ("implementation", IMPLEMENTATIONS), ("loss", LOSSES)):
            choice(getattr(self, name), name, options)
        self._check_pipeline()
        if self.dp % self.ep:
            raise CalculatorError(f"ep={self.ep} must divide dp={self.dp}: expert parallelism "
                                  f"borrows dp ranks; choose ep in {one_of(divisors(self.dp))}")
        if self.seq_len % self.cp:
            raise CalculatorError(
                f"seq_len={self.seq_len} does not split into cp={self.cp} equal parts: choose "
                f"cp in {one_of(divisors(self.seq_len)[:12])}, or a seq_len that is a multiple "
                f"of {self.cp}")

    def _check_pipeline(self) -> None:
        interleaved = self.schedule == "Interleaved1F1B"
        if interleaved and self.virtual_stages < 2:
            raise CalculatorError(
                f"schedule='Interleaved1F1B' with virtual_stages={self.virtual_stages}: "
                "Interleaved1F1B puts 2 or more stages on each pipeline rank: set "
                "virtual_stages=2 (or more), or schedule='1F1B' for one stage per rank")
        if not interleaved and self.virtual_stages > 1:
            raise CalculatorError(
                f"virtual_stages={self.virtual_stages} with schedule={self.schedule!r}, which "
                "puts one stage on each rank: set schedule='Interleaved1F1B', or "
                "virtual_stages=1")
        if interleaved:  # torch's interleaved schedule runs its microbatches in rounds of pp
            # (ScheduleInterleaved1F1B.__init__): a whole number of rounds
            m = self.microbatches or self.pp
            rounds = max(1, m // self.pp)
            if m % rounds:
                near = sorted((n for n in range(max(1, m - self.pp), m + self.pp + 1)
                               if n % max(1, n // self.pp) == 0), key=lambda n: abs(n - m))
                raise CalculatorError(
                    f"microbatches={m}: torch's Interleaved1F1B runs them in {rounds} rounds "
                    f"(microbatches // pp={self.pp}) and needs as many in each; choose "
                    f"microbatches in {one_of(sorted(near[:4]))}")

    def check(self, model) -> None:
        """Raise `CalculatorError` if ``model`` (a `models` object) cannot take this layout:
        ``tp`` that does not split its heads, key-value heads or MLP; ``ep`` for a dense model
        or not dividing its experts; ``cp`` > 1, ``tp`` > 1 or checkpointing for a model that is
        not a `Transformer`."""
        from .models import LinearStack, Transformer

        if self.cp > 1 and not isinstance(model, Transformer):
            raise CalculatorError(f"context parallelism splits a transformer's sequence: use "
                                  f"cp=1 for {model.name or 'a parameter count'}")
        if isinstance(model, Transformer):
            model.check_tp(self.tp)
        if self.ep > 1:
            experts = getattr(model, "experts", 1)
            if experts == 1:
                raise CalculatorError(
                    f"ep={self.ep}: {model.name or 'this model'} is dense (no experts), so "
                    "expert parallelism has nothing to share out: use ep=1, or a mixture of "
                    "experts such as 'Mixtral 8x7B'")
            if experts % self.ep:
                raise CalculatorError(
                    f"ep={self.ep} does not divide the {experts} experts of {model.name}: "
                    f"choose ep in {one_of(divisors(experts))}")
        if isinstance(model, LinearStack) and self.checkpointing != "none":
            raise CalculatorError(
                f"checkpointing is modelled for transformer layers; {model.name} stores its "
                "layers' inputs either way: use checkpointing='none'")

    @property
    def steps(self) -> int:
        """Microbatches per optimizer step (``microbatches``, default ``pp``)."""
        return self.microbatches or self.pp

    @property
    def accumulate(self) -> int:
        """Microbatches accumulated without a pipeline (1 with pp > 1: the pipeline's
        microbatches are its accumulation)."""
        return self.steps if self.pp == 1 else 1

    def memory(self, model, stage: int = 0):
        """`memory_per_device` of ``model`` on pipeline ``stage`` of this layout."""
        return _MEMORY_PER_DEVICE[0](model, self, stage=stage)

    def replace(self, **changes) -> Layout:
        """This layout with some knobs changed (checked again), e.g. ``layout.replace(zero=0)``."""
        return as_layout(self, changes)

    @property
    def world_size(self) -> int:
        return self.replicate * self.dp * self.cp * self.tp * self.pp

    @property
    def mesh_shape(self) -> dict[str, int]:
        """The mesh's dimensions, outermost first (``dp`` split into ``dp_mod_ep`` x ``ep``
        when there is expert parallelism)."""
        dims = {"pp": self.pp, "replicate": self.replicate}
        if self.ep > 1:
            dims |= {"dp_mod_ep": self.dp // self.ep, "ep": self.ep}
        else:
            dims["dp"] = self.dp
        return dims | {"cp": self.cp, "tp": self.tp}

    def text(self) -> str:
        dims = " x ".join(f"{k} {v}" for k, v in self.mesh_shape.items() if v > 1) or "1 rank"
        accumulate = ""
        if self.accumulate > 1:
            sync = "each" if self.sync_each_microbatch else "the last"
            accumulate = f" x {self.accumulate} accumulated (reduced after {sync})"
        pipeline = ""
        if self.pp > 1:
            chunks = f", {self.virtual_stages} stages each" if self.virtual_stages > 1 else ""
            pipeline = f"; {self.schedule}{chunks}, {self.steps} microbatches"
        return (f"{self.world_size} ranks: {dims}{pipeline}; {ZERO[self.zero]}; "
                f"{self.precision}; "
                f"{self.checkpointing} checkpointing; micro-batch {self.micro_batch} x "
                f"{self.seq_len} tokens{accumulate}")


FIELDS = tuple(f.name for f in dataclasses.fields(Layout))


def as_layout(layout, knobs: dict, where: str = "Layout") -> Layout:
    """``layout`` (a `Layout`, or None for the defaults) with ``knobs`` changed: how every tool
    that takes keywords builds its Layout. Raises `CalculatorError` for something that is not
    a Layout, or a knob a Layout does not have (saying what it is called now, if renamed)."""
    if layout is None:
        layout = Layout()
    elif not isinstance(layout, Layout):
        raise CalculatorError(f"{where}: layout must be a distlab Layout (Layout(dp=8, tp=8)), "
                              f"got {type(layout).__name__} {layout!r}")
    for name in knobs:
        if name not in FIELDS:
            hint = (f": a Layout calls it {_RENAMED[name]}" if name in _RENAMED else
                    f"; a Layout's knobs are {', '.join(FIELDS)}")
            raise CalculatorError(f"{where} has no argument {name!r}{hint}")
    return dataclasses.replace(layout, **knobs) if knobs else layout
