"""Trainer: closed-form schedules, exact resume after an interruption, the non-finite guard leaves the last good
checkpoint untouched, early stopping, and the JSON-lines history."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from models import MODELS

import edgetrain as et
from edgetrain.runtime.trainer import ConstantLR, CosineLR, StepLR, Trainer, WarmupLR, schedule_from_config
from loaders import ArrayDataView, DataLoader

BATCH = 8


@pytest.fixture(scope="module")
def mlp_path(tmp_path_factory):
    art = et.convert(
        MODELS["mlp"][0](),
        loss=et.CrossEntropyLoss(),
        optimizer=et.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4),
        batch_size=BATCH,
    )
    path = str(tmp_path_factory.mktemp("trainer") / "mlp.etrain")
    art.save(path)
    return path


def data(n, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 784)).astype(np.float32), rng.integers(0, 10, n)


def loaders(train_n=44, val_n=21):
    tx, ty = data(train_n, 1)
    vx, vy = data(val_n, 2)
    train = DataLoader(ArrayDataView(tx, ty), BATCH, shuffle=True, seed=3, drop_last=True)
    val = DataLoader(ArrayDataView(vx, vy), BATCH)  # 21 samples: a short last batch of 5
    return train, val


def strip(history):
    return [{k: v for k, v in r.items() if not k.endswith("seconds")} for r in history]


def test_schedules_closed_form():
    base = 0.2
    for t in range(0, 40):
        assert ConstantLR().lr_at(t, base) == base
        assert StepLR(7, gamma=0.5).lr_at(t, base) == pytest.approx(base * 0.5 ** (t // 7), rel=1e-15)
        T, lo = 25, 0.01
        tt = min(t, T)
        assert CosineLR(T, min_lr=lo).lr_at(t, base) == pytest.approx(
            lo + (base - lo) * (1 + math.cos(math.pi * tt / T)) / 2, rel=1e-15
        )
        W = 5
        inner = lo + (base - lo) * (1 + math.cos(math.pi * tt / T)) / 2
        want = t / W * inner if t < W else inner
        assert WarmupLR(CosineLR(T, min_lr=lo), W).lr_at(t, base) == pytest.approx(want, rel=1e-15, abs=0)
    assert CosineLR(10).lr_at(10, base) == 0.0 and CosineLR(10).lr_at(99, base) == 0.0
    assert WarmupLR(ConstantLR(), 4).lr_at(0, base) == 0.0
    cfg = WarmupLR(StepLR(3, 0.3), 2).config()
    assert cfg == {
        "type": "WarmupLR",
        "warmup_steps": 2,
        "schedule": {"type": "StepLR", "step_size": 3, "gamma": 0.3},
    }
    assert schedule_from_config(cfg).config() == cfg


def test_lr_follows_schedule_in_training(mlp_path):
    train, _ = loaders()
    sess = et.TrainingSession(mlp_path)
    seen = []
    sched = StepLR(2, gamma=0.5)
    Trainer(sess, train, epochs=2, schedule=sched, progress=lambda i: seen.append(i)).fit()
    steps = [i for i in seen if i["event"] == "step"]
    assert [i["step"] for i in steps] == list(range(1, 11))
    assert [i["lr"] for i in steps] == [0.05 * 0.5 ** (t // 2) for t in range(10)]
    assert [i["batch"] for i in steps] == [1, 2, 3, 4, 5] * 2


class Kill(Exception):
    pass


@pytest.mark.parametrize("every,kill_at", [(5, 7), (3, 8)])  # checkpoint at an epoch's end / mid-epoch
def test_resume_is_exact(mlp_path, tmp_path, every, kill_at):
    sched = WarmupLR(CosineLR(15), 3)
    train, val = loaders()
    whole = Trainer(et.TrainingSession(mlp_path), train, val_loader=val, epochs=3, schedule=sched)
    ref = whole.fit()
    assert ref.epochs == 3 and ref.steps == 15 and not ref.stopped_early

    ck = tmp_path / "run.etck"

    def killer(info):
        if info["event"] == "step" and info["step"] == kill_at:
            raise Kill

    train, val = loaders()
    hist = tmp_path / "h.jsonl"
    first = Trainer(
        et.TrainingSession(mlp_path),
        train,
        val_loader=val,
        epochs=3,
        schedule=sched,
        checkpoint=ck,
        checkpoint_every=every,
        history=hist,
        progress=killer,
    )
    with pytest.raises(Kill):
        first.fit()
    train, val = loaders()
    train.restore({**train.state(), "seed": 999})  # the seed comes back from the checkpoint
    sess = et.TrainingSession(mlp_path)
    resumed = Trainer(
        sess,
        train,
        val_loader=val,
        epochs=3,
        schedule=sched,
        checkpoint=ck,
        checkpoint_every=every,
        history=hist,
    )
    res = resumed.fit(resume=True)
    assert res.steps == 15 and res.epochs == 3
    for name, value in whole.session.parameters().items():
        np.testing.assert_array_equal(sess.parameters()[name], value, err_msg=name)
    assert strip(res.history) == strip(ref.history)
    assert res.best == ref.best
    lines = [json.loads(s) for s in hist.read_text().splitlines()]
    assert strip(lines) == strip(res.history)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_nonfinite_guard_keeps_last_checkpoint(mlp_path, tmp_path):
    x, y = data(48, 5)
    made = []

    def poison(xb, yb):  # batch 5 (steps are 1-based: samples 32..39) turns inf after the loaders' own check
        made.append(len(xb))
        if len(made) == 5:
            xb = xb.copy()
            xb[3] = np.inf
        return xb, yb

    # the loaders refuse data holding inf (issue 14), so a batch transform makes one after their check
    train = DataLoader(ArrayDataView(x, y), BATCH, batch_transform=poison)
    ck = tmp_path / "g.etck"
    snap = {}

    def grab(info):
        if info["event"] == "step" and info["step"] == 4:
            snap["bytes"] = ck.read_bytes()

    sess = et.TrainingSession(mlp_path)
    res = Trainer(sess, train, epochs=3, checkpoint=ck, checkpoint_every=2, progress=grab).fit()
    assert res.stopped_early and res.steps == 4 and res.epochs == 0
    assert "non-finite loss" in res.stop_reason and "at step 5" in res.stop_reason
    assert ck.read_bytes() == snap["bytes"]
    good = et.TrainingSession(mlp_path)
    assert good.load_checkpoint(ck)["step"] == 4
    for name, value in good.parameters().items():  # parameters were put back to those before the bad step
        assert np.isfinite(value).all()
        np.testing.assert_array_equal(sess.parameters()[name], value, err_msg=name)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_huge_lr_stops(mlp_path):
    train, _ = loaders()
    sess = et.TrainingSession(mlp_path)
    sess.lr = 1e30
    res = Trainer(sess, train, epochs=5).fit()
    assert (
        res.stopped_early
        and "non-finite update of" in res.stop_reason
        and "would overflow" in res.stop_reason
    )
    assert res.steps == 0 and "at step 1 " in res.stop_reason  # lr 1e30 makes the very first update unusable


def test_early_stopping_and_history(mlp_path, tmp_path):
    train, val = loaders()
    sess = et.TrainingSession(mlp_path)
    sess.lr = 0.0
    hist = tmp_path / "h.jsonl"
    res = Trainer(
        sess,
        train,
        val_loader=val,
        epochs=10,
        early_stopping={"metric": "val_loss", "patience": 2, "min_delta": 0.0},
        history=hist,
    ).fit()
    assert res.stopped_early and res.epochs == 3 and "early stopping" in res.stop_reason
    assert res.metric == "val_loss" and res.best == res.history[0]["val_loss"]
    lines = [json.loads(s) for s in hist.read_text().splitlines()]
    assert lines == res.history
    timing = {"seconds", "train_seconds", "val_seconds"}
    assert set(lines[0]) == {"epoch", "step", "train_loss", "val_loss", "val_accuracy", "lr"} | timing
    for r in lines:  # the epoch's time is its training's and its validation's
        assert r["seconds"] == pytest.approx(r["train_seconds"] + r["val_seconds"], abs=2e-6)
    assert [r["epoch"] for r in lines] == [1, 2, 3] and [r["step"] for r in lines] == [5, 10, 15]

    # the validation numbers against an independent computation: per-sample loss, argmax accuracy
    vx, vy = data(21, 2)
    logits = sess.run(vx).astype(np.float64)
    logp = logits - logits.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    want_loss = -logp[np.arange(21), vy].mean()
    want_acc = float(np.mean(np.argmax(logits, 1) == vy))
    for r in lines:
        assert r["val_loss"] == pytest.approx(want_loss, rel=1e-5)
        assert r["val_accuracy"] == want_acc


def test_bad_settings(mlp_path):
    train, val = loaders()
    sess = et.TrainingSession(mlp_path)
    with pytest.raises(ValueError, match="needs a val_loader"):
        Trainer(sess, train, early_stopping={"metric": "val_loss"})
    with pytest.raises(ValueError, match="batch 8"):
        Trainer(sess, DataLoader(ArrayDataView(*data(16, 0)), 4))
    with pytest.raises(ValueError, match="drop_last=True"):
        Trainer(sess, DataLoader(ArrayDataView(*data(20, 0)), 8))
    with pytest.raises(ValueError, match="checkpoint path"):
        Trainer(sess, train, checkpoint_every=3)


def test_early_stopping_keeps_the_best_weights(mlp_path, tmp_path):
    """Validation labels that disagree with training labels: the more the model learns, the worse it does on
    validation, so the best epoch is the first; the trainer keeps its weights (in run.best.etck beside run.etck)
    and says so."""
    tx, ty = data(40, 1)
    train = DataLoader(ArrayDataView(tx, ty), BATCH, shuffle=True, seed=0, drop_last=True)
    val = DataLoader(ArrayDataView(tx[:16], (ty[:16] + 1) % 10), BATCH)
    ck = tmp_path / "run.etck"
    sess = et.TrainingSession(mlp_path)
    seen = {}

    def grab(info):  # the weights at the end of each epoch, as the trainer evaluates them
        if info["event"] == "epoch":
            seen[info["epoch"]] = sess.parameters()

    trainer = Trainer(
        sess,
        train,
        val_loader=val,
        epochs=8,
        checkpoint=ck,
        early_stopping={"metric": "val_loss", "patience": 2},
        progress=grab,
    )
    res = trainer.fit()
    losses = [r["val_loss"] for r in res.history]
    best = int(np.argmin(losses)) + 1
    assert res.stopped_early and best < res.epochs, losses
    assert (
        res.kept == "best"
        and res.best_epoch == best
        and res.best_checkpoint == str(tmp_path / "run.best.etck")
    )
    assert f"kept the best weights, of epoch {best}" in res.stop_reason
    for name, value in sess.parameters().items():  # the session holds the best epoch's weights
        np.testing.assert_array_equal(value, seen[best][name], err_msg=name)
    last, best_ck = et.TrainingSession(mlp_path), et.TrainingSession(mlp_path)
    last.load_checkpoint(ck)
    best_ck.load_checkpoint(res.best_checkpoint)
    for name in seen[best]:
        np.testing.assert_array_equal(best_ck.parameters()[name], seen[best][name], err_msg=name)
        np.testing.assert_array_equal(last.parameters()[name], seen[res.epochs][name], err_msg=name)
    assert trainer.evaluate()[0] == pytest.approx(min(losses), rel=1e-6)

    # without a checkpoint path the best weights are kept in memory
    sess2 = et.TrainingSession(mlp_path)
    train.restore({**train.state(), "epoch": 0, "position": 0})
    res2 = Trainer(
        sess2, train, val_loader=val, epochs=8, early_stopping={"metric": "val_loss", "patience": 2}
    ).fit()
    assert res2.kept == "best" and res2.best_checkpoint is None
    for name, value in sess2.parameters().items():
        np.testing.assert_array_equal(value, seen[best][name], err_msg=name)


def test_resume_refuses_other_data_and_other_settings(mlp_path, tmp_path):
    ck = tmp_path / "run.etck"
    train, val = loaders()
    Trainer(
        et.TrainingSession(mlp_path), train, val_loader=val, epochs=1, schedule=CosineLR(10), checkpoint=ck
    ).fit()
    grown = DataLoader(ArrayDataView(*data(52, 1)), BATCH, shuffle=True, seed=3, drop_last=True)
    with pytest.raises(et.ConfigError, match="other training data.*44 samples then, 52 now.*--init-from"):
        Trainer(
            et.TrainingSession(mlp_path),
            grown,
            val_loader=val,
            epochs=2,
            schedule=CosineLR(10),
            checkpoint=ck,
        ).fit(resume=True)
    train, val = loaders()
    with pytest.raises(et.ConfigError, match="schedule was .*CosineLR.*but this trainer's is .*ConstantLR"):
        Trainer(et.TrainingSession(mlp_path), train, val_loader=val, epochs=2, checkpoint=ck).fit(resume=True)
    train, val = loaders()  # the same settings, more epochs: a longer run
    res = Trainer(
        et.TrainingSession(mlp_path), train, val_loader=val, epochs=2, schedule=CosineLR(10), checkpoint=ck
    ).fit(resume=True)
    assert res.epochs == 2 and res.steps == 10
