"""One hierarchy: every error edgetrain raises on purpose is an EdgeTrainError and the builtin of its kind (so that
`except ValueError` code keeps working), file-system failures name the user's file, and a Trainer's own faults
(settings, a missing or damaged checkpoint, a full disk under its history) come from it too."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from models import MODELS

import edgetrain as et
from edgetrain.runtime import run_record
from edgetrain.runtime.trainer import Trainer
from loaders import ArrayDataView, DataLoader

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BATCH = 8

KINDS = [
    (et.ModelError, ValueError),
    (et.ModelLimitError, MemoryError),
    (et.ModelLimitError, ValueError),
    (et.UnsupportedError, NotImplementedError),
    (et.ShapeError, ValueError),
    (et.RebatchError, ValueError),
    (et.ConfigError, ValueError),
    (et.UsageError, ValueError),
    (et.FeedError, ValueError),
    (et.ArtifactError, ValueError),
    (et.ArtifactLimitError, MemoryError),
    (et.DataError, ValueError),
    (et.DataLimitError, MemoryError),
    (et.ExecutionError, RuntimeError),
    (et.NonFiniteError, RuntimeError),
    (et.StorageError, OSError),
    (et.MissingFileError, FileNotFoundError),
    (et.LimitError, MemoryError),
]


@pytest.mark.parametrize("cls, builtin", KINDS, ids=lambda c: c.__name__)
def test_every_class_is_an_edgetrain_error_and_its_builtin(cls, builtin):
    assert issubclass(cls, et.EdgeTrainError) and issubclass(cls, builtin)
    # and `except builtin` catches it when raised
    with pytest.raises(builtin):
        raise cls("x") if cls is not et.NonFiniteError else cls("x", loss=1.0, step=1, values=[])


def test_loaders_errors_are_the_same_classes_and_import_only_edgetrain_errors():
    import loaders

    assert loaders.DataError is et.DataError and issubclass(loaders.DataError, et.EdgeTrainError)
    script = "import sys, loaders; print(sorted(m for m in sys.modules if m.split('.')[0] == 'edgetrain'))"
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "['edgetrain', 'edgetrain.core', 'edgetrain.core.errors']"


def test_storage_error_names_the_users_file_and_keeps_errno(tmp_path):
    target = tmp_path / "no-such-folder" / "run.etck"
    try:
        open(target, "rb")
    except OSError as e:
        err = et.StorageError.of(e, target, "cannot read the checkpoint")
    assert isinstance(err, et.MissingFileError) and isinstance(err, FileNotFoundError)
    assert err.errno == 2 and err.filename == str(target)
    assert str(err) == f"cannot read the checkpoint '{target}': No such file or directory"


# ---- the Trainer -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mlp_path(tmp_path_factory):
    art = et.convert(
        MODELS["mlp"][0](), loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=0.05), batch_size=BATCH
    )
    path = str(tmp_path_factory.mktemp("hierarchy") / "mlp.etrain")
    art.save(path)
    return path


def _loader(n=16, seed=0):
    rng = np.random.default_rng(seed)
    x, y = rng.standard_normal((n, 784)).astype(np.float32), rng.integers(0, 10, n)
    return DataLoader(ArrayDataView(x, y), BATCH, drop_last=True)


def test_trainer_settings_are_config_errors(mlp_path):
    sess = et.TrainingSession(mlp_path)
    for kwargs, words in [
        ({"epochs": 0}, "epochs must be a positive integer"),
        ({"checkpoint_every": 2}, "needs a checkpoint path"),
        ({"early_stopping": {"metric": "val_loss"}}, "needs a val_loader"),
        ({"keep_best": True}, "keep_best needs a val_loader"),
    ]:
        with pytest.raises(et.ConfigError, match=words):
            Trainer(sess, _loader(), **kwargs)


def test_resume_without_a_checkpoint_is_a_missing_file(mlp_path, tmp_path):
    ck = tmp_path / "never-written.etck"
    t = Trainer(et.TrainingSession(mlp_path), _loader(), checkpoint=ck)
    with pytest.raises(et.MissingFileError, match="no checkpoint to resume from") as info:
        t.fit(resume=True)
    assert isinstance(info.value, FileNotFoundError) and info.value.filename == str(ck)


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("step", "abc", "'step' is 'abc', not an integer >= 0"),
        ("epoch", -1, "'epoch' is -1, not an integer >= 0"),
        ("epoch", 1.5, "'epoch' is 1.5"),
        ("history", {"a": 1}, "'history' is {'a': 1}, not a list"),
        ("base_lr", None, "'base_lr' is None, not a finite number"),
        ("loss_n", True, "'loss_n' is True"),
        ("loss_sum", None, "'loss_sum' is None"),
        ("bad_epochs", None, "'bad_epochs' is None"),
    ],
)
def test_resume_refuses_a_trainer_position_of_the_wrong_types(mlp_path, tmp_path, field, value, words):
    # a checkpoint whose container is sound (valid checksum) but whose trainer position was edited: an
    # ArtifactError naming the checkpoint and the field, not int("abc")'s ValueError or list(None)'s TypeError
    ck = tmp_path / "run.etck"
    t = Trainer(et.TrainingSession(mlp_path), _loader(), checkpoint=ck, epochs=1)
    t.fit()
    state = et.TrainingSession(mlp_path).load_checkpoint(ck)
    assert state["trainer"] == 1 and field in state
    state[field] = value
    sess = et.TrainingSession(mlp_path)
    sess.load_checkpoint(ck)
    sess.save_checkpoint(ck, user_state=state)
    again = Trainer(et.TrainingSession(mlp_path), _loader(), checkpoint=ck, epochs=2)
    with pytest.raises(
        et.ArtifactError, match=f"checkpoint '{ck}'.*{words}".replace("(", r"\(").replace("[", r"\[")
    ):
        again.fit(resume=True)


def test_resume_refuses_a_position_without_fields(mlp_path, tmp_path):
    ck = tmp_path / "run.etck"
    sess = et.TrainingSession(mlp_path)
    sess.save_checkpoint(ck, user_state={"trainer": 1, "settings": []})
    with pytest.raises(et.ArtifactError, match="trainer settings are list"):
        Trainer(et.TrainingSession(mlp_path), _loader(), checkpoint=ck).fit(resume=True)
    sess.save_checkpoint(ck, user_state={"trainer": 1})
    with pytest.raises(et.ArtifactError, match="no 'loader' entry"):
        Trainer(et.TrainingSession(mlp_path), _loader(), checkpoint=ck).fit(resume=True)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full (every write: ENOSPC)")
def test_history_on_a_full_disk_names_the_file(mlp_path):
    # /dev/full is a real device whose writes fail with ENOSPC, as on a full disk
    t = Trainer(et.TrainingSession(mlp_path), _loader(), epochs=1, history="/dev/full")
    with pytest.raises(
        et.StorageError, match="cannot write the training history '/dev/full': No space left"
    ) as e:
        t.fit()
    assert e.value.errno == 28 and e.value.filename == "/dev/full"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full (every write: ENOSPC)")
def test_cli_log_on_a_full_disk_names_the_file(mlp_path, tmp_path):
    rng = np.random.default_rng(0)
    data = tmp_path / "d.npz"
    np.savez(data, x=rng.standard_normal((16, 784)).astype(np.float32), y=rng.integers(0, 10, 16))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgetrain.cli",
            "train",
            mlp_path,
            "--data",
            str(data),
            "--epochs",
            "1",
            "--log",
            "/dev/full",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    assert "error: cannot write the training history '/dev/full': No space left on device" in proc.stderr
    assert "Traceback" not in proc.stderr and "[Errno" not in proc.stderr


def test_field_reader_accepts_what_a_trainer_writes():
    state = {"epoch": 3, "best": None, "loss_sum": 1.25, "history": []}
    f = run_record._field
    assert f(state, "epoch", int, "w") == 3 and f(state, "loss_sum", float, "w") == 1.25
    assert f(state, "best", float, "w", none=True) is None and f(state, "history", list, "w") == []
    assert f(state, "best_epoch", int, "w", none=True, default=None) is None


def test_a_session_takes_the_callers_bounds(mlp_path):
    # the bounds an artifact is read within are the caller's to raise or lower (SECURITY.md)
    with pytest.raises(et.ArtifactLimitError, match="arena") as e:
        et.TrainingSession(mlp_path, max_arena_bytes=1024)
    assert isinstance(e.value, MemoryError)
    with pytest.raises(et.ArtifactLimitError):
        et.TrainingSession(mlp_path, max_header_bytes=256)
    assert et.TrainingSession(mlp_path, max_arena_bytes=8 << 30, max_header_bytes=128 << 20).step == 0


def test_a_loss_that_is_not_one_number_is_an_execution_error():
    from edgetrain.runtime.steps import loss_value as _scalar

    assert _scalar(np.float32(2.5), "loss") == 2.5 and _scalar(np.array([[1.0]]), "loss") == 1.0
    with pytest.raises(et.ExecutionError, match=r"'loss' came out as float32 of shape \[3\], not one number"):
        _scalar(np.zeros(3, np.float32), "loss")
    with pytest.raises(et.ExecutionError, match="not one number"):
        _scalar(np.array(["a"], dtype=object), "loss")


def test_import_model_takes_the_callers_bound(tmp_path):
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "m",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
        [w],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(et.ModelLimitError, match="m.onnx") as e:
        et.import_model(path, max_bytes=1000)  # 16 KiB of weights
    assert isinstance(e.value, MemoryError)
    assert et.import_model(path, max_bytes=1 << 20).initializers["w"].shape == (64, 64)
