"""The input pipeline a converted model declares (loaders.InputPipeline): given to convert (preprocessing=, the
command line's --scale/--normalize/--layout/--input-range/--resize/--crop), else read from the model's
metadata_props (PREPROCESSING_KEY, as edgetrain's own export writes it), else none. Checked against the model's one
input here, once, so that a device never meets a pipeline its model cannot take."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from edgetrain.core.errors import ModelError
from edgetrain.core.ir import Graph
from loaders import ConfigError, InputPipeline
from loaders.imageops import RESIZE_MAX_BYTES
from loaders.limits import size_text
from loaders.values import bounded_json

PREPROCESSING_KEY = "edgetrain.preprocessing"  # metadata_props: the pipeline the app must apply
IN_GRAPH_KEY = "edgetrain.preprocessing_in_graph"  # ... the pipeline the model's own first nodes apply


def declared_pipeline(graph: Graph, given: Any) -> tuple[dict[str, Any] | None, list[str]]:
    """(the pipeline's JSON for the artifact, or None when none is declared; notes for the user)."""
    notes: list[str] = []
    source = "preprocessing="
    text = _metadata_pipeline(graph)
    _check_given(given)
    if given is None:
        if text is None:
            if IN_GRAPH_KEY in graph.metadata:
                notes.append(
                    "the model applies its input pipeline in its own first nodes (an edgetrain export): it takes "
                    "raw data as it is"
                )
            return None, notes
        given, source = text, f"the model's metadata '{PREPROCESSING_KEY}'"
    elif text is not None:  # the options given complete or override the model's own pipeline, field by field
        given = _merged(text, given)
        source = f"preprocessing= over the model's metadata '{PREPROCESSING_KEY}'"
    dtype = _input_dtype(graph)
    try:
        if isinstance(given, InputPipeline):
            pipeline = given
        else:
            spec = given if isinstance(given, (str, bytes)) else dict(given)
            if isinstance(spec, Mapping):
                spec = {"dtype": dtype, **spec}
            pipeline = InputPipeline.from_json(spec, source=source)
    except (ConfigError, TypeError) as e:
        raise ModelError(f"{e}") from None
    if pipeline.dtype != dtype:
        pipeline = InputPipeline.from_json({**pipeline.to_json(), "dtype": dtype}, source=source)
    _check_fits(graph, pipeline)
    if not pipeline.declared:
        return None, notes
    origin = (
        "declared"
        if source == "preprocessing="
        else "from the model"
        if source.startswith("the")
        else "merged"
    )
    notes.append(
        f"input pipeline ({origin}): {pipeline.describe()}; train, eval, the app and the export apply it"
    )
    return pipeline.to_json(), notes


def _metadata_pipeline(graph: Graph) -> Any:
    """The pipeline's JSON value in the model's metadata (None when it has none), read within bounded_json's depth
    and size: a ModelError naming the key otherwise."""
    text = graph.metadata.get(PREPROCESSING_KEY)
    if text is None:
        return None
    try:
        return bounded_json(text, f"the model's metadata '{PREPROCESSING_KEY}'")
    except ConfigError as e:
        raise ModelError(
            f"{e}: export the model again, or declare its pipeline with the preprocessing options"
        ) from None


def _check_given(given: Any) -> None:
    if given is not None and not isinstance(given, (InputPipeline, Mapping, str, bytes)):
        raise ModelError(
            f"preprocessing= must be a loaders.InputPipeline, its JSON dict or JSON text, not a "
            f"{type(given).__name__}"
        )


def _merged(text: Any, given: Any) -> dict[str, Any]:
    try:
        own = InputPipeline.from_json(text, source=f"the model's metadata '{PREPROCESSING_KEY}'").to_json()
        ask = (
            given.to_json()
            if isinstance(given, InputPipeline)
            else InputPipeline.from_json(given if isinstance(given, (str, bytes)) else dict(given)).to_json()
        )
    except (ConfigError, TypeError) as e:
        raise ModelError(f"{e}") from None
    return {**own, **{k: v for k, v in ask.items() if k not in ("version", "dtype")}}


def _input_dtype(graph: Graph) -> str:
    if len(graph.inputs) != 1:
        return "float32"
    return np.dtype(graph.info(graph.inputs[0]).dtype).name


def _check_fits(graph: Graph, pipeline: InputPipeline) -> None:
    """A pipeline the model's input cannot take is refused at convert, naming the input."""
    if not pipeline.declared:
        return
    if len(graph.inputs) != 1:
        raise ModelError(
            f"the model has {len(graph.inputs)} inputs ({', '.join(graph.inputs)}); an input pipeline is declared "
            f"for one-input models: leave out the preprocessing options and prepare the inputs in the app"
        )
    name = graph.inputs[0]
    shape = graph.info(name).shape or ()
    image = len(shape) == 4
    if (pipeline.size or pipeline.crop or pipeline.layout) and not image:
        raise ModelError(
            f"input '{name}' has shape {list(shape)}: --layout, --resize and --crop are for image inputs "
            f"[N, C, H, W]"
        )
    if pipeline.crop is not None and image and list(pipeline.crop) != list(shape[2:4]):
        raise ModelError(
            f"--crop {pipeline.crop[0]},{pipeline.crop[1]}: the crop must be the model's input size "
            f"{shape[2]}x{shape[3]} (input '{name}')"
        )
    if (
        pipeline.size is not None
        and pipeline.crop is None
        and image
        and list(pipeline.size) != list(shape[2:4])
    ):
        raise ModelError(
            f"--resize {pipeline.size[0]},{pipeline.size[1]} makes images of another size than the model's input "
            f"{shape[2]}x{shape[3]} (input '{name}'): add --crop {shape[2]},{shape[3]}, or resize to the input size"
        )
    channels = shape[1] if image else None
    _check_resize_bytes(pipeline, name, channels)
    for key in ("mean", "std"):
        v = getattr(pipeline, key)
        if v is not None and len(v) != 1 and isinstance(channels, int) and len(v) != channels:
            raise ModelError(
                f"--normalize gives {len(v)} {key} values; input '{name}' has {channels} channels: give one value "
                f"or {channels}"
            )


def _check_resize_bytes(pipeline: InputPipeline, name: str, channels: Any) -> None:
    """The image a resize makes (channels x H x W in float32, as the image readers compute it; a channel count the
    model leaves open counts as 1) must be one imageops.resize allocates: refused here, before any is made."""
    if pipeline.size is None:
        return
    h, w = pipeline.size
    needed = (channels if isinstance(channels, int) and channels > 0 else 1) * h * w * 4
    if needed > RESIZE_MAX_BYTES:
        raise ModelError(
            f"--resize {h},{w}: input '{name}' has {channels} channels, so each resized image is "
            f"{size_text(needed)} in float32, more than the {size_text(RESIZE_MAX_BYTES)} a resize may allocate: "
            f"resize to the model's input size {_hw_text(pipeline)} or near it"
        )


def _hw_text(pipeline: InputPipeline) -> str:
    return f"{pipeline.crop[0]}x{pipeline.crop[1]}" if pipeline.crop else "(its height and width)"
