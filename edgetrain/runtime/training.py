"""TrainingSession (numpy only): an artifact file -> train_step / run / evaluate, parameters, crash-safe
checkpoints, and export of the personalized inference model."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from edgetrain.core import fastpaths
from edgetrain.core.container import read_container, write_container
from edgetrain.core.declared import short
from edgetrain.core.errors import (
    ArtifactError,
    ConfigError,
    ExecutionError,
    FeedError,
    NonFiniteError,
    UnsupportedError,
)
from edgetrain.core.interpreter import Interpreter, check_feeds
from edgetrain.core.mapped import release_pages
from edgetrain.graph.passes import make_static, prune
from edgetrain.graph.prefix import split_step
from edgetrain.graph.rebatch import apply_batch_plan, fixed_batch

from .artifact import load_artifact
from .feature_cache import DEFAULT_MAX_BYTES, FeatureCache
from .fused import FusedOptimizer, finite, fusable, usable
from .session import input_cast
from .threads import apply_threads

if TYPE_CHECKING:  # loaders loads when a session meets an input pipeline, not with every session
    from loaders import InputPipeline

CLASS_LOSSES = ("CrossEntropyLoss", "NextTokenLoss")  # losses whose targets are class labels


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
        limit = {"max_arena_bytes": max_arena_bytes}
        io = art.io
        self._io = io
        # With a fused optimizer (SGD, Adam, AdamW), the session runs the step without its update nodes, writes
        # the gradients into one flat buffer and updates every parameter in a few numpy calls; else it runs the
        # whole step graph. fused=False asks for the graph (the tests compare the two).
        self._fused = self._make_fused(art) if fused else None
        self._programs(art, limit)
        self._lean_feeds = self._fixed_inputs() if fastpaths.enabled("lean_step") else None
        # the gradients a step may leave outside their views: not bound, or bound but computed by no node (a
        # constant); the others the program always writes into their views
        made = {o for n in self._step_program.graph.nodes for o in n.outputs}
        self._unbound = [
            (p, name)
            for p, name in getattr(self, "_grad_of", {}).items()
            if name not in self._bind or name not in made
        ]
        self._lr = float(art.header["optimizer"].get("lr", 0.0))
        self.step = 0
        self._eval_program: Interpreter | None = None
        self._run_programs: dict[tuple, Interpreter] = {}
        self._target_info = art.program.values[io["target"]]
        self._class_axis: tuple[int, list] = (1, [])  # (axis, output shape) of a cross-entropy's classes
        self._n_classes = self._classes()
        self._pipeline = self._declared_pipeline() if "preprocessing" in art.header else None
        self._data_graph = None
        self._cache = None  # the frozen prefix's feature cache, when enabled
        self._cache_reason = "not enabled"
        self._cache_args: dict[
            str, Any
        ] = {}  # FeatureCache's settings, for a prefix cut back (see _checked_cache)
        # the file's pages the checksum and the parameters' copies read: the session has its own copies now (the
        # frozen weights map back in as the step reads them)
        release_pages(art.tensors.values())

    def _programs(self, art, limit: dict) -> None:
        """The step program (the fused one, whose gradients land in the fused optimizer's flat buffer, else the
        whole step graph), the parameters and state the session owns, and the gradient bindings."""
        io = self._io
        if self._fused is not None:
            self._values: dict[str, np.ndarray] = self._fused.values()
            f = art.fused
            grads = self._fused.gradients()
            bind = {
                f["gradients"][p]: grads[p]
                for p in io["parameters"]
                if f["gradients"][p] in f["program"].outputs
            }
            alone = self._frozen_nodes(f["program"])
            self._step_program = Interpreter(
                f["program"], plan=f["plan"], bind=bind, per_sample=alone, **limit
            )
            self._bind = bind
            self._grad_of = {p: f["gradients"][p] for p in io["parameters"]}
        else:
            alone = self._frozen_nodes(art.program)
            self._step_program = Interpreter(art.program, plan=art.plan, per_sample=alone, **limit)
            self._bind: dict[str, np.ndarray] = {}
            # Parameters and state are owned by the session: writable copies of the file's read-only maps.
            self._values = {k: np.array(v) for k, v in art.initial.items()}

    def _frozen_nodes(self, program) -> set[str]:
        """The frozen prefix's nodes, which compute each sample on its own (Interpreter(per_sample=)): the
        feature cache keeps their results per sample, so a step with the cache and one without run the same
        kernels on them, and the cache reaches as far as the prefix does. The split is kept for the cache."""
        self._split = split_step(program, self._io["data_inputs"])
        split = self._split[0]
        return set() if split is None else {n.name for n in split.prefix.nodes}

    def _fixed_inputs(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]] | None:
        """(fastpaths "lean_step") each data input's dtype and static shape, for the per-step check that passes a
        batch at once when it has them, as check_feeds would (which runs, to name what is wrong, when it has
        not); None when a shape is not static."""
        specs = {}
        for name in self._io["data_inputs"]:
            info = self.artifact.program.values[name]
            if not info.is_static:
                return None
            specs[name] = (np.dtype(info.dtype), tuple(info.shape))
        return specs

    def _make_fused(self, art):
        if art.fused is None:
            return None
        params = {p: (tuple(art.initial[p].shape), art.initial[p].dtype) for p in art.io["parameters"]}
        if not fusable(art.header["optimizer"], [d for _, d in params.values()]):
            return None
        # the update may use the gradient buffers as scratch when the step writes each of them (or the session
        # copies it there) before every update; a gradient the program does not compute keeps its zeros
        outs = set(art.fused["program"].outputs)
        rewrites = all(art.fused["gradients"][p] in outs for p in params)
        return FusedOptimizer(
            art.header["optimizer"],
            params,
            art.fused["state_roles"],
            art.initial,
            rewrites_gradients=rewrites,
        )

    def _assign(self, name: str, value: np.ndarray) -> None:
        """Sets a parameter or state tensor: into the flat buffers when fused (their views must stay)."""
        if self._fused is not None:
            self._fused.load({name: value})
            self._values = self._fused.values()
        else:
            self._values[name] = np.array(value, dtype=self._values[name].dtype)

    def _declared_pipeline(self) -> InputPipeline:
        """The artifact's input pipeline (declared at convert), else an undeclared one for the model's input."""
        from loaders import (  # start-up: a session of a model without one loads no loaders
            ConfigError,
            InputPipeline,
        )

        art = self.artifact
        spec = art.header.get("preprocessing")
        names = self._io["data_inputs"]
        dtype = np.dtype(art.program.values[names[0]].dtype).name if len(names) == 1 else "float32"
        if spec is None:
            return InputPipeline(dtype=dtype)
        try:
            pipeline = InputPipeline.from_json(spec, source=f"artifact '{art.path}'")
        except ConfigError as e:
            raise ArtifactError(f"{e}; rebuild it with `edgetrain convert`") from None
        if pipeline.dtype != dtype:
            raise ArtifactError(
                f"artifact '{art.path}': its input pipeline makes {pipeline.dtype} values, but the model's input "
                f"takes {dtype}; rebuild it with `edgetrain convert`"
            )
        return pipeline

    @property
    def preprocessing(self) -> InputPipeline:
        """How raw data becomes the model's input (loaders.InputPipeline): declared at convert and stored in the
        artifact, or set on a session of an artifact that declares none (then saved in its checkpoints).
        `edgetrain train`/`eval`, the phone app and the fleet's clients apply it to their data; export_onnx writes it
        into the exported model."""
        if self._pipeline is None:
            self._pipeline = self._declared_pipeline()
        return self._pipeline

    @preprocessing.setter
    def preprocessing(self, pipeline: InputPipeline | Mapping[str, Any]) -> None:
        own = self.preprocessing
        if not isinstance(pipeline, type(own)):
            pipeline = type(own).from_json(pipeline, source="preprocessing")
        if pipeline.dtype != own.dtype:
            raise FeedError(
                f"the input pipeline makes {pipeline.dtype} values, but the model's input takes {own.dtype}"
            )
        if own.declared and pipeline != own:
            raise FeedError(
                f"'{self.artifact.path}' declares its input pipeline ({own.describe()}), set when it "
                f"was converted; another ({pipeline.describe()}) would feed the model other values than it was "
                f"converted for: convert again with the preprocessing options you want"
            )
        self._pipeline = pipeline

    def preprocess(self, x: Any, *, source: str = "the samples") -> np.ndarray:
        """Raw samples [N, ...] (camera bytes, 0-255 pixels) -> the model's input, by the input pipeline, checked
        against it (a DataError says what contradicts it). Without a declared pipeline the samples are only fitted
        to the model's input shape and dtype; integers or bools for a float input are then refused unless
        allow_cast (see the class's docstring)."""
        from loaders import adapt_samples  # start-up: loaded by the sessions that meet raw data
        from loaders.pipeline import array_facts  # start-up: as above

        pipeline = self.preprocessing
        x = np.asarray(x)
        names = self._io["data_inputs"]
        if len(names) != 1:
            raise FeedError(
                f"preprocess takes one-input models; this one has {len(names)} ({', '.join(names)})"
            )
        want = tuple(int(d) for d in self.artifact.program.values[names[0]].shape[1:])
        if x.ndim < 1:
            raise FeedError(f"{source}: a batch [N, ...] is needed, got a scalar")
        input_cast(names[0], x.dtype, pipeline.dtype, allow_cast=self.allow_cast, pipeline=pipeline, values=x)
        adapter = adapt_samples(x.shape[1:], want, layout=pipeline.layout, source=source)
        pipeline.check(array_facts(x, source))
        return pipeline.preprocess(adapter)(x, np.zeros(len(x)))[0]

    # ---- the interface -----------------------------------------------------------------------------------------
    @property
    def lr(self) -> float:
        return self._lr

    @lr.setter
    def lr(self, value: float) -> None:
        value = float(value)
        if not np.isfinite(value) or value < 0:
            raise FeedError(f"the learning rate must be a finite number >= 0, not {value}")
        self._lr = value

    @property
    def num_classes(self) -> int | None:
        """The model's classes when it trains with CrossEntropyLoss (labels must lie in [0, num_classes)), else
        None."""
        return self._n_classes

    @property
    def parameter_names(self) -> list[str]:
        return list(self._io["parameters"])

    def parameters(self) -> dict[str, np.ndarray]:
        """The trainable parameters, by ONNX initializer name (copies)."""
        return {k: self._values[k].copy() for k in self._io["parameters"]}

    def set_parameters(self, params: Mapping[str, np.ndarray]) -> None:
        """Replaces some or all trainable parameters (e.g. after a federated round); names, shapes and dtypes must
        match. Optimizer state is kept."""
        for name, value in params.items():
            if name not in self._io["parameters"]:
                raise FeedError(
                    f"'{name}' is not a trainable parameter of this artifact; they are: "
                    f"{', '.join(self._io['parameters'][:20])}"
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

    def train_step(self, x: Any, y: Any) -> float:
        """One optimizer step on a batch; returns the loss (before the update).

        A step commits nothing it cannot stand behind: when the loss or any updated parameter or optimizer state is
        not finite, it raises NonFiniteError and the session keeps the parameters and state it had before."""
        feeds = self._feeds(x, y)
        out = self._run_step(feeds)
        results = dict(zip(self._step_program.graph.outputs, out))
        loss = _scalar(results[self._io["loss"]], self._io["loss"])
        if self._fused is not None:
            return self._fused_step(loss, results)
        updates = self._io["updates"]
        params = set(self._io["parameters"])
        bad = [] if math.isfinite(loss) else list(updates)  # a non-finite loss poisons every update
        bad = bad or [
            n
            for n, new in updates.items()
            if not (usable(results[new]) if n in params else finite(results[new]))
        ]
        if bad:
            raise NonFiniteError(
                self._non_finite_message(loss, bad), loss=loss, step=self.step + 1, values=bad
            )
        for name, new in updates.items():
            self._values[name] = results[new]
        self.step += 1
        return loss

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
        split, reason = self._split  # the step program's, cut when the session was made
        if split is None:
            self._cache, self._cache_reason = None, reason
        else:
            tag = f"{self.artifact.program_id}:{'fused' if self._fused is not None else 'graph'}"
            self._cache_args = {"tag": tag, "max_bytes": budget, "bind": self._bind, "rows": rows}
            self._cache, self._cache_reason = FeatureCache(split, **self._cache_args), ""
        return self.feature_cache_info()

    @property
    def feature_rows(self) -> Any:
        """The cached rows (an opaque object) for enable_feature_cache(rows=) of a later session of this artifact,
        or None."""
        return None if self._cache is None else self._cache.rows

    def disable_feature_cache(self, reason: str = "disabled") -> None:
        """Drops the cache and its memory; steps run the whole program again."""
        self._cache, self._cache_reason = None, reason

    def feature_cache_info(self) -> dict[str, Any]:
        """{"enabled": bool, "reason": why not (when off)} plus, when on: the boundary values, the nodes the
        prefix holds, the samples and bytes cached, hits and misses."""
        if self._cache is None:
            return {"enabled": False, "reason": self._cache_reason}
        return {"enabled": True, "reason": "", **self._cache.info()}

    def _run_step(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        cache = self._cache
        if cache is None:
            return self._step_program.run(feeds)
        if not cache.rows.checked:
            cache = self._checked_cache(cache, feeds)
            if cache is None:
                return self._step_program.run(feeds)
        return cache.run(feeds)

    def _checked_cache(self, cache: Any, feeds: dict[str, np.ndarray]) -> Any:
        """The cache, once its prefix gives each sample of the first batch the same rows wherever the sample sits
        in the batch; or None (the cache turned off). Where only the prefix's last nodes move rows (a BLAS whose
        matrix product rounds a row by its position in the batch), the prefix is cut back before them and the
        cut prefix is checked in turn: the convolutions stay cached, the products run in every step."""

        moving: set[str] = set()
        while True:
            if cache.rows_independent(feeds):
                cache.rows.checked = True
                return cache
            found = set(cache.position_dependent(feeds)) - moving
            if not found:
                break
            moving |= found
            split, _ = split_step(self._step_program.graph, self._io["data_inputs"], exclude=moving)
            if split is None:
                break
            cache = self._cache = FeatureCache(split, **self._cache_args)
        self.disable_feature_cache(
            "the frozen part's results for a sample change with its position in the batch (checked on "
            "the first batch, bit for bit), so they cannot be reused across batches"
        )
        return None

    def _fused_step(self, loss: float, results: dict[str, np.ndarray]) -> float:
        if not math.isfinite(loss):
            bad = list(self._io["updates"])
            raise NonFiniteError(
                self._non_finite_message(loss, bad), loss=loss, step=self.step + 1, values=bad
            )
        grads = self._fused.gradients()
        # a gradient the program did not write into its view (a constant); the bound ones it always writes there
        for p, name in self._unbound if self._lean_feeds is not None else self._grad_of.items():
            r = results.get(name)
            if r is not None and r is not grads[p]:
                if np.shape(r) != grads[p].shape:  # the program computed other than it declared
                    raise ExecutionError(
                        f"the step's gradient '{name}' of '{p}' has shape {list(np.shape(r))}, but the parameter "
                        f"has {list(grads[p].shape)}: the artifact's program does not compute what it declares; "
                        "convert the model again"
                    )
                np.copyto(grads[p], r)
        bad = self._fused.update(self._lr)
        if bad:
            raise NonFiniteError(
                self._non_finite_message(loss, bad), loss=loss, step=self.step + 1, values=bad
            )
        self._values = self._fused.values()
        self.step += 1
        return loss

    def _non_finite_message(self, loss: float, bad: list[str]) -> str:
        what = (
            f"the loss is {loss}"
            if not math.isfinite(loss)
            else f"the loss {loss:.4g} is finite, but the updated value of '{bad[0]}'"
            + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")
            + " is not finite, or so large that the next step would overflow"
        )
        return (
            f"training step {self.step + 1}: {what} (learning rate {self._lr:g}); nothing was committed: the "
            "parameters and optimizer state are those before the step. Lower the learning rate, clip the gradient "
            "norm (convert with clip_grad_norm= / --clip-grad-norm), or check the batch for non-finite values"
        )

    def evaluate(self, x: Any, y: Any) -> tuple[float, np.ndarray]:
        """(loss, model output) on a batch, without updating anything."""
        if self._eval_program is None:
            g = self.artifact.program
            keep = [self._io["loss"]] + list(self._io["outputs"])
            from edgetrain.graph.memory import planned_interpreter  # start-up: the planner loads on first use

            self._eval_program = planned_interpreter(prune(g.copy(outputs=keep)), lean=False)
        feeds = self._feeds(x, y)
        prog = self._eval_program
        feeds = {k: v for k, v in feeds.items() if k in prog.graph.inputs}
        loss, output, *_ = prog.run(feeds)
        return float(loss), output

    def run(self, x: Any) -> np.ndarray:
        """The model's (first) output with the current parameters; any batch size. An int8 model runs as it
        exports: its integer graph, the trained weights requantized (onnxruntime gives the same to the bit)."""
        data = self._data_feeds(x, fixed_batch=False)
        key = tuple(np.shape(v) for v in data.values())
        values = self._run_values()
        prog = self._run_programs.get(key)
        if prog is None:
            base = self._base_at(data)
            # Trainable parameters become inputs, so folding cannot bake the initial values in.
            g = base.copy(
                inputs=list(base.inputs) + sorted(values),
                initializers={k: v for k, v in base.initializers.items() if k not in values},
            )
            g = make_static(
                g,
                shapes={
                    **{k: np.shape(v) for k, v in data.items()},
                    **{p: v.shape for p, v in values.items()},
                },
            )
            from edgetrain.graph.memory import planned_interpreter  # start-up: the planner loads on first use

            prog = self._run_programs[key] = planned_interpreter(g, lean=False)
        feeds = {**data, **{p: values[p] for p in prog.graph.inputs if p in values}}
        return prog.run(feeds)[0]

    def _int8_runs(self) -> bool:
        """An int8 model runs its integer graph (not when a batch plan moves the float graph to another batch)."""
        return self.artifact.quantized is not None and self.artifact.batch_plan is None

    def _run_values(self) -> dict[str, np.ndarray]:
        """The trained tensors run() feeds: the parameters, or an int8 model's integer weights requantized."""
        params = {p: self._values[p] for p in self._io["parameters"]}
        if not self._int8_runs():
            return params
        from edgetrain.graph import quantized as qat  # only an int8 model needs it

        q = self.artifact.quantized
        return qat.requantize(q["weights"], params, q["constants"])

    def _base_at(self, data: Mapping[str, np.ndarray]):
        """The inference graph at the batch of `data`: a model exported with a fixed batch is moved to it by the
        batch plan that conversion found and checked; without one, it runs at its own batch only."""
        base, plan = self.artifact.base, self.artifact.batch_plan
        if self._int8_runs():
            base = self.artifact.quantized["model"]()
        found = fixed_batch(base)
        if found is None:
            return base
        names, b0 = found
        batch = int(np.shape(data[names[0]])[0]) if np.ndim(data[names[0]]) else b0
        if batch == b0:
            return base
        if plan is None:
            raise FeedError(
                f"the model was exported with a fixed batch of {b0} (input '{names[0]}' {base.values[names[0]]}); "
                f"run it on batches of {b0}, or convert it with --batch-size N to train and run at another batch"
            )
        return apply_batch_plan(base, plan, batch)

    def snapshot(self) -> dict[str, Any]:
        """Copies of the parameters and optimizer state, with the step count and lr; restore() puts them back."""
        return {"values": {k: v.copy() for k, v in self._values.items()}, "step": self.step, "lr": self._lr}

    def restore(self, snapshot: Mapping[str, Any]) -> None:
        """Puts back what snapshot() took."""
        for k, v in snapshot["values"].items():
            self._assign(k, v)
        self.step, self._lr = int(snapshot["step"]), float(snapshot["lr"])

    # ---- checkpoints -------------------------------------------------------------------------------------------
    def save_checkpoint(self, path: str | os.PathLike, user_state: Mapping[str, Any] | None = None) -> int:
        """Writes parameters, optimizer state, step, lr and user_state (JSON values, e.g. a data loader's
        position) atomically: a kill at any instant leaves the old checkpoint or the new one, whole."""
        try:
            user = json.loads(json.dumps(dict(user_state or {}), allow_nan=False))
        except (TypeError, ValueError) as e:
            raise FeedError(
                f"user_state must hold JSON values only (numbers, strings, lists, dicts): {e}"
            ) from e

        bad = [k for k, v in self._values.items() if not finite(v)]
        if bad or not math.isfinite(
            self._lr
        ):  # train_step and set_parameters refuse these: a bug if seen here
            raise ArtifactError(
                f"refusing to write checkpoint '{path}': '{bad[0] if bad else 'lr'}' is not finite"
            )
        header = {
            "program_id": self.artifact.program_id,
            "step": self.step,
            "lr": self._lr,
            "user_state": user,
            "artifact": os.path.basename(self.artifact.path),
        }
        if (
            self._pipeline is not None and self._pipeline.declared
        ):  # how the data was fed: eval and export apply it
            header["preprocessing"] = self._pipeline.to_json()
        return write_container(path, kind="checkpoint", header=header, tensors=self._values)

    def _checkpoint_pipeline(self, path, header: Mapping[str, Any]):
        """The input pipeline a checkpoint's data was fed by, when it recorded one (an InputPipeline)."""
        spec = header.get("preprocessing")
        if spec is None:
            return None
        from loaders import (  # start-up: only checkpoints that record one load loaders
            ConfigError,
            InputPipeline,
        )

        try:
            return InputPipeline.from_json(spec, source=f"checkpoint '{path}'")
        except ConfigError as e:
            raise ArtifactError(f"{e}: the file is damaged or was made elsewhere") from None

    def load_checkpoint(self, path: str | os.PathLike) -> dict[str, Any]:
        """Restores a checkpoint of this model; returns its user_state. Every field is checked before anything is
        restored: a bad file is an ArtifactError naming it and the field, and the session is left as it was."""

        header, tensors = read_container(path, kind="checkpoint")
        step, lr, user = _checkpoint_fields(path, header)
        if header["program_id"] != self.artifact.program_id:
            raise ArtifactError(
                f"checkpoint '{path}' belongs to another model (it was saved by a session of "
                f"'{header.get('artifact', '?')}', a different training program), so it cannot be loaded into "
                f"this session of '{os.path.basename(self.artifact.path)}'"
            )
        missing = [k for k in self._values if k not in tensors]
        if missing:
            raise ArtifactError(f"checkpoint '{path}' lacks '{missing[0]}'; it is damaged or incomplete")
        for k in self._values:
            arr = tensors[k]
            if arr.shape != self._values[k].shape or arr.dtype != self._values[k].dtype:
                raise ArtifactError(
                    f"checkpoint '{path}': '{k}' is {arr.dtype}{list(arr.shape)}, expected "
                    f"{self._values[k].dtype}{list(self._values[k].shape)}"
                )
            if not finite(arr):
                raise ArtifactError(
                    f"checkpoint '{path}': '{k}' holds non-finite values (NaN or infinity); edgetrain never writes "
                    "such a checkpoint, so the file was made elsewhere or damaged: use an earlier checkpoint"
                )
        pipeline = self._checkpoint_pipeline(path, header)
        if pipeline is not None and pipeline != self.preprocessing and self.preprocessing.declared:
            raise ArtifactError(
                f"checkpoint '{path}' was trained on data fed by another input pipeline ({pipeline.describe()}) than "
                f"the one '{self.artifact.path}' declares ({self.preprocessing.describe()})"
            )
        for k in list(self._values):
            self._assign(k, tensors[k])
        self.step, self._lr = step, float(lr)
        if pipeline is not None:
            self._pipeline = pipeline
        return dict(user)

    # ---- export ------------------------------------------------------------------------------------------------
    def export_onnx(
        self,
        path: str | os.PathLike,
        *,
        preprocessing: bool = True,
        requantize: bool = False,
        float_model: bool = False,
        adapters: str = "merged",
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
        export_adapters for the per-user files). Needs the onnx package."""
        try:
            from edgetrain.onnx_io.writer import export_inference  # needs onnx: an optional dependency
        except ImportError as e:
            raise UnsupportedError(
                "export_onnx needs the onnx package, which is not installed here: "
                "pip install 'edgetrain[convert]' (or export on a workstation from a "
                "checkpoint with `edgetrain export`)"
            ) from e
        prov = self.artifact.header.get("provenance", {})
        props = {
            "edgetrain.steps": str(self.step),
            "edgetrain.source_sha256": str(prov.get("source_sha256", "")),
        }
        base, params = self._export_graph(requantize, float_model)
        base, params, defaults = self._adapted(base, params, adapters)
        if self.artifact.channels:  # layers trained on a subset of their input channels: whole again
            from edgetrain.graph.channels import (  # only such a model's export needs them
                unsplit,
                whole_weights,
            )

            whole = whole_weights(self.artifact.channels, base.initializers, params)
            parts = {p for s in self.artifact.channels for p in (s.trained, s.frozen)}
            base = unsplit(base, self.artifact.channels)
            params = {**{k: v for k, v in params.items() if k not in parts}, **whole}
        if self._pipeline is not None and self._pipeline.declared:
            spec = json.dumps(self._pipeline.to_json())
            if preprocessing:
                from edgetrain.graph.preprocessing import with_preprocessing  # start-up: only exports load it

                base = with_preprocessing(base, self._pipeline)
                props["edgetrain.preprocessing_in_graph"] = spec
            else:
                props["edgetrain.preprocessing"] = spec
        export_inference(base, params, path, props=props, inputs_with_defaults=defaults)

    def _adapted(self, base, params: dict, how: str):
        """(graph, initializers, inputs with defaults) of the export with adapters merged or served."""
        a = self.artifact.adapters
        if how not in ("merged", "serving"):
            raise ConfigError(f"adapters='{how}': give 'merged' or 'serving'")
        if a is None:
            return base, params, ()
        if how == "serving":
            return base, params, [p for m in a["modules"] for p in (m.A, m.B)]
        from edgetrain.graph.adapters import (
            merged_weights,
            unadapted,
        )  # only a LoRA model's export needs them

        modules = a["modules"]
        merged = merged_weights(modules, base.initializers, params)
        adapter_names = {p for m in modules for p in (m.A, m.B)}
        rest = {k: v for k, v in params.items() if k not in adapter_names}
        return unadapted(base, modules), {**rest, **merged}, ()

    def export_adapters(self, path: str | os.PathLike, *, format: str = "edgetrain") -> int:
        """Writes the trained adapters alone, atomically; returns the file's bytes. format="edgetrain": a container
        (kind "adapters") with each A and B, the LoRA settings and the base model's digest, for checkpoints, rollback
        and the fleet (load_adapters reads it back); format="onnxruntime": onnxruntime's adapter format, which
        onnxruntime.LoraAdapter loads to serve this user on the model export_onnx(adapters="serving") writes (needs
        onnxruntime)."""
        a = self.artifact.adapters
        if a is None:
            raise ConfigError(f"'{self.artifact.path}' has no adapters: convert with adapters=et.LoRA(...)")
        tensors = {p: np.ascontiguousarray(self._values[p]) for m in a["modules"] for p in (m.A, m.B)}
        if format == "onnxruntime":
            from edgetrain.onnx_io.writer import write_ort_adapter  # build side: needs onnxruntime

            return write_ort_adapter(path, tensors)
        if format != "edgetrain":
            raise ConfigError(f"format='{format}': give 'edgetrain' or 'onnxruntime'")
        header = {
            "config": a["config"],
            "modules": [m.to_dict() for m in a["modules"]],
            "program_id": self.artifact.program_id,
            "source_sha256": self.artifact.header.get("provenance", {}).get("source_sha256", ""),
            "step": self.step,
        }
        return write_container(path, kind="adapters", header=header, tensors=tensors)

    def load_adapters(self, path: str | os.PathLike) -> None:
        """Puts in the adapters export_adapters wrote (of an artifact of the same program)."""
        header, tensors = read_container(path, kind="adapters")
        if header.get("program_id") != self.artifact.program_id:
            raise ArtifactError(
                f"'{path}' holds adapters of another training program than '{self.artifact.path}'s; convert the "
                "same model with the same LoRA settings"
            )
        names = {p for m in (self.artifact.adapters or {}).get("modules", []) for p in (m.A, m.B)}
        if set(tensors) != names:
            raise ArtifactError(f"'{path}' holds other adapter tensors than this artifact's")
        for k, v in tensors.items():
            self._assign(k, v)

    def _export_graph(self, requantize: bool, float_model: bool):
        """(the graph to export, the initializers it takes from training)."""
        params = {p: self._values[p] for p in self._io["parameters"]}
        q = self.artifact.quantized
        if q is None:
            if requantize or float_model:
                raise ConfigError(
                    f"'{self.artifact.path}' was converted from a float model: requantize and float_model apply to "
                    "an int8 model's export"
                )
            return self.artifact.base, params
        from edgetrain.graph import quantized as qat  # only an int8 model's export needs it

        if float_model:
            return qat.dequantized(self.artifact.base), params
        ints = qat.requantize(q["weights"], params, q["constants"], rederive=requantize)
        return q["model"](), ints

    # ---- feeds -------------------------------------------------------------------------------------------------
    def _classes(self) -> int | None:
        """The classes of a cross-entropy loss: the size of its class axis in the model's output (axis 1 unless
        the artifact's loss names another, as a language model's -1)."""
        loss = self.artifact.header.get("loss", {})
        if loss.get("type") not in CLASS_LOSSES:
            return None
        out = self.artifact.program.values.get(self._io["outputs"][0])
        shape = None if out is None else out.shape
        axis = loss.get("class_axis", 1)
        rank = len(shape) if shape else 0
        ok = rank >= 2 and type(axis) is int and -rank <= axis < rank and axis % rank != 0
        if not ok or type(shape[axis]) is not int or shape[axis] < 1:
            raise ArtifactError(
                f"'{self.artifact.path}' trains with {loss['type']}, but its output '{self._io['outputs'][0]}' "
                f"declares {out if out is not None else 'no shape'}, with no known number of classes along its "
                f"class axis {axis!r}; rebuild it with `edgetrain convert`"
            )
        self._class_axis = (axis % rank, [int(d) if type(d) is int else d for d in shape])
        return int(shape[axis])

    def _data_feeds(self, x: Any, *, fixed_batch: bool) -> dict[str, np.ndarray]:
        names = self._io["data_inputs"]
        data = x if isinstance(x, Mapping) else {names[0]: x} if len(names) == 1 else None
        if data is None:
            raise FeedError(f"the model has {len(names)} inputs ({', '.join(names)}): pass a dict of them")
        out = {}
        pipeline = self._pipeline if len(names) == 1 else None  # None: no pipeline declared or set (yet)
        for name in names:
            if name not in data:
                raise FeedError(f"input '{name}' is missing; the model's inputs are: {', '.join(names)}")
            want = np.dtype(self.artifact.program.values[name].dtype)
            arr = np.asarray(data[name])
            how = input_cast(name, arr.dtype, want, allow_cast=self.allow_cast, pipeline=pipeline, values=arr)
            if how == "pipeline":  # raw integers: the model's input pipeline scales them
                arr = self.preprocess(arr, source=f"input '{name}'")
            elif how == "cast":
                arr = arr.astype(want)
            out[name] = arr
        if fixed_batch and not self._fits(out):
            if self._data_graph is None:  # the program seen from its data inputs, made once
                self._data_graph = self.artifact.program.copy(inputs=names)
            check_feeds(self._data_graph, out)
        return out

    def _fits(self, data: dict[str, np.ndarray]) -> bool:
        """Whether the batch has the dtypes and static shapes of the step's data inputs (fastpaths "lean_step";
        False without it: check_feeds decides)."""
        specs = self._lean_feeds
        if specs is None or len(data) != len(specs):
            return False
        for name, (dtype, shape) in specs.items():
            a = data.get(name)
            if type(a) is not np.ndarray or a.dtype != dtype or a.shape != shape:
                return False
        return True

    def _feeds(self, x: Any, y: Any) -> dict[str, np.ndarray]:
        feeds = self._data_feeds(x, fixed_batch=True)
        io, info = self._io, self._target_info
        try:
            y = np.asarray(y)
        except (TypeError, ValueError) as e:  # ragged lists, objects numpy cannot make an array of
            raise FeedError(f"the labels are not an array: {e}") from None
        classes = np.dtype(info.dtype).kind == "i"
        if classes:
            y = self._class_labels(_as_target(y, tuple(info.shape)))
        elif y.dtype != info.dtype and y.dtype.kind in "fiub":
            y = y.astype(info.dtype)
        if tuple(y.shape) != tuple(info.shape):
            per = " (one class index per sample)" if classes and not _past_batch(info.shape) else ""
            raise FeedError(f"the target must have shape {list(info.shape)}{per}, got {list(y.shape)}")
        feeds[io["target"]] = y
        feeds[io["lr"]] = np.asarray(self._lr, np.float32)
        feeds.update(self._values)
        return feeds

    def _class_labels(self, y: np.ndarray) -> np.ndarray:
        """Integer class labels for the target: integral numbers within [0, classes) (or the loss's ignore_index),
        checked with one min and max before the cast, so that 1e30 or 2**64-1 is named as given, not wrapped."""
        want = self._target_info.dtype
        n = self._n_classes
        if self._lean_feeds is not None and n is not None and y.dtype.kind in "iu" and y.size:
            # one reduction: seen as unsigned, a negative label is larger than any class
            if int(np.maximum.reduce(y.view(f"u{y.dtype.itemsize}"), axis=None)) < n:
                return y.astype(want, copy=False)
        if y.dtype.kind not in "iuf" or (y.dtype.kind == "f" and not np.all(np.mod(y, 1) == 0)):
            raise FeedError(f"labels must be integer class indices, got {y.dtype}")
        if n is not None and y.size:
            ignore = self.artifact.header["loss"].get("ignore_index")
            lo, hi = y.min(), y.max()
            if lo < 0 or hi >= n:
                bad = (y < 0) | (y >= n)
                if ignore is not None:
                    bad &= y != ignore
                if bad.any():
                    at = tuple(int(i) for i in np.unravel_index(int(np.flatnonzero(bad)[0]), y.shape))
                    value = y[at].item()
                    text = f"{value:g}" if isinstance(value, float) else str(value)
                    where = f"sample {at[0]}" + (f", position {list(at[1:])}," if len(at) > 1 else "")
                    also = f", or {ignore} to ignore a sample" if ignore is not None else ""
                    axis, shape = self._class_axis
                    raise FeedError(
                        f"label {text} is out of range: the model has {n} classes (0 to {n - 1}{also}); it is "
                        f"{where} of the batch (the classes are axis {axis} of the model's output {shape})"
                    )
        elif y.dtype.kind == "f" and y.size and not np.all(np.abs(y) < 2**62):
            raise FeedError(f"labels must be integer class indices, got {y.dtype} values beyond any int")
        return y.astype(want, copy=False)


def _past_batch(shape) -> list:
    """The axes of a shape past the batch, but for those of size 1."""
    return [d for d in tuple(shape)[1:] if d != 1]


def _as_target(y: np.ndarray, shape: tuple) -> np.ndarray:
    """Class labels in the target's shape when they differ from it only by axes of size 1 past the batch: [N, 1, 1]
    labels for a [N] target, or [N] labels for an artifact whose [N, C, 1, 1] output was converted to take
    [N, 1, 1] (before the loss read it as [N, C])."""
    same_batch = y.ndim > 0 and len(shape) > 0 and y.shape[0] == shape[0]
    if same_batch and y.shape != shape and _past_batch(y.shape) == _past_batch(shape):
        return y.reshape(shape)
    return y


def _checkpoint_fields(path: str | os.PathLike, header: dict[str, Any]) -> tuple[int, float, dict]:
    """(step, lr, user_state) of a checkpoint header, every field of its type; ArtifactError naming the field."""

    pid, name = header.get("program_id"), header.get("artifact", "")
    step, lr, user = header.get("step"), header.get("lr"), header.get("user_state", {})
    bad = None
    if not isinstance(pid, str):
        bad = f"its program_id {short(pid)} is not a string"
    elif not isinstance(name, str):
        bad = f"its artifact name {short(name)} is not a string"
    elif type(step) is not int or step < 0:
        bad = f"its step count {short(step)} is not an integer >= 0"
    elif type(lr) not in (int, float) or not math.isfinite(lr) or lr < 0:
        bad = f"its learning rate {short(lr)} is not a finite number >= 0"
    elif not isinstance(user, dict):
        bad = f"its user_state is a {type(user).__name__} ({short(user)}), not a JSON object"
    if bad:
        raise ArtifactError(f"checkpoint '{path}': {bad}; it is damaged or was not written by edgetrain")
    return step, float(lr), user


def _scalar(value: np.ndarray, name: str) -> float:
    """The step's loss as a float: one element, or an ExecutionError (a program that computes other than it
    declares; load_artifact refuses every declaration that could, but a node's arithmetic is only known by running
    it)."""
    a = np.asarray(value)
    if a.size != 1 or a.dtype.kind not in "fiu":
        raise ExecutionError(
            f"the step's loss '{name}' came out as {a.dtype} of shape {list(a.shape)}, not one number: the "
            "artifact's program does not compute what it declares; convert the model again"
        )
    return float(a.reshape(()))
