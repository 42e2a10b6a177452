"""Learning-rate schedules in closed form (numpy-free): ILRSchedule and ConstantLR, StepLR, CosineLR, WarmupLR;
schedule_from_config reads one back from its config() (a checkpoint, a history file, a command-line option)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from edgetrain.core.errors import ConfigError


class ILRSchedule:
    """lr_at(step, base_lr): the learning rate of optimizer step `step` (0-based), in closed form."""

    def lr_at(self, step: int, base_lr: float) -> float:  # pragma: no cover - interface
        raise NotImplementedError

    def config(self) -> dict[str, Any]:
        return {"type": type(self).__name__}


class ConstantLR(ILRSchedule):
    """base_lr at every step."""

    def lr_at(self, step: int, base_lr: float) -> float:
        return float(base_lr)


class StepLR(ILRSchedule):
    """base_lr * gamma ** (step // step_size), as torch.optim.lr_scheduler.StepLR stepped once per batch."""

    def __init__(self, step_size: int, gamma: float = 0.1):
        if int(step_size) != step_size or step_size < 1:
            raise ConfigError(f"StepLR step_size must be a positive integer, got {step_size!r}")
        self.step_size, self.gamma = int(step_size), float(gamma)

    def lr_at(self, step: int, base_lr: float) -> float:
        return float(base_lr) * self.gamma ** (int(step) // self.step_size)

    def config(self) -> dict[str, Any]:
        return {"type": "StepLR", "step_size": self.step_size, "gamma": self.gamma}


class CosineLR(ILRSchedule):
    """min_lr + (base_lr - min_lr) * (1 + cos(pi * t / T)) / 2 with t = min(step, T) (torch's closed form of
    CosineAnnealingLR, held at min_lr after T steps)."""

    def __init__(self, total_steps: int, min_lr: float = 0.0):
        if int(total_steps) != total_steps or total_steps < 1:
            raise ConfigError(f"CosineLR total_steps must be a positive integer, got {total_steps!r}")
        self.total_steps, self.min_lr = int(total_steps), float(min_lr)

    def lr_at(self, step: int, base_lr: float) -> float:
        t = min(int(step), self.total_steps)
        return (
            self.min_lr + (float(base_lr) - self.min_lr) * (1 + math.cos(math.pi * t / self.total_steps)) / 2
        )

    def config(self) -> dict[str, Any]:
        return {"type": "CosineLR", "total_steps": self.total_steps, "min_lr": self.min_lr}


class WarmupLR(ILRSchedule):
    """Linear warm-up from 0: step / warmup_steps * schedule.lr_at(step) for step < warmup_steps, then the wrapped
    schedule (which counts steps from 0 at the start of training, warm-up included)."""

    def __init__(self, schedule: ILRSchedule | None, warmup_steps: int):
        if int(warmup_steps) != warmup_steps or warmup_steps < 0:
            raise ConfigError(f"WarmupLR warmup_steps must be an integer >= 0, got {warmup_steps!r}")
        self.schedule = schedule if schedule is not None else ConstantLR()
        self.warmup_steps = int(warmup_steps)

    def lr_at(self, step: int, base_lr: float) -> float:
        inner = self.schedule.lr_at(step, base_lr)
        if step < self.warmup_steps:
            return inner * int(step) / self.warmup_steps
        return inner

    def config(self) -> dict[str, Any]:
        return {"type": "WarmupLR", "warmup_steps": self.warmup_steps, "schedule": self.schedule.config()}


_SCHEDULES = {"ConstantLR": ConstantLR, "StepLR": StepLR, "CosineLR": CosineLR, "WarmupLR": WarmupLR}


def schedule_from_config(cfg: Mapping[str, Any]) -> ILRSchedule:
    """The schedule of a config() dict (e.g. read back from a history file or a CLI option)."""
    cfg = dict(cfg)
    kind = cfg.pop("type", None)
    if kind not in _SCHEDULES:
        raise ConfigError(f"unknown schedule type {kind!r}; known: {', '.join(_SCHEDULES)}")
    if kind == "WarmupLR":
        cfg["schedule"] = schedule_from_config(cfg["schedule"])
    return _SCHEDULES[kind](**cfg)
