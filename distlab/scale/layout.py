"""A layout: how a model is spread over ranks, checked before anything is built.

    Layout(dp=8, tp=8, pp=16, cp=1, seq_len=8192)    # Llama 3 405B's pre-training layout

Sizes multiply to the world size: ``replicate x dp x cp x tp x pp``; the mesh's dimensions are,
from outermost to innermost, ``pp``, ``replicate``, ``dp``, ``cp``, ``tp`` (tensor parallelism
innermost: inside a node, on NVLink), as torchtitan orders them. Expert parallelism borrows
``ep`` of the ``dp`` ranks (the ``dp`` dimension is then ``dp / ep`` x ``ep``).

Knows nothing about models beyond their sizes: `plans` builds, `simulate` measures.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._config import check_int
from ..calculators._text import CalculatorError, divisors, one_of
from ..calculators.memory_estimate import CHECKPOINTING
from ..calculators.models import stage_layers
from .pipeline import SCHEDULES

__all__ = ["CHECKPOINTING", "PRECISIONS", "Layout", "stage_layers"]

PRECISIONS = ("bf16-fsdp2", "fp32")
ZERO = {0: "DDP (replicated)", 3: "FSDP (ZeRO-3)"}


def _positive(value, name: str) -> int:
    return check_int(value, name, low=1, noun="a whole number", error=CalculatorError)


@dataclass(frozen=True)
class Layout:
    """How one training step is spread over ranks.

    Args:
        dp: data-parallel ranks that shard the model (FSDP; or replicate it, ``zero=0``).
        replicate: HSDP: replicas of the dp-sharded model (across nodes); 1 for none.
        tp: tensor-parallel ranks (Megatron's split of every layer, with sequence parallelism).
        pp: pipeline ranks (stages, ``virtual_stages`` each), stepped by PyTorch's ``schedule``
            with ``microbatches`` per step.
        cp: context-parallel ranks: each holds ``seq_len / cp`` tokens and all-gathers the
            others' keys and values (Llama 3's context parallelism).
        ep: expert-parallel ranks among the dp ranks (a mixture of experts only).
        zero: 3 (FSDP) or 0 (DDP: every rank holds everything; gradients all-reduced).
        reshard_after_forward: FSDP frees each unit's gathered parameters after its forward
            (True: the last block and the output layer excepted, as torchtitan does) or keeps
            them until backward (False: "ZeRO-2-like"); with pipelining always kept.
        checkpointing: "none"; "selective" (Megatron's: recompute attention's core; with flash
            attention that saves next to nothing); "op-selective" (torchtitan's kind: keep the
            outputs of matmuls, attention and collectives, recompute the rest); "full" (keep
            each layer's input only).
        micro_batch, seq_len: sequences per microbatch and tokens per sequence.
        microbatches: microbatches per step (pipeline); default ``pp``.
        schedule: the pipeline schedule, as ``torch.distributed.pipelining`` names it: "1F1B"
            (default), "GPipe", or "Interleaved1F1B" (with ``virtual_stages`` >= 2).
        virtual_stages: pipeline stages per pipeline rank (interleaving: rank r holds stages
            r, r + pp, ...); 1 without.
        accumulate: microbatches whose gradients add up before one optimizer step, without
            pipelining (gradient accumulation); FSDP reduce-scatters once, after the last
            (``set_requires_gradient_sync(False)`` before the others), unless
            ``sync_each_microbatch``.
        sync_each_microbatch: reduce-scatter after every accumulated microbatch.
        precision: "bf16-fsdp2" (FSDP2's MixedPrecisionPolicy: bf16 compute and all-gathers,
            fp32 gradient reduction and fp32 weights and Adam state) or "fp32".
        attention: "sdpa" (flash attention) or "written" (softmax of the scores kept).
        sequence_parallel: with tp > 1, norms and residuals sharded by sequence too.
        loss_parallel: with tp > 1, the logits stay sharded by vocabulary into the loss.

    Raises:
        CalculatorError (a ValueError): a size that is not a whole number >= 1; ``ep`` that does
            not divide ``dp``; ``zero=1`` (FSDP2 has no ZeRO-1: use 2 or 3); an unknown choice.
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
    accumulate: int = 1
    sync_each_microbatch: bool = False
    precision: str = "bf16-fsdp2"
    attention: str = "sdpa"
    sequence_parallel: bool = True
    loss_parallel: bool = True

    def __post_init__(self):
        for name in ("dp", "replicate", "tp", "pp", "cp", "ep", "micro_batch", "seq_len",
                     "accumulate", "virtual_stages"):
            _positive(getattr(self, name), name)
        if self.accumulate > 1 and self.pp > 1:
            raise CalculatorError(
                f"accumulate={self.accumulate} with pp={self.pp}: a pipeline's microbatches are "
                "its accumulation already; give microbatches= instead"
            )
        if self.microbatches is not None:
            _positive(self.microbatches, "microbatches")
        if self.zero in (1, 2):
            raise CalculatorError(
                f"zero={self.zero}: FSDP2 has no ZeRO-{self.zero} (parameters whole on every "
                "rank, the optimizer state sharded); lay out zero=3, with "
                "reshard_after_forward=False for FSDP's ZeRO-2-like mode, or zero=0. The memory "
                f"calculator models ZeRO-{self.zero}: calculators.memory_per_device(zero="
                f"{self.zero})"
            )
        if self.zero not in ZERO or isinstance(self.zero, bool):
            raise CalculatorError(f"zero must be one of {sorted(ZERO)}, got {self.zero!r}")
        if self.precision in ("bf16-mixed", "bf16-zero-paper", "bf16-fp32-grads"):
            raise CalculatorError(
                f"precision={self.precision!r} is a calculator's name for bf16 weights with an "
                "fp32 master copy elsewhere (2 + 2 + 12 or 2 + 4 + 12 bytes per parameter); "
                "FSDP2's MixedPrecisionPolicy keeps the fp32 shards as the master weights "
                "(4 + 4 + 8): precision=\"bf16-fsdp2\", the name the calculators give it too")
        for name, options in (("checkpointing", CHECKPOINTING), ("precision", PRECISIONS),
                              ("attention", ("sdpa", "written"))):
            if getattr(self, name) not in options:
                raise CalculatorError(f"{name} must be one of {one_of(options)}, got "
                                      f"{getattr(self, name)!r}")
        if self.schedule not in SCHEDULES:
            raise CalculatorError(f"schedule must be one of {one_of(SCHEDULES)}, got "
                                  f"{self.schedule!r}")
        if (self.virtual_stages > 1) != (self.schedule == "Interleaved1F1B"):
            raise CalculatorError(
                f"schedule={self.schedule!r} with virtual_stages={self.virtual_stages}: "
                "Interleaved1F1B runs 2 or more stages per pipeline rank, the others one")
        if self.virtual_stages > 1:  # torch's interleaved schedule runs its microbatches in
            # rounds of pp (ScheduleInterleaved1F1B.__init__): a whole number of rounds
            m = self.microbatches or self.pp
            rounds = max(1, m // self.pp)
            if m % rounds:
                near = sorted((n for n in range(max(1, m - self.pp), m + self.pp + 1)
                               if n % max(1, n // self.pp) == 0), key=lambda n: abs(n - m))
                raise CalculatorError(
                    f"microbatches={m}: torch's Interleaved1F1B runs them in {rounds} rounds "
                    f"(microbatches // pp={self.pp}) and needs as many in each; choose "
                    f"microbatches in {one_of(sorted(near[:4]))}")
        if self.dp % self.ep:
            raise CalculatorError(f"ep={self.ep} must divide dp={self.dp}: expert parallelism "
                                  f"borrows dp ranks; choose ep in {one_of(divisors(self.dp))}")
        if self.seq_len % self.cp:
            raise CalculatorError(f"seq_len={self.seq_len} does not split into cp={self.cp} "
                                  "equal parts")

    def memory(self, model, stage: int = 0):
        """The memory calculator asked about ``model`` on pipeline ``stage`` of this layout:
        `calculators.memory_per_device` with this layout's every knob (the one place the
        simulator's layout and the calculator's arguments meet)."""
        from ..calculators.memory_estimate import memory_per_device

        return memory_per_device(
            model, dp=self.dp, tp=self.tp, pp=self.pp, cp=self.cp, ep=self.ep, zero=self.zero,
            reshard_after_forward=self.reshard_after_forward, checkpointing=self.checkpointing,
            precision=self.precision, seq_len=self.seq_len, micro_batch=self.micro_batch,
            sequence_parallel=self.sequence_parallel, attention=self.attention, stage=stage,
            microbatches=self.accumulate if self.accumulate > 1 else self.microbatches,
            loss_parallel=self.loss_parallel, replicate=self.replicate,
            schedule=self.schedule, virtual_stages=self.virtual_stages,
            grad_sync="each microbatch" if self.sync_each_microbatch else "last microbatch")

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
            pipeline = (f"; {self.schedule}{chunks}, {self.microbatches or self.pp} "
                        "microbatches")
        return (f"{self.world_size} ranks: {dims}{pipeline}; {ZERO[self.zero]}; "
                f"{self.precision}; "
                f"{self.checkpointing} checkpointing; micro-batch {self.micro_batch} x "
                f"{self.seq_len} tokens{accumulate}")
