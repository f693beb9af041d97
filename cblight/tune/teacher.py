"""Whose weights the boosted teacher ``f_alpha`` is made of (paper appendix "From coherence boosting to
coherence tuning"; docs/tuning.md, "Teachers").

``frozen`` boosts a frozen copy of the initial model (a fixed target, the default), ``live`` the current
model (the paper; its full-context expert is the student's own forward, detached), ``ema`` an exponential
moving average of the student, ``θ_ema ← d θ_ema + (1 - d) θ`` after every optimizer step.

``Teacher`` is the teacher of ``cblight.tune.coherence_tuning.CoherenceTuning``: it holds the copies (and the
initial model that validation compares with), updates the EMA, moves the copies to the device and carries
the EMA in checkpoints. The copies are not registered submodules of the LightningModule, so they stay out
of DDP, the optimizer and the state dict.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from cblight.tune.loss import TuningConfigError, finite_number

EMA_KEY = "cblight_ema_teacher"
TEACHERS = ("frozen", "live", "ema")

__all__ = ["EMA_KEY", "TEACHERS", "Teacher", "TeacherOptions", "ema_update", "frozen_copy"]


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
    """

    kind: str = "frozen"
    ema_decay: float = 0.9

    def __post_init__(self) -> None:
        if self.kind not in TEACHERS:
            raise TuningConfigError(f"teacher.kind must be one of {', '.join(TEACHERS)}, got {self.kind!r}")
        if not finite_number(self.ema_decay) or not 0.0 < self.ema_decay < 1.0:
            raise TuningConfigError(f"teacher.ema_decay must be in (0, 1), got {self.ema_decay!r}")


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` in eval mode with no gradient."""
    return copy.deepcopy(model).eval().requires_grad_(False)


@torch.no_grad()
def ema_update(teacher: torch.nn.Module, student: torch.nn.Module, decay: float) -> None:
    """``θ_teacher ← decay · θ_teacher + (1 - decay) · θ_student`` for every trainable parameter of the
    student (the two models have the same structure; frozen parameters are equal and stay so)."""
    pairs = [
        (t, s) for t, s in zip(teacher.parameters(), student.parameters(), strict=True) if s.requires_grad
    ]
    if pairs:
        targets = [t for t, _ in pairs]
        torch._foreach_lerp_(targets, [s.detach().to(t.dtype) for t, s in pairs], 1.0 - decay)


class Teacher:
    """The teacher's model copies: ``model`` is the one boosted (``None`` for the live teacher, which is the
    student itself), ``initial`` a frozen copy of the initial model (the frozen teacher's, or kept for
    validation's ``kl_initial``; ``None`` otherwise).

    Args:
        options: the teacher's kind and EMA decay.
        student: the model being tuned (with its LoRA adapters, if any): the EMA starts from it.
        initial: ``frozen_copy`` of the model taken before any adapters were added; required by the
            frozen teacher.
    """

    def __init__(self, options: TeacherOptions, student: torch.nn.Module, initial: torch.nn.Module | None):
        self.options = options
        self.initial = initial
        self.model: torch.nn.Module | None = None
        if options.kind == "frozen":
            if initial is None:
                raise ValueError("the frozen teacher needs the initial model's copy")
            self.model = initial
        elif options.kind == "ema":
            self.model = frozen_copy(student)

    def to(self, device: torch.device) -> None:
        """Move the copies to ``device`` (Lightning moves only registered submodules)."""
        for model in (self.initial, self.model):
            if model is not None:
                model.to(device)

    def update(self, student: torch.nn.Module) -> None:
        """After every optimizer step: the EMA follows the student (the other teachers do nothing)."""
        if self.options.kind == "ema":
            assert self.model is not None
            ema_update(self.model, student, self.options.ema_decay)

    def state_dict(self, student: torch.nn.Module) -> dict[str, Any] | None:
        """The EMA's weights of the student's trainable parameters, for ``checkpoint[EMA_KEY]`` (``None``
        for the frozen and live teachers, which training does not change)."""
        if self.options.kind != "ema" or self.model is None:
            return None
        trainable = {n for n, p in student.named_parameters() if p.requires_grad}
        return {n: p.detach().cpu().clone() for n, p in self.model.named_parameters() if n in trainable}

    def load_state_dict(self, ema: dict[str, Any] | None) -> None:
        """Restore the EMA's weights from a checkpoint's ``EMA_KEY`` entry."""
        if ema is None or self.model is None:
            return
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, value in ema.items():
                params[name].copy_(value)
