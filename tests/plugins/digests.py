"""A pytest plugin that records what every conversion of the run writes, so that two runs (before and after a
refactoring) can be compared byte for byte: `EDGETRAIN_DIGESTS=FILE pytest -p tests.plugins.digests ...` appends
one JSON line per written `.etrain` and per `training_onnx()` (the test, what, its sha256 and size);
`python -m tests.plugins.digests BEFORE AFTER` compares two such files (as multisets of digests, and test by test)
and exits 1 when any artifact differs. It hooks the two public ways a conversion leaves the build side:
TrainingArtifact.save and TrainingArtifact.training_onnx."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from collections import Counter

_LOCK = threading.Lock()
_CURRENT = {"test": "(collection)"}


def _record(what: str, data: bytes, path: str = "", content: str = "") -> None:
    out = os.environ.get("EDGETRAIN_DIGESTS")
    if not out:
        return
    line = {
        "test": _CURRENT["test"],
        "what": what,
        "name": os.path.basename(path),
        "sha256": hashlib.sha256(data).hexdigest(),
        "bytes": len(data),
        "content": content,
    }
    with _LOCK, open(out, "a") as f:
        f.write(json.dumps(line) + "\n")


def pytest_configure(config):
    if not os.environ.get("EDGETRAIN_DIGESTS"):
        return
    from edgetrain.derive.artifact import TrainingArtifact

    save, onnx_of = TrainingArtifact.save, TrainingArtifact.training_onnx

    def recorded_save(self, path):
        size = save(self, path)
        with open(path, "rb") as f:
            _record("etrain", f.read(), os.fspath(path), _content(path))
        return size

    def recorded_onnx(self, *args, **kwargs):
        model = onnx_of(self, *args, **kwargs)
        _record(
            "training_onnx", model.SerializeToString(deterministic=True), getattr(model.graph, "name", "")
        )
        return model

    TrainingArtifact.save = recorded_save
    TrainingArtifact.training_onnx = recorded_onnx


def _content(path) -> str:
    """A digest of the artifact but for its provenance: the source model's own digest changes with what an exporter
    writes into the model besides the graph (PyTorch's dynamo exporter records the source files' paths), so two runs
    of one test in two checkouts differ there alone."""
    import numpy as np

    from edgetrain.core.container import read_container

    header, tensors = read_container(path)
    header = {k: v for k, v in header.items() if k != "provenance"}
    h = hashlib.sha256(json.dumps(header, sort_keys=True).encode())
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        h.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def pytest_runtest_setup(item):
    _CURRENT["test"] = item.nodeid


def _load(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def compare(before: str, after: str) -> int:
    a, b = _load(before), _load(after)
    ca, cb = Counter(r["sha256"] for r in a), Counter(r["sha256"] for r in b)
    lost = ca - cb
    print(f"before: {len(a)} files ({len(ca)} distinct); after: {len(b)} ({len(cb)} distinct)")
    if not lost:
        print("every file written before is written again, byte for byte")
        return 0
    contents = Counter(r.get("content") for r in b if r.get("content"))
    bare = [r for r in a if r["sha256"] in lost and r.get("content") and contents[r["content"]]]
    if bare and len(bare) == sum(lost.values()):
        print(
            f"{len(bare)} file(s) differ in their provenance alone (the source model's digest); the rest, byte for byte"
        )
        return 0
    by_test: dict[str, list[dict]] = {}
    for r in a:
        if r["sha256"] in lost:
            by_test.setdefault(r["test"], []).append(r)
    print(f"{sum(lost.values())} file(s) written before are not written after, in {len(by_test)} test(s):")
    for test, rows in sorted(by_test.items()):
        print(f"  {test}: " + ", ".join(f"{r['what']} {r['name']} ({r['bytes']} B)" for r in rows[:4]))
    return 1


if __name__ == "__main__":
    sys.exit(compare(sys.argv[1], sys.argv[2]))
