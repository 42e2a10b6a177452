"""Artifacts of a release keep working: tests/data/release-0.1.0-*.etrain were written by edgetrain 0.1.0 (the
package as it stood before its modules moved into layers, commit 064a194) from the demo's models, by exactly the
calls in RELEASED below. They load and train, with numpy alone too; and converting the same model today writes the
same bytes (conversion is deterministic and its output format has not changed). When the format changes on
purpose, keep these files and add the new release's beside them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from device import PYTHONS, run_on_device

import edgetrain as et
from edgetrain.core import fastpaths

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
MODELS = ROOT / "edgetrain" / "data"


def _as_released(name: str) -> str:
    """The demo's model as it was at the release: without the input pipeline its metadata declares since (the same
    file name, which the artifact records)."""
    import tempfile

    import onnx

    model = onnx.load(str(MODELS / name))
    kept = {p.key: p.value for p in model.metadata_props if p.key != "edgetrain.preprocessing"}
    del model.metadata_props[:]
    onnx.helper.set_model_props(model, kept)
    path = Path(tempfile.mkdtemp(prefix="edgetrain-release-")) / name
    onnx.save(model, str(path))
    return str(path)


RELEASED = {
    "release-0.1.0-lenet-sgd.etrain": lambda: et.convert(
        _as_released("digits_lenet.onnx"),
        loss=et.CrossEntropyLoss(),
        optimizer=et.SGD(lr=0.01, momentum=0.9, weight_decay=5e-4),
        batch_size=10,
    ),
    "release-0.1.0-lstm-adam.etrain": lambda: et.convert(
        _as_released("digits_lstm.onnx"),
        loss=et.CrossEntropyLoss(),
        optimizer=et.Adam(lr=1e-3),
        batch_size=10,
    ),
}


def _batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.random((10, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, 10)


@pytest.mark.parametrize("name", list(RELEASED))
def test_a_released_artifact_is_written_again_byte_for_byte(tmp_path, name):
    # with the fast paths that rewrite a step off (issue 25: the recurrences' training-mode forwards, the fused
    # transformer ops), the program is the released one; with them on, it trains bit for bit alike (below)
    path = tmp_path / name
    with fastpaths.plain():
        RELEASED[name]().save(str(path))
    assert path.read_bytes() == (DATA / name).read_bytes()


@pytest.mark.parametrize("name", list(RELEASED))
def test_a_released_artifact_trains_as_a_fresh_conversion(tmp_path, name):
    """The stored artifact and today's conversion of its model train alike, bit for bit, fused or not; and the
    loss goes down."""
    fresh = tmp_path / name
    RELEASED[name]().save(str(fresh))
    x, y = _batch()
    for fused in (True, False):
        old, new = et.TrainingSession(DATA / name, fused=fused), et.TrainingSession(fresh, fused=fused)
        losses = [old.train_step(x, y) for _ in range(5)]
        assert losses == [new.train_step(x, y) for _ in range(5)]
        assert losses[-1] < losses[0], losses
        for k, v in new.parameters().items():
            assert np.array_equal(old.parameters()[k], v), k


@pytest.mark.parametrize("python", PYTHONS)
def test_a_released_artifact_trains_with_numpy_alone(python):
    proc = run_on_device(
        python,
        """
        import numpy as np
        from edgetrain.runtime import TrainingSession
        rng = np.random.default_rng(0)
        x, y = rng.random((10, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, 10)
        sess = TrainingSession("tests/data/release-0.1.0-lenet-sgd.etrain")
        losses = [sess.train_step(x, y) for _ in range(5)]
        assert losses[-1] < losses[0], losses
        print("released artifact OK", losses[0], losses[-1])
        """,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "released artifact OK" in proc.stdout
