"""TrainingSession (numpy only): an artifact file -> train_step / run / evaluate, parameters, crash-safe
checkpoints, and export of the personalized inference model.

The session is the core: it owns the parameters and optimizer state and runs the step. What it feeds the step is
edgetrain.runtime.batches'; checkpoints and adapter files are edgetrain.runtime.checkpoints'; the export is
edgetrain.runtime.exporting's. What the rewrites of the model left in the artifact (re-batching, int8, LoRA, split
layers, ...) reaches the session as the record's sections (edgetrain.graph.sections), whose hooks it runs without
asking which kinds they are."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from edgetrain.core.errors import ArtifactError, FeedError, NonFiniteError
from edgetrain.core.interpreter import Interpreter
from edgetrain.core.mapped import release_pages
from edgetrain.graph.prefix import split_step
from edgetrain.graph.record import FLOAT32_MAX
from edgetrain.graph.sections import PreprocessingSection

from . import batches, checkpoints, exporting, steps
from .artifact import load_artifact
from .batches import BatchFeeder
from .feature_cache import DEFAULT_MAX_BYTES, StepCache
from .fused import FusedOptimizer, finite, fusable
from .running import ModelRunner
from .threads import apply_threads

if TYPE_CHECKING:  # loaders loads when a session meets an input pipeline, not with every session
    from loaders import InputPipeline


class TrainingSession:
    """Trains the model of an artifact (`.etrain`) on the device.

    The training step is a pure function of (data, target, lr, parameters, optimizer state); the session owns the
    parameters and state and binds each step's new values back. run() and evaluate() use inference semantics
    (BatchNorm with running statistics, no dropout), with the current parameters.

    The data given to train_step, evaluate and run is the model's input. Another float dtype (float64) is cast
    to the input's, and other integers to an integer input (int32 token ids), silently: nothing is lost that a
    user would notice. Integers for a float input are raw data: when the model declares an input pipeline that
    takes them (convert --scale 1/255: uint8 pixels, x / 255) it is applied to them, as preprocess() does and as
    the exported model does in its graph; otherwise they, and bools, are refused with a FeedError saying how to
    scale them, unless the session was made with allow_cast=True (or `allow_cast` was set since), which casts
    them as they are. One rule decides for every path: edgetrain.runtime.session.input_cast.
    """

    def __init__(
        self,
        path: str | os.PathLike | Any,
        *,
        verify: bool = True,
        fused: bool = True,
        threads: int | None = None,
        max_header_bytes: int | None = None,
        max_arena_bytes: int | None = None,
        allow_cast: bool = False,
    ):
        """path: an artifact file (`.etrain`), or a TrainingArtifact just converted (it is written to a temporary
        file of the session's, as the device would read it). max_header_bytes and max_arena_bytes raise the bounds
        an artifact is read within (container.MAX_HEADER_BYTES, plan.MAX_ARENA_BYTES: 64 MiB of header, a 4 GiB
        arena): see SECURITY.md. allow_cast=True feeds integer and bool batches to a float input cast as they
        are (0-255 stays 0.0-255.0), where the session would refuse them (see the class's docstring); it is the
        `allow_cast` attribute, which a Trainer's steps follow too."""
        self.allow_cast = bool(allow_cast)
        self.threads = apply_threads(threads)  # BLAS threads (the process's); None: left as they are
        self._tmp: tempfile.TemporaryDirectory | None = None
        if not isinstance(path, (str, os.PathLike)) and callable(getattr(path, "save", None)):
            self._tmp = tempfile.TemporaryDirectory(prefix="edgetrain-session-")
            saved = os.path.join(self._tmp.name, "artifact.etrain")
            path.save(saved)
            path = saved
        self.artifact = art = load_artifact(
            path, verify=verify, max_header_bytes=max_header_bytes, max_arena_bytes=max_arena_bytes
        )
        self.record = art.record
        self._io = io = art.io
        # With a fused optimizer (SGD, Adam, AdamW), the session runs the step without its update nodes, writes
        # the gradients into one flat buffer and updates every parameter in a few numpy calls; else it runs the
        # whole step graph. fused=False asks for the graph (the tests compare the two).
        self._fused = self._make_fused() if fused else None
        self._programs({"max_arena_bytes": max_arena_bytes})
        self._feeder = BatchFeeder(self.record)
        # the gradients a step may leave outside their views: not bound, or bound but computed by no node (a
        # constant); the others the program always writes into their views
        made = {o for n in self._step_program.graph.nodes for o in n.outputs}
        self._unbound = [(p, n) for p, n in self._grad_of.items() if n not in self._bind or n not in made]
        self._lr = self.record.optimizer.lr
        self.step = 0
        self._runner = ModelRunner(self.record)
        declared = self.record.section(PreprocessingSection)
        self._pipeline = None if declared is None else declared.pipeline
        tag = f"{art.program_id}:{'fused' if self._fused is not None else 'graph'}"
        self._cache = StepCache(self._step_program, list(io.data_inputs), self._split, tag)
        # the file's pages the checksum and the parameters' copies read: the session has its own copies now (the
        # frozen weights map back in as the step reads them)
        release_pages(art.tensors.values())

    def _programs(self, limit: dict) -> None:
        """The step program (the fused one, whose gradients land in the fused optimizer's flat buffer, else the
        whole step graph), the parameters and state the session owns, and the gradient bindings."""
        art, io, f = self.artifact, self._io, self.artifact.fused
        self._grad_of: dict[str, str] = {}
        self._bind: dict[str, np.ndarray] = {}
        if self._fused is not None:
            self._values: dict[str, np.ndarray] = self._fused.values()
            grads = self._fused.gradients()
            self._bind = {
                f.gradients[p]: grads[p] for p in io.parameters if f.gradients[p] in f.program.outputs
            }
            self._grad_of = {p: f.gradients[p] for p in io.parameters}
            program, plan = f.program, f.plan
        else:
            # Parameters and state are owned by the session: writable copies of the file's read-only maps.
            self._values = {k: np.array(v) for k, v in art.initial.items()}
            program, plan = art.program, art.plan
        # The frozen prefix's nodes compute each sample on its own (Interpreter(per_sample=)): the feature cache
        # keeps their results per sample, so a step with the cache and one without run the same kernels on them,
        # and the cache reaches as far as the prefix does. The split is kept for the cache.
        self._split = split_step(program, list(io.data_inputs))
        alone = set() if self._split[0] is None else {n.name for n in self._split[0].prefix.nodes}
        self._step_program = Interpreter(program, plan=plan, bind=self._bind, per_sample=alone, **limit)

    def _make_fused(self) -> FusedOptimizer | None:
        art = self.artifact
        if art.fused is None:
            return None
        params = {p: (tuple(art.initial[p].shape), art.initial[p].dtype) for p in art.io.parameters}
        if not fusable(self.record.optimizer, [d for _, d in params.values()]):
            return None
        # the update may use the gradient buffers as scratch when the step writes each of them (or the session
        # copies it there) before every update; a gradient the program does not compute keeps its zeros
        rewrites = all(art.fused.gradients[p] in art.fused.program.outputs for p in params)
        return FusedOptimizer(
            self.record.optimizer, params, art.fused.state_roles, art.initial, rewrites_gradients=rewrites
        )

    def _assign(self, name: str, value: np.ndarray) -> None:
        """Sets a parameter or state tensor: into the flat buffers when fused (their views must stay)."""
        if self._fused is not None:
            self._fused.load({name: value})
            self._values = self._fused.values()
        else:
            self._values[name] = np.array(value, dtype=self._values[name].dtype)

    @property
    def _lean_feeds(self) -> dict | None:
        return self._feeder.lean

    # ---- the input pipeline ------------------------------------------------------------------------------------
    @property
    def preprocessing(self) -> InputPipeline:
        """How raw data becomes the model's input (loaders.InputPipeline): declared at convert and stored in the
        artifact, or set on a session of an artifact that declares none (then saved in its checkpoints).
        `edgetrain train`/`eval`, the phone app and the fleet's clients apply it to their data; export_onnx writes it
        into the exported model."""
        if self._pipeline is None:
            self._pipeline = batches.undeclared_pipeline(self.record)
        return self._pipeline

    @preprocessing.setter
    def preprocessing(self, pipeline: InputPipeline | Mapping[str, Any]) -> None:
        self._pipeline = batches.replaced_pipeline(self.preprocessing, pipeline, self.artifact.path)

    def preprocess(self, x: Any, *, source: str = "the samples") -> np.ndarray:
        """Raw samples [N, ...] (camera bytes, 0-255 pixels) -> the model's input, by the input pipeline, checked
        against it (a DataError says what contradicts it). Without a declared pipeline the samples are only fitted
        to the model's input shape and dtype; integers or bools for a float input are then refused unless
        allow_cast (see the class's docstring)."""
        return batches.preprocess(
            self.record, self.preprocessing, x, allow_cast=self.allow_cast, source=source
        )

    # ---- the interface -----------------------------------------------------------------------------------------
    @property
    def lr(self) -> float:
        return self._lr

    @lr.setter
    def lr(self, value: float) -> None:
        value = float(value)
        if not np.isfinite(value) or not 0 <= value < FLOAT32_MAX:  # the step computes in float32
            raise FeedError(
                f"the learning rate must be a finite number >= 0 (that float32 holds), not {value}"
            )
        self._lr = value

    @property
    def num_classes(self) -> int | None:
        """The model's classes when it trains with a class loss (labels must lie in [0, num_classes)), else None."""
        return self._feeder.n_classes

    @property
    def data_inputs(self) -> list[str]:
        """The model's data inputs, by name (what train_step, evaluate and run take)."""
        return list(self._io.data_inputs)

    @property
    def batch_size(self) -> int | None:
        """The batch the training program was built for (None when it takes any)."""
        return self.record.batch

    @property
    def parameter_names(self) -> list[str]:
        return list(self._io.parameters)

    def parameters(self) -> dict[str, np.ndarray]:
        """The trainable parameters, by ONNX initializer name (copies)."""
        return {k: self._values[k].copy() for k in self._io.parameters}

    def set_parameters(self, params: Mapping[str, np.ndarray]) -> None:
        """Replaces some or all trainable parameters (e.g. after a federated round); names, shapes and dtypes must
        match. Optimizer state is kept."""
        for name, value in params.items():
            if name not in self._io.parameters:
                raise FeedError(
                    f"'{name}' is not a trainable parameter of this artifact; they are: "
                    f"{', '.join(self._io.parameters[:20])}"
                )
            cur = self._values[name]
            value = np.asarray(value)
            if value.shape != cur.shape:
                raise FeedError(f"parameter '{name}' has shape {list(cur.shape)}, got {list(value.shape)}")
            if value.dtype.kind != "f":
                raise FeedError(f"parameter '{name}' must be floating point, got {value.dtype}")
            if not finite(value):
                raise FeedError(f"parameter '{name}' holds non-finite values (NaN or infinity); refused")
        for name, value in params.items():
            self._assign(name, np.asarray(value, dtype=self._values[name].dtype))

    # ---- steps -------------------------------------------------------------------------------------------------
    def _feeds(self, x: Any, y: Any) -> dict[str, np.ndarray]:
        feeds = self._data(x, fixed_batch=True)
        feeds[self._io.target] = self._feeder.target(y)
        feeds[self._io.lr] = np.asarray(self._lr, np.float32)
        feeds.update(self._values)
        return feeds

    def _data(self, x: Any, *, fixed_batch: bool) -> dict[str, np.ndarray]:
        return self._feeder.data(
            x,
            fixed_batch=fixed_batch,
            allow_cast=self.allow_cast,
            pipeline=self._pipeline,
            preprocess=self.preprocess,
        )

    def train_step(self, x: Any, y: Any) -> float:
        """One optimizer step on a batch; returns the loss (before the update).

        A step commits nothing it cannot stand behind: when the loss or any updated parameter or optimizer state is
        not finite, it raises NonFiniteError and the session keeps the parameters and state it had before."""
        feeds = self._feeds(x, y)
        out = self._cache.run(feeds)
        results = dict(zip(self._step_program.graph.outputs, out))
        loss = steps.loss_value(results[self._io.loss], self._io.loss)
        if self._fused is not None:
            pairs = self._unbound if self._lean_feeds is not None else self._grad_of.items()
            steps.fused_update(self._fused, results, pairs, self._lr, loss, self._refuse)
            self._values = self._fused.values()
        else:
            self._values.update(steps.graph_updates(results, self._io, loss, self._refuse))
        self.step += 1
        return loss

    def _refuse(self, loss: float, bad: list[str]) -> NonFiniteError:
        return steps.non_finite(self.step + 1, self._lr, loss, bad or list(self._io.updates))

    # ---- the feature cache ---------------------------------------------------------------------------------------
    def enable_feature_cache(self, max_bytes: int | None = None, *, rows: Any = None) -> dict[str, Any]:
        """Caches the frozen prefix's results per sample, when the step has one worth caching: in head-only or
        partial fine-tuning, a sample seen before then skips the frozen part of the network. Exact: the steps are
        bit for bit those without the cache (a changed sample has another key; the frozen part never changes).
        Returns feature_cache_info(): "enabled" and, when off, the "reason". max_bytes bounds the memory (default
        64 MiB); samples past it are computed each time. Use it when each sample's data is the same every epoch:
        with random augmentation every sample is new and the cache only costs memory. rows: the `feature_rows`
        of an earlier session of the same artifact, taken over (ignored when they belong to another program)."""
        budget = DEFAULT_MAX_BYTES if max_bytes is None else int(max_bytes)
        if budget < 0:
            raise FeedError(f"max_bytes must be >= 0, not {max_bytes}")
        self._cache.enable(budget, self._bind, rows)
        return self.feature_cache_info()

    @property
    def feature_rows(self) -> Any:
        """The cached rows (an opaque object) for enable_feature_cache(rows=) of a later session of this artifact,
        or None."""
        return None if self._cache.cache is None else self._cache.cache.rows

    def disable_feature_cache(self, reason: str = "disabled") -> None:
        """Drops the cache and its memory; steps run the whole program again."""
        self._cache.disable(reason)

    def feature_cache_info(self) -> dict[str, Any]:
        """{"enabled": bool, "reason": why not (when off)} plus, when on: the boundary values, the nodes the
        prefix holds, the samples and bytes cached, hits and misses."""
        return self._cache.info()

    # ---- inference ---------------------------------------------------------------------------------------------
    def evaluate(self, x: Any, y: Any) -> tuple[float, np.ndarray]:
        """(loss, model output) on a batch, without updating anything."""
        return self._runner.evaluate(self._feeds(x, y))

    def run(self, x: Any) -> np.ndarray:
        """The model's (first) output with the current parameters; any batch size. An int8 model runs as it
        exports: its integer graph, the trained weights requantized (onnxruntime gives the same to the bit)."""
        data = self._data(x, fixed_batch=False)
        return self._runner.run(data, {p: self._values[p] for p in self._io.parameters})

    # ---- state -------------------------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Copies of the parameters and optimizer state, with the step count and lr; restore() puts them back."""
        return {"values": {k: v.copy() for k, v in self._values.items()}, "step": self.step, "lr": self._lr}

    def restore(self, snapshot: Mapping[str, Any]) -> None:
        """Puts back what snapshot() took."""
        for k, v in snapshot["values"].items():
            self._assign(k, v)
        self.step, self._lr = int(snapshot["step"]), float(snapshot["lr"])

    def save_checkpoint(self, path: str | os.PathLike, user_state: Mapping[str, Any] | None = None) -> int:
        """Writes parameters, optimizer state, step, lr and user_state (JSON values, e.g. a data loader's
        position) atomically: a kill at any instant leaves the old checkpoint or the new one, whole."""
        declared = self._pipeline is not None and self._pipeline.declared
        return checkpoints.write_checkpoint(
            path,
            self._values,
            program_id=self.artifact.program_id,
            artifact=self.artifact.path,
            step=self.step,
            lr=self._lr,
            user_state=user_state,
            preprocessing=self._pipeline.to_json() if declared else None,
        )

    def load_checkpoint(self, path: str | os.PathLike) -> dict[str, Any]:
        """Restores a checkpoint of this model; returns its user_state. Every field is checked before anything is
        restored: a bad file is an ArtifactError naming it and the field, and the session is left as it was."""
        found, tensors = checkpoints.read_checkpoint(path)
        if found.program_id != self.artifact.program_id:
            raise ArtifactError(
                f"checkpoint '{path}' belongs to another model (it was saved by a session of "
                f"'{found.artifact or '?'}', a different training program), so it cannot be loaded into "
                f"this session of '{os.path.basename(self.artifact.path)}'"
            )
        checkpoints.check_values(path, tensors, self._values)
        pipeline = found.pipeline(path)
        if pipeline is not None and pipeline != self.preprocessing and self.preprocessing.declared:
            raise ArtifactError(
                f"checkpoint '{path}' was trained on data fed by another input pipeline ({pipeline.describe()}) than "
                f"the one '{self.artifact.path}' declares ({self.preprocessing.describe()})"
            )
        for k in list(self._values):
            self._assign(k, tensors[k])
        self.step, self._lr = found.step, float(found.lr)
        if pipeline is not None:
            self._pipeline = pipeline
        return dict(found.user_state)

    # ---- export ------------------------------------------------------------------------------------------------
    def export_onnx(
        self,
        path: str | os.PathLike,
        *,
        preprocessing: bool = True,
        requantize: bool = False,
        float_model: bool = False,
        adapters: str = "merged",
        **options: Any,
    ) -> None:
        """Writes the inference model with the trained parameters (nothing of the training graph); onnxruntime
        runs it. A declared input pipeline goes in as graph nodes before the model (preprocessing=False leaves it
        out: the app applies it, as the model's metadata_props "edgetrain.preprocessing" says), so onnxruntime on
        raw data gives the session's answer. An int8 model is written in the form it came in (QDQ, QOperator or
        dynamic), its trained weights requantized with the model's scales (requantize=True fits new scales to the
        trained weights, per channel where the model's are); float_model=True writes the float model instead
        (no quantization, the trained float weights). A model with LoRA adapters is written merged (adapters="merged":
        the original graph with W + (alpha / rank) A B, a drop-in replacement) or for onnxruntime's multi-LoRA serving
        (adapters="serving": the adapters are graph inputs whose default initializers are this session's; see
        export_adapters for the per-user files). options: those of other rewrites' sections
        (edgetrain.graph.sections.Section.OPTIONS). Needs the onnx package."""
        options = {"requantize": requantize, "float_model": float_model, "adapters": adapters, **options}
        exporting.export_model(
            self.record,
            {p: self._values[p] for p in self._io.parameters},
            path,
            source=self.artifact.path,
            step=self.step,
            pipeline=self._pipeline,
            preprocessing=preprocessing,
            options=options,
        )

    def export_adapters(self, path: str | os.PathLike, *, format: str = "edgetrain") -> int:
        """Writes the trained adapters alone, atomically; returns the file's bytes. format="edgetrain": a container
        (kind "adapters") with each A and B, the LoRA settings and the base model's digest, for checkpoints, rollback
        and the fleet (load_adapters reads it back); format="onnxruntime": onnxruntime's adapter format, which
        onnxruntime.LoraAdapter loads to serve this user on the model export_onnx(adapters="serving") writes (needs
        onnxruntime)."""
        return exporting.write_adapters(
            self.record, self._values, path, source=self.artifact.path, step=self.step, format=format
        )

    def load_adapters(self, path: str | os.PathLike) -> None:
        """Puts in the adapters export_adapters wrote (of an artifact of the same program)."""
        for k, v in exporting.read_adapter_values(self.record, path, source=self.artifact.path).items():
            self._assign(k, v)
