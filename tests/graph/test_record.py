"""The artifact's typed record refuses a broken field naming it, for every field the record defines: the crafted
headers are generated from the records' own definitions (each field's spec lists values it must refuse; each
section lists edits it must refuse), not from a hand-made list, and a field no artifact here exercises fails the
test. Real artifacts are the starting point (SGD with momentum and an input pipeline; AdamW with LoRA adapters and a
clipped gradient; a split layer; a memory budget; a re-batched fixed-batch export; an int8 model from onnxruntime's
quantizer), written by the container's own writer with a valid checksum, as a hostile file would be."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
from crafting import DELETE, crafted, encode
from models import MODELS

import edgetrain as et
from edgetrain.core.container import read_container, write_container
from edgetrain.core.errors import ArtifactError
from edgetrain.graph.fields import NOTHING, Optional, Part, spec_fields
from edgetrain.graph.record import ArtifactRecord
from edgetrain.graph.sections import SECTIONS
from edgetrain.runtime.artifact import load_artifact
from edgetrain.runtime.checkpoints import AdaptersFileRecord, CheckpointRecord, read_adapters, read_checkpoint
from loaders import InputPipeline


def _int8_mlp(folder) -> str:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    src, dst = folder / "mlp.onnx", folder / "mlp_int8.onnx"
    import onnx

    onnx.save(MODELS["mlp"][0](), str(src))
    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QUInt8)
    return str(dst)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """{name: path} of real artifacts that hold, between them, every field and section of the record."""
    d = tmp_path_factory.mktemp("record")
    ce = et.CrossEntropyLoss
    made = {
        "sgd": et.convert(
            MODELS["mlp"][0](),
            loss=ce(),
            optimizer=et.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4),
            batch_size=4,
            preprocessing=InputPipeline(raw_dtype="uint8", scale=1 / 255),
        ),
        "adamw_lora": et.convert(
            MODELS["mlp"][0](),
            loss=ce(ignore_index=-100),
            optimizer=et.AdamW(lr=0.01, clip_grad_norm=1.0),
            batch_size=4,
            adapters=et.LoRA(rank=2),
        ),
        "channels": et.convert(
            MODELS["mlp"][0](),
            loss=ce(),
            optimizer=et.SGD(lr=0.05),
            batch_size=4,
            channels={"fc1.weight": 64},
        ),
        "budget": et.convert(
            MODELS["lenet"][0](), loss=ce(), optimizer=et.SGD(lr=0.05), batch_size=4, memory_budget="400KB"
        ),
        "rebatched": et.convert(
            MODELS["lenet"][0](batch=2), loss=ce(), optimizer=et.SGD(lr=0.05), batch_size=4
        ),
        "int8": et.convert(_int8_mlp(d), loss=ce(), optimizer=et.SGD(lr=0.05), batch_size=4),
    }
    paths = {}
    for name, art in made.items():
        paths[name] = d / f"{name}.etrain"
        art.save(paths[name])
    return paths


def field_edits(cls: type, header: dict, prefix: tuple = ()):
    """(the path of the field, the value put there, the field's record class and name) for every field of `cls`
    the header holds or may hold, recursively into nested records: each value its spec says must be refused, and
    the field deleted where it is required."""
    for f in spec_fields(cls):
        key = f.metadata["key"] or f.name
        when = f.metadata["when"]
        if when is not None and not when(header):
            continue
        s = f.metadata["spec"]
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        values = list(s.breaking()) + ([DELETE] if required and f.metadata["required"] else [])
        for v in values:
            yield (*prefix, key), v, (cls.__name__, f.name)
        inner = s.of if isinstance(s, Optional) else s
        if isinstance(inner, Part) and isinstance(header.get(key), dict):
            yield from field_edits(inner.cls, header[key], (*prefix, key))


def section_edits(header: dict):
    for key, cls in SECTIONS.items():
        if header.get(key) is not None:
            for path, v in cls.breaking(header[key]):
                yield (key, *path), v, (cls.__name__, key)


def _names_the_field(e: ArtifactError, path: tuple) -> bool:
    """The refusal's field is the broken one, or a record that holds it (a check that ties two fields together)."""
    tag = getattr(e, "field", None)
    dotted = ".".join(str(k) for k in path)
    return (
        tag is not None
        and (dotted == tag or dotted.startswith(tag + "."))
        and f"[header field {tag}]" in str(e)
    )


def test_every_field_of_the_record_is_refused_broken_naming_itself(artifacts, tmp_path):
    covered, accepted, unnamed = set(), [], []
    for name, src in artifacts.items():
        header, tensors = read_container(src)
        target = tmp_path / f"{name}.etrain"
        edits = list(field_edits(ArtifactRecord, header)) + list(section_edits(header))
        for path, value, field in edits:
            target.write_bytes(encode(crafted(header, path, value), tensors))
            case = (
                f"{name}: {'.'.join(map(str, path))} = {'deleted' if value is DELETE else repr(value)[:40]}"
            )
            try:
                load_artifact(target)
            except ArtifactError as e:
                covered.add(field)
                if not _names_the_field(e, path) or str(target) not in str(e):
                    unnamed.append(f"{case}: {e}")
                continue
            accepted.append(case)
    assert not accepted, "accepted broken headers:\n" + "\n".join(accepted[:20])
    assert not unnamed, "refusals that do not name the field:\n" + "\n".join(unnamed[:20])
    every = {(cls.__name__, f.name) for cls in _records(ArtifactRecord) for f in spec_fields(cls)}
    # edgetrain's own sections (a test's toy rewrite registers one of its own, which no artifact here holds)
    every |= {(cls.__name__, key) for key, cls in SECTIONS.items() if cls.__module__.startswith("edgetrain.")}
    assert every <= covered, f"fields no artifact here breaks: {sorted(every - covered)}"


def _records(cls: type) -> list[type]:
    """cls and every record class nested in it."""
    out = [cls]
    for f in spec_fields(cls):
        s = f.metadata["spec"]
        inner = s.of if isinstance(s, Optional) else s
        if isinstance(inner, Part):
            out += _records(inner.cls)
    return out


def test_the_real_artifacts_read_whole(artifacts):
    """Each fixture artifact reads, with the sections its rewrite wrote, and writes the same header back."""
    want = {
        "sgd": {"preprocessing"},
        "adamw_lora": {"adapters"},
        "channels": {"channels"},
        "budget": {"memory_budget"},
        "rebatched": {"batch_plan"},
        "int8": {"quantized"},
    }
    for name, path in artifacts.items():
        art = load_artifact(path)
        assert want[name] <= set(art.record.sections), (name, set(art.record.sections))
        header, _ = read_container(path)
        again, _ = art.record.write()
        assert again == header, name


def test_checkpoint_and_adapter_files_refuse_broken_fields_naming_them(artifacts, tmp_path):
    sess = et.TrainingSession(artifacts["adamw_lora"])
    sess.save_checkpoint(tmp_path / "c.etck", user_state={"epoch": 1})
    sess.export_adapters(tmp_path / "a.etad")
    cases = [
        (tmp_path / "c.etck", "checkpoint", CheckpointRecord, read_checkpoint),
        (tmp_path / "a.etad", "adapters", AdaptersFileRecord, read_adapters),
    ]
    for path, kind, cls, read in cases:
        header, tensors = read_container(path)
        read(path)  # the file as written reads
        target = tmp_path / f"crafted{path.suffix}"
        for key, value, _ in field_edits(cls, header):
            target.write_bytes(encode(crafted(header, key, value), tensors, kind=kind))
            with pytest.raises(ArtifactError) as e:
                read(target)
            assert _names_the_field(e.value, key) and str(target) in str(e.value), (key, value, str(e.value))


def test_an_unknown_section_is_refused_not_left_out(artifacts, tmp_path):
    """A header key no section claims is a rewrite of a newer edgetrain: training without it would be wrong."""
    header, tensors = read_container(artifacts["sgd"])
    target = tmp_path / "newer.etrain"
    write_container(target, kind="artifact", header={**header, "sparsity": {"mask": "m"}}, tensors=tensors)
    with pytest.raises(
        ArtifactError, match=r"holds 'sparsity', a part of the training program this edgetrain does"
    ):
        load_artifact(target)


def test_absent_optional_fields_take_their_defaults(artifacts, tmp_path):
    """An artifact of an older edgetrain lacks the fields added since: they read as their defaults."""
    header, tensors = read_container(artifacts["sgd"])
    old = {k: v for k, v in header.items() if k not in ("edgetrain_version", "provenance", "zeros")}
    for name in header["zeros"]:  # stored instead of declared, as before zero state was declared
        tensors[name] = np.zeros(header["zeros"][name][1], header["zeros"][name][0])
    old["initial"] = header["initial"] + list(header["zeros"])
    target = tmp_path / "old.etrain"
    write_container(target, kind="artifact", header=old, tensors=tensors)
    rec = load_artifact(target).record
    assert rec.edgetrain_version == "" and rec.provenance.source_sha256 == "" and rec.zeros == {}
    assert NOTHING is not None and os.path.exists(target)
