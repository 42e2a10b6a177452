"""A step commits nothing it cannot stand behind: a diverging step (lr 1e30, with momentum and with Adam) leaves the
parameters and the optimizer state bit for bit as they were, every checkpoint a diverging run writes is finite,
training goes on from it at a sane rate, and a checkpoint with a non-finite value or lr is refused on load."""

from __future__ import annotations

import json

import numpy as np
import pytest
from models import MODELS

import edgetrain as et
from edgetrain.core.container import read_container, write_container
from loaders import ArrayDataView, DataLoader

BATCH = 8
OPTIMIZERS = {
    "sgd_momentum": lambda: et.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4),
    "adam": lambda: et.Adam(lr=1e-3),
}


@pytest.fixture(scope="module", params=list(OPTIMIZERS))
def artifact(request, tmp_path_factory):
    art = et.convert(
        MODELS["mlp"][0](),
        loss=et.CrossEntropyLoss(),
        optimizer=OPTIMIZERS[request.param](),
        batch_size=BATCH,
    )
    path = str(tmp_path_factory.mktemp("nonfinite") / f"{request.param}.etrain")
    art.save(path)
    return path


def data(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 784)).astype(np.float32), rng.integers(0, 10, n)


def everything(sess) -> dict[str, np.ndarray]:
    return {k: v.copy() for k, v in sess.snapshot()["values"].items()}


def all_finite(values) -> bool:
    return all(np.isfinite(v).all() for v in values.values())


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_diverging_step_commits_nothing_and_training_goes_on(artifact):
    sess = et.TrainingSession(artifact)
    x, y = data(BATCH)
    sess.train_step(x, y)  # a real step first: momentum and Adam moments are not zero any more
    before, step = everything(sess), sess.step
    sess.lr = 1e30
    with pytest.raises(et.NonFiniteError) as e:
        for _ in range(5):  # the first overflowing step stops here; the ones before it may be finite
            before, step = everything(sess), sess.step
            sess.train_step(x, y)
    assert e.value.step == step + 1 and e.value.values
    assert "nothing was committed" in str(e.value) and "learning rate 1e+30" in str(e.value)
    after = everything(sess)
    assert sess.step == step
    for k, v in before.items():
        np.testing.assert_array_equal(after[k], v, err_msg=k)  # parameters and optimizer state untouched
    assert all_finite(after)
    sess.lr = 0.01
    losses = [sess.train_step(x, y) for _ in range(3)]
    assert all(np.isfinite(losses)) and all_finite(everything(sess))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_non_finite_batch_is_refused_the_same_way(artifact):
    sess = et.TrainingSession(artifact)
    x, y = data(BATCH)
    x[3, 5] = np.nan
    before = everything(sess)
    with pytest.raises(et.NonFiniteError, match="the loss is nan"):
        sess.train_step(x, y)
    for k, v in everything(sess).items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)


class Explodes(et.ILRSchedule):
    """The base rate for the first steps, then 1e30: a run that diverges after it has written good checkpoints."""

    def __init__(self, after: int):
        self.after = after

    def lr_at(self, step: int, base_lr: float) -> float:
        return base_lr if step < self.after else 1e30


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_diverging_run_writes_only_finite_checkpoints_and_resumes_sanely(artifact, tmp_path):
    x, y = data(64, 1)
    ck = tmp_path / "run.etck"
    written = []

    def watch(info):  # every checkpoint the run writes, as it is written
        if info["event"] == "step" and ck.exists():
            written.append(read_container(ck, kind="checkpoint"))

    sess = et.TrainingSession(artifact)
    train = DataLoader(ArrayDataView(x, y), BATCH, shuffle=True, seed=0)
    trainer = et.Trainer(
        sess, train, epochs=5, schedule=Explodes(5), checkpoint=ck, checkpoint_every=1, progress=watch
    )
    res = trainer.fit()
    assert res.stopped_early and res.stop_reason.startswith("non-finite")
    assert "nothing of that step was committed" in res.stop_reason and res.steps >= 5
    header, tensors = read_container(ck, kind="checkpoint")
    assert header["step"] == res.steps and len(written) >= 4
    for h, t in written + [(header, tensors)]:
        assert all_finite(t) and np.isfinite(h["lr"])
    assert all_finite(everything(sess))
    # training goes on from the last checkpoint at a sane rate
    again = et.TrainingSession(artifact)
    again.load_checkpoint(ck)
    again.lr = 0.01
    losses = [again.train_step(x[:BATCH], y[:BATCH]) for _ in range(3)]
    assert all(np.isfinite(losses)) and all_finite(everything(again))


def test_checkpoints_with_non_finite_values_or_lr_are_refused(artifact, tmp_path, monkeypatch):
    sess = et.TrainingSession(artifact)
    good = tmp_path / "good.etck"
    sess.save_checkpoint(good)
    header, tensors = read_container(good, kind="checkpoint")
    name = sess.parameter_names[0]
    bad = {k: np.array(v) for k, v in tensors.items()}
    bad[name].flat[7] = np.inf
    write_container(tmp_path / "inf.etck", kind="checkpoint", header=header, tensors=bad)
    with pytest.raises(et.ArtifactError, match=f"'{name}' holds non-finite values"):
        sess.load_checkpoint(tmp_path / "inf.etck")
    dumps = json.dumps  # edgetrain never writes NaN into a header; a damaged or crafted file may hold one
    monkeypatch.setattr(json, "dumps", lambda *a, **k: dumps(*a, **{**k, "allow_nan": True}))
    for lr in (float("nan"), float("inf"), -1.0, "0.1"):
        write_container(tmp_path / "lr.etck", kind="checkpoint", header={**header, "lr": lr}, tensors=tensors)
        with pytest.raises(et.ArtifactError, match="learning rate"):
            sess.load_checkpoint(tmp_path / "lr.etck")
    write_container(
        tmp_path / "step.etck", kind="checkpoint", header={**header, "step": "abc"}, tensors=tensors
    )
    with pytest.raises(et.ArtifactError, match="step count 'abc'"):
        sess.load_checkpoint(tmp_path / "step.etck")
    with pytest.raises(et.FeedError, match="non-finite"):
        sess.set_parameters({name: np.full_like(tensors[name], np.nan)})
    sess.load_checkpoint(good)  # and the good one still loads
