"""Whose weights the boosted teacher ``f_alpha`` is made of (paper appendix "From coherence boosting to
coherence tuning"; docs/tuning.md, "Teachers").

``frozen`` boosts a frozen copy of the initial model (a fixed target, the default), ``live`` the current
model (the paper; its full-context expert is the student's own forward, detached), ``ema`` an exponential
moving average of the student, ``θ_ema ← d θ_ema + (1 - d) θ`` after every optimizer step.

The live teacher compounds its boost and runs away (docs/tuning.md, "Why the live teacher drifts"). It has
two brakes: ``refresh_every`` boosts a snapshot of the student taken every ``N`` steps instead of the
current weights, and ``trust_region`` adds ``beta · KL(f_θ || f_0)`` to the loss at every position in scope,
the divergence from the initial model's full-context distribution that RLHF penalises
(``cblight.tune.loss.tuning_kl_terms``). Measured on a real model (docs/tuning.md, "Real-model evidence"),
the trust region keeps the model whole and the refresh only slows the runaway.

``Teacher`` is the teacher of ``cblight.tune.coherence_tuning.CoherenceTuning``: it holds the copies (and the
initial model that validation compares with), updates the EMA, moves the copies to the device and carries
the EMA in checkpoints. The copies are not registered submodules of the LightningModule, so they stay out
of DDP, the optimizer and the state dict. Under FSDP2 every copy is sharded like the student (built from
the checkpoint by ``cblight.sharding``), the EMA is updated shard by shard, and its shards travel in the
distributed checkpoint beside the student's. With LoRA the initial model is no copy at all: the student
with its adapters disabled (``cblight.tune.lora.AdaptersDisabled``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from cblight.errors import ConfigError
from cblight.option_types import NonNegativeFloat, OpenUnitInterval, PositiveInt, check_fields

#: The checkpoint key of the EMA teacher's weights.
EMA_KEY = "cblight_ema_teacher"

__all__ = ["EMA_KEY", "Teacher", "TeacherOptions", "frozen_copy"]


@dataclass(frozen=True)
class TeacherOptions:
    """Which model is boosted into the teacher.

    Args:
        kind: ``frozen`` (a frozen copy of the initial model boosted: a fixed target, the default),
            ``live`` (the paper: the current model boosted, which overshoots when run long; see
            docs/tuning.md) or ``ema`` (an exponential moving average of the student, boosted); ``frozen``
            and ``ema`` cost one extra full forward per step and a copy of the weights.
        ema_decay: decay ``d`` of the EMA teacher, ``θ_ema ← d θ_ema + (1 - d) θ`` after every optimizer
            step, in (0, 1).
        refresh_every: with ``kind: live``, boost a snapshot of the student taken every this many optimizer
            steps (``None`` or 1: the current weights, the paper); costs a copy of the weights.
        trust_region: ``beta >= 0``; the loss adds ``beta · KL(f_θ || f_0)`` per position, the divergence of
            the student from the initial model (RLHF's KL penalty); 0: off. Keeps a frozen copy of the
            initial model (one more full forward per step, except with the frozen teacher, which is it).
    """

    kind: Literal["frozen", "live", "ema"] = "frozen"
    ema_decay: OpenUnitInterval = 0.9
    refresh_every: PositiveInt | None = None
    trust_region: NonNegativeFloat = 0.0

    def __post_init__(self) -> None:
        check_fields(self)
        if self.refresh_every is not None and self.kind != "live":
            raise ConfigError(
                f"teacher.refresh_every applies to the live teacher, not kind {self.kind!r}; "
                "set teacher.kind: live or remove it"
            )

    @property
    def snapshot(self) -> bool:
        """The live teacher boosts a periodic snapshot rather than the current weights."""
        return self.kind == "live" and (self.refresh_every or 1) > 1


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of a model: the frozen teacher, or the initial model ``f_0`` of the trust region.

    Args:
        model: the model to copy (left as it is).

    Returns:
        A deep copy of ``model`` in eval mode, every parameter with ``requires_grad`` off.
    """
    return copy.deepcopy(model).eval().requires_grad_(False)


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """This process's shard of a DTensor (FSDP2), or the tensor itself."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class Teacher:
    """The teacher's model copies: ``model`` is the one boosted (``None`` for the live teacher, which is the
    student itself; a snapshot of it with ``refresh_every``), ``initial`` a frozen copy of the initial model
    (the frozen teacher's, or kept for the trust region, validation's ``kl_initial`` and the collapse
    guard's reference; ``None`` otherwise).

    Args:
        options: the teacher's kind and EMA decay.
        initial: the initial model: ``frozen_copy`` of the model taken before any adapters were added, its
            sharded build under FSDP2, or with LoRA the student with its adapters disabled; required by the
            frozen teacher.
        copy_student: makes the EMA's (or the snapshot's) starting copy of the student, with its LoRA
            adapters if any (``frozen_copy(student)``; under FSDP2 a sharded build of the initial weights).
    """

    def __init__(
        self, options: TeacherOptions, initial: Any | None, copy_student: Callable[[], torch.nn.Module]
    ):
        self.options = options
        self.initial = initial
        self.model = initial if options.kind == "frozen" else None  # the live teacher: the student itself
        if options.kind == "ema" or options.snapshot:
            self.model = copy_student()

    def to(self, device: torch.device) -> None:
        """Move the copies to a device (Lightning moves only registered submodules).

        Args:
            device: where the student is.
        """
        for model in (self.initial, self.model):
            if model is not None:
                model.to(device)

    @torch.no_grad()
    def update(self, student: torch.nn.Module, step: int) -> None:
        """Follow the student after an optimizer step, for every trainable parameter (the two models have the
        same structure; frozen parameters are equal and stay so): the EMA moves,
        ``θ_ema ← d θ_ema + (1 - d) θ``; a snapshot is retaken, ``θ_teacher ← θ``, every ``refresh_every``
        steps; the other teachers do nothing.

        Args:
            student: the model being tuned, just stepped.
            step: the optimizer step just taken, counted from 1.
        """
        ema = self.options.kind == "ema"
        if not (ema or (self.options.snapshot and step % int(self.options.refresh_every or 1) == 0)):
            return
        pairs = [  # under FSDP2 each process updates its own shards
            (local_shard(t), local_shard(s))
            for t, s in zip(self.model.parameters(), student.parameters(), strict=True)
            if s.requires_grad
        ]
        if pairs and ema:
            sources = [s.detach().to(t.dtype) for t, s in pairs]
            torch._foreach_lerp_([t for t, _ in pairs], sources, 1.0 - self.options.ema_decay)
        elif pairs:
            torch._foreach_copy_([t for t, _ in pairs], [s.detach() for _, s in pairs])

    def state_dict(self, student: torch.nn.Module) -> dict[str, Any] | None:
        """The teacher's weights that training changes, for ``checkpoint[EMA_KEY]``.

        Args:
            student: the model being tuned; its trainable parameters name the weights kept.

        Returns:
            The EMA's (or the live teacher's snapshot's) weights of those parameters, on the CPU, by name;
            ``None`` for the frozen and live teachers, which training does not change.
        """
        weights = self._trained(student)
        return {n: p.detach().cpu().clone() for n, p in weights.items()} if weights else None

    def load_state_dict(self, ema: dict[str, Any] | None) -> None:
        """Restore the EMA's (or the snapshot's) weights from a checkpoint.

        Args:
            ema: the checkpoint's ``EMA_KEY`` entry (``state_dict``'s result); ``None`` restores nothing.
        """
        if ema is not None and self.model is not None:
            self.model.load_state_dict(ema, strict=False)  # the trainable parameters only

    def _trained(self, student: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The EMA's (or the snapshot's) parameters that training changes, by name: the student's trainable
        ones (none for the frozen and live teachers)."""
        if not (self.options.kind == "ema" or self.options.snapshot) or self.model is None:
            return {}
        trainable = {n for n, p in student.named_parameters() if p.requires_grad}
        return {n: p for n, p in self.model.named_parameters() if n in trainable}

    def sharded_state(self, student: torch.nn.Module) -> dict[str, torch.Tensor]:
        """Under FSDP2: the EMA's (or snapshot's) shards of the student's trainable parameters, which
        Lightning writes with the checkpoint's ``state_dict`` as a distributed checkpoint (each process its
        shards).

        Args:
            student: the model being tuned; its trainable parameters name the weights kept.

        Returns:
            The shards, detached, by ``EMA_KEY.<name>``; empty for the frozen and live teachers.
        """
        return {f"{EMA_KEY}.{n}": p.detach() for n, p in self._trained(student).items()}

    def load_sharded_state(self, student: torch.nn.Module, path: str | Path) -> None:
        """Under FSDP2: read the EMA's shards (``sharded_state``) back from a distributed checkpoint, each
        process its own, in place.

        Args:
            student: the model being tuned; its trainable parameters name the weights read.
            path: the distributed checkpoint's directory.
        """
        import torch.distributed.checkpoint as dcp

        entries = self.sharded_state(student)
        if entries:
            dcp.load({"state_dict": entries}, checkpoint_id=str(path))  # in place, into the EMA's own shards
