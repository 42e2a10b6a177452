"""TrainingSession (numpy only): an artifact file -> train_step / run / evaluate, parameters, crash-safe
checkpoints, and export of the personalized inference model."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..artifact import load_artifact
from ..errors import ArtifactError, FeedError, UnsupportedError
from ..passes import make_static, prune
from .interpreter import Interpreter, check_feeds


class TrainingSession:
    """Trains the model of an artifact (`.etrain`) on the device.

    The training step is a pure function of (data, target, lr, parameters, optimizer state); the session owns the
    parameters and state and binds each step's new values back. run() and evaluate() use inference semantics
    (BatchNorm with running statistics, no dropout), with the current parameters.
    """

    def __init__(self, path: str | os.PathLike, *, verify: bool = True):
        self.artifact = art = load_artifact(path, verify=verify)
        io = art.io
        self._io = io
        self._step_program = Interpreter(art.program, plan=art.plan)
        # Parameters and state are owned by the session: writable copies of the file's read-only maps.
        self._values: dict[str, np.ndarray] = {k: np.array(v) for k, v in art.initial.items()}
        self._lr = float(art.header["optimizer"].get("lr", 0.0))
        self.step = 0
        self._eval_program: Interpreter | None = None
        self._run_programs: dict[tuple, Interpreter] = {}
        self._target_info = art.program.values[io["target"]]
        self._n_classes = self._classes()

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
        for name, value in params.items():
            self._values[name] = np.array(value, dtype=self._values[name].dtype)

    def train_step(self, x: Any, y: Any) -> float:
        """One optimizer step on a batch; returns the loss (before the update)."""
        feeds = self._feeds(x, y)
        out = self._step_program.run(feeds)
        names = self._step_program.graph.outputs
        results = dict(zip(names, out))
        loss = float(results[self._io["loss"]])
        for name, new in self._io["updates"].items():
            self._values[name] = results[new]
        self.step += 1
        return loss

    def evaluate(self, x: Any, y: Any) -> tuple[float, np.ndarray]:
        """(loss, model output) on a batch, without updating anything."""
        if self._eval_program is None:
            g = self.artifact.program
            keep = [self._io["loss"]] + list(self._io["outputs"])
            self._eval_program = Interpreter(prune(g.copy(outputs=keep)))
        feeds = self._feeds(x, y)
        prog = self._eval_program
        feeds = {k: v for k, v in feeds.items() if k in prog.graph.inputs}
        loss, output, *_ = prog.run(feeds)
        return float(loss), output

    def run(self, x: Any) -> np.ndarray:
        """The model's (first) output with the current parameters; any batch size."""
        data = self._data_feeds(x, fixed_batch=False)
        key = tuple(np.shape(v) for v in data.values())
        prog = self._run_programs.get(key)
        if prog is None:
            base = self.artifact.base
            params = set(self._io["parameters"])
            # Trainable parameters become inputs, so folding cannot bake the initial values in.
            g = base.copy(
                inputs=list(base.inputs) + sorted(params),
                initializers={k: v for k, v in base.initializers.items() if k not in params},
            )
            g = make_static(
                g,
                shapes={
                    **{k: np.shape(v) for k, v in data.items()},
                    **{p: self._values[p].shape for p in params},
                },
            )
            prog = self._run_programs[key] = Interpreter(g)
        feeds = {**data, **{p: self._values[p] for p in prog.graph.inputs if p in self._values}}
        return prog.run(feeds)[0]

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
        from ..container import write_container

        header = {
            "program_id": self.artifact.program_id,
            "step": self.step,
            "lr": self._lr,
            "user_state": user,
            "artifact": os.path.basename(self.artifact.path),
        }
        return write_container(path, kind="checkpoint", header=header, tensors=self._values)

    def load_checkpoint(self, path: str | os.PathLike) -> dict[str, Any]:
        """Restores a checkpoint of this model; returns its user_state."""
        from ..container import read_container

        header, tensors = read_container(path, kind="checkpoint")
        if header.get("program_id") != self.artifact.program_id:
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
            self._values[k] = np.array(arr)
        self.step = int(header["step"])
        self._lr = float(header["lr"])
        return dict(header.get("user_state", {}))

    # ---- export ------------------------------------------------------------------------------------------------
    def export_onnx(self, path: str | os.PathLike) -> None:
        """Writes the inference model with the trained parameters (nothing of the training graph); onnxruntime
        runs it. Needs the onnx package."""
        try:
            from ..export import export_inference
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
        params = {p: self._values[p] for p in self._io["parameters"]}
        export_inference(self.artifact.base, params, path, props=props)

    # ---- feeds -------------------------------------------------------------------------------------------------
    def _classes(self) -> int | None:
        loss = self.artifact.header.get("loss", {})
        if loss.get("type") != "CrossEntropyLoss":
            return None
        out = self.artifact.program.values[self._io["outputs"][0]]
        return int(out.shape[1])

    def _data_feeds(self, x: Any, *, fixed_batch: bool) -> dict[str, np.ndarray]:
        names = self._io["data_inputs"]
        data = x if isinstance(x, Mapping) else {names[0]: x} if len(names) == 1 else None
        if data is None:
            raise FeedError(f"the model has {len(names)} inputs ({', '.join(names)}): pass a dict of them")
        out = {}
        for name in names:
            if name not in data:
                raise FeedError(f"input '{name}' is missing; the model's inputs are: {', '.join(names)}")
            info = self.artifact.program.values[name]
            arr = np.asarray(data[name])
            if arr.dtype != info.dtype and arr.dtype.kind in "fiub" and np.dtype(info.dtype).kind == "f":
                arr = arr.astype(info.dtype)  # a float64 or integer image batch: convert, as users expect
            out[name] = arr
        if fixed_batch:
            check_feeds(self.artifact.program.copy(inputs=names), out)
        return out

    def _feeds(self, x: Any, y: Any) -> dict[str, np.ndarray]:
        feeds = self._data_feeds(x, fixed_batch=True)
        io, info = self._io, self._target_info
        y = np.asarray(y)
        if np.dtype(info.dtype).kind == "i":
            if y.dtype.kind not in "iu":
                if y.dtype.kind == "f" and np.all(np.mod(y, 1) == 0):
                    y = y.astype(np.int64)
                else:
                    raise FeedError(f"labels must be integer class indices, got {y.dtype}")
            y = y.astype(info.dtype, copy=False)
            if self._n_classes is not None:
                ignore = self.artifact.header["loss"].get("ignore_index")
                bad = (y < 0) | (y >= self._n_classes)
                if ignore is not None:
                    bad &= y != ignore
                if bad.any():
                    raise FeedError(
                        f"label {int(y[bad].ravel()[0])} is out of range: the model has "
                        f"{self._n_classes} classes (0 to {self._n_classes - 1})"
                    )
        elif y.dtype != info.dtype and y.dtype.kind in "fiub":
            y = y.astype(info.dtype)
        if tuple(y.shape) != tuple(info.shape):
            raise FeedError(f"the target must have shape {list(info.shape)}, got {list(y.shape)}")
        feeds[io["target"]] = y
        feeds[io["lr"]] = np.asarray(self._lr, np.float32)
        feeds.update(self._values)
        return feeds
