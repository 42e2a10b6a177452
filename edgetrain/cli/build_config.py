"""The typed configurations of the build-side commands convert, check and export: the loss, the optimizer, what
trains, memory, LoRA and the declared input pipeline, as frozen dataclasses built from the parsed arguments in
one place and checked there (a UsageError naming the option). `check --memory-budget` weighs the training step of
a default loss with its own optimizer options: the same OptimizerConfig that convert reads. This module needs
numpy and loaders alone; edgetrain.cli.build makes the derive side's loss, optimizer and adapters from them."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from edgetrain.core.errors import UsageError
from loaders import InputPipeline

from .names import DEFAULT_LR


@dataclass(frozen=True)
class LossConfig:
    """--loss and its options (each of which applies to some losses only)."""

    loss: str = "cross-entropy"
    label_smoothing: float | None = None
    class_axis: int | str | None = None  # None: 1; "auto": read from the model
    ignore_index: int | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LossConfig:
        cfg = cls(args.loss, args.label_smoothing, args.class_axis, args.ignore_index)
        classes = ("cross-entropy", "next-token")
        for option, value, applies in (
            ("--label-smoothing", cfg.label_smoothing, classes),
            ("--ignore-index", cfg.ignore_index, classes),
            ("--class-axis", cfg.class_axis, ("cross-entropy",)),
        ):
            if value is not None and cfg.loss not in applies:
                raise UsageError(f"{option} applies to --loss {' and '.join(applies)} only")
        return cfg


@dataclass(frozen=True)
class OptimizerConfig:
    """--optimizer and its settings; None: the optimizer's default (lr DEFAULT_LR's, momentum 0.9, weight decay 0,
    AdamW's 0.01)."""

    optimizer: str = "sgd"
    lr: float | None = None
    momentum: float | None = None
    nesterov: bool = False
    weight_decay: float | None = None
    clip_grad_norm: float | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> OptimizerConfig:
        """convert's options, or check's (--optimizer and --weight-decay: the rest keep their defaults)."""
        cfg = cls(
            args.optimizer,
            getattr(args, "lr", None),
            getattr(args, "momentum", None),
            bool(getattr(args, "nesterov", False)),
            args.weight_decay,
            getattr(args, "clip_grad_norm", None),
        )
        if cfg.optimizer != "sgd":
            for option, value in (("--momentum", cfg.momentum), ("--nesterov", cfg.nesterov or None)):
                if value is not None:
                    raise UsageError(
                        f"{option} applies to --optimizer sgd only (Adam and AdamW have betas instead)"
                    )
        return cfg

    @property
    def learning_rate(self) -> float:
        return DEFAULT_LR[self.optimizer] if self.lr is None else self.lr


@dataclass(frozen=True)
class LoraConfig:
    """--lora-rank R (None: no adapters), --lora-alpha (None: 2R), --lora-targets."""

    rank: int | None = None
    alpha: float | None = None
    targets: tuple[str, ...] | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LoraConfig:
        targets = getattr(args, "lora_targets", None)
        cfg = cls(args.lora_rank, args.lora_alpha, None if targets is None else tuple(targets))
        if cfg.rank is None and (cfg.alpha is not None or cfg.targets):
            raise UsageError("--lora-alpha and --lora-targets need --lora-rank R")
        return cfg


@dataclass(frozen=True)
class PipelineConfig:
    """The input pipeline convert declares (all None: the model's own metadata, else none)."""

    scale: str | None = None
    normalize: str | None = None
    layout: str | None = None
    input_range: str | None = None
    resize: tuple[int, int] | None = None
    crop: tuple[int, int] | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> PipelineConfig:
        cfg = cls(args.scale, args.normalize, args.layout, args.input_range, args.resize, args.crop)
        cfg.pipeline()
        return cfg

    def pipeline(self) -> InputPipeline | None:
        """The InputPipeline to declare, or None (a UsageError says what of the options it cannot read)."""
        if all(v is None for v in vars(self).values()):
            return None
        try:
            return InputPipeline.from_options(
                scale=self.scale,
                normalize=self.normalize,
                layout=self.layout,
                input_range=self.input_range,
                size=self.resize,
                crop=self.crop,
            )
        except ValueError as e:
            raise UsageError(str(e)) from None


@dataclass(frozen=True)
class ConvertConfig:
    """`edgetrain convert` (and convert-inference-model): the model, the step's loss and optimizer, what trains,
    the batch and memory, LoRA, the declared input pipeline, and the files it writes."""

    model: str
    output: str | None = None  # None: the model's name with .etrain
    loss: LossConfig = field(default_factory=LossConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    trainable: tuple[str, ...] | None = None  # None: every parameter
    parameters: str | None = None  # a parameter manifest
    untie: bool | tuple[str, ...] = False  # True: every tie; names: those
    batch_size: int | None = None  # None: 32, or the model's fixed batch when it cannot move
    model_output: str | None = None
    memory_budget: str | None = None
    recompute: str = "none"
    lora: LoraConfig = field(default_factory=LoraConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    emit_onnx: str | None = None
    debug: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ConvertConfig:
        untie = False if args.untie is None else (tuple(args.untie) or True)  # --untie alone: every tie
        return cls(
            model=args.model,
            output=args.output,
            loss=LossConfig.from_args(args),
            optimizer=OptimizerConfig.from_args(args),
            trainable=None if args.trainable is None else tuple(args.trainable),
            parameters=args.parameters,
            untie=untie,
            batch_size=args.batch_size,
            model_output=args.model_output,
            memory_budget=args.memory_budget,
            recompute=args.recompute,
            pipeline=PipelineConfig.from_args(args),
            lora=LoraConfig.from_args(args),
            emit_onnx=args.emit_onnx,
            debug=bool(getattr(args, "debug", False)),
        )


@dataclass(frozen=True)
class CheckConfig:
    """`edgetrain check`: the model's trainability at a batch, the op list, or the ways to train within a
    --memory-budget with an optimizer and at most the --trainable parameters."""

    model: str | None
    ops: bool = False
    batch_size: int | None = None  # None: 1, or 32 for --memory-budget
    memory_budget: str | None = None
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    trainable: tuple[str, ...] | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> CheckConfig:
        trainable = None if args.trainable is None else tuple(args.trainable)
        optimizer = OptimizerConfig.from_args(args)
        return cls(args.model, bool(args.ops), args.batch_size, args.memory_budget, optimizer, trainable)


@dataclass(frozen=True)
class ExportConfig:
    """`edgetrain export`: the artifact and the weights (a checkpoint, else its own), the ONNX file, whether the
    input pipeline goes into it, an int8 model's scales or float form, LoRA adapters merged or served, and the
    adapters' own file."""

    artifact: str
    output: str
    checkpoint: str | None = None
    check: bool = True
    preprocessing: bool = True
    requantize: bool = False
    float_model: bool = False
    adapters: str = "merged"
    adapter_file: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ExportConfig:
        return cls(
            artifact=args.artifact,
            output=args.output,
            checkpoint=args.checkpoint,
            check=not args.no_check,
            preprocessing=not args.no_preprocessing_in_export,
            requantize=bool(args.requantize),
            float_model=bool(args.float_model),
            adapters=args.adapters,
            adapter_file=args.adapter_file,
        )
