"""Training runs a person can stop, continue and read, end to end in real `edgetrain` processes on the shipped digits
and LeNet: Ctrl-C and SIGTERM save the step a run stopped at and print the command that continues it, which ends bit
for bit where an uninterrupted run does, --log and --plot included; --resume needs only the checkpoint and refuses a
contradicting flag or other data; the summary times training apart from validation; --plot; inspect's history table;
Trainer.request_stop from another thread."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from device import run_on_device
from interrupts import Lines, finish, python_m
from test_cli import cli, ok

import edgetrain as et
from edgetrain.core.container import read_container
from edgetrain.runtime.trainer import Trainer
from loaders import ArrayDataView, DataLoader, open_data

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "edgetrain" / "data"
DIGITS, NEWUSER = DATA / "digits", DATA / "newuser"  # 1,050 training digits (105 steps of 10), and 50
PNG = b"\x89PNG\r\n\x1a\n"
EPOCHS = 2


def tensors(path) -> dict[str, np.ndarray]:
    return read_container(path, kind="checkpoint")[1]


def records(log: Path) -> list[dict]:
    """The --log records without their timings."""
    rows = [json.loads(s) for s in log.read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.endswith("seconds")} for r in rows]


def assert_same_run(got: Path, want: Path, got_log: Path, want_log: Path) -> None:
    """The parameters and optimizer state bit for bit, and the history line for line, timings apart."""
    a, b = tensors(got), tensors(want)
    assert sorted(a) == sorted(b)
    for name in b:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert records(got_log) == records(want_log)


@pytest.fixture(scope="module")
def lenet(tmp_path_factory) -> Path:
    """The shipped LeNet as an artifact that trains every layer, at batch 10."""
    art = tmp_path_factory.mktemp("lenet") / "lenet.etrain"
    ok(cli("convert", DATA / "digits_lenet.onnx", "-o", art, "--batch-size", 10))
    return art


def fresh(lenet: Path, where: Path) -> Path:
    """A copy of the artifact in its own folder, so that its default checkpoint is the test's own."""
    where.mkdir(exist_ok=True)
    return Path(shutil.copy(lenet, where / lenet.name))


RUN = ["--data", DIGITS, "--val-data", DIGITS, "--epochs", EPOCHS]


@pytest.fixture(scope="module")
def reference(lenet, tmp_path_factory) -> dict[str, Path]:
    """The uninterrupted run the interrupted ones must end as: its checkpoint, history and plot."""
    out = tmp_path_factory.mktemp("reference")
    files = {"checkpoint": out / "ref.etck", "log": out / "ref.jsonl", "plot": out / "ref.png"}
    ok(cli("train", fresh(lenet, out), *RUN, *[a for k, p in files.items() for a in (f"--{k}", p)]))
    return files


def run_as_printed(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """A printed `edgetrain ...` command, run as a person would run it (this interpreter's edgetrain)."""
    words = shlex.split(command)
    assert words[0] == "edgetrain", command
    return cli(*words[1:], cwd=cwd)


def pixels(path: Path) -> np.ndarray:
    image = pytest.importorskip("matplotlib.image")
    return image.imread(path)


# ---- Ctrl-C and SIGTERM: the step saved, the command printed, the run continued bit for bit --------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    "sig,own_checkpoint",
    [(signal.SIGINT, False), (signal.SIGTERM, True)],
    ids=["ctrl-c", "sigterm-own-checkpoint"],
)
def test_a_signal_saves_the_step_and_the_printed_command_continues_the_run_exactly(
    lenet, reference, tmp_path, sig, own_checkpoint
):
    art = fresh(lenet, tmp_path)
    log, plot = tmp_path / "run.jsonl", tmp_path / "run.png"
    checkpoint = tmp_path / "mine.etck" if own_checkpoint else tmp_path / "lenet.etck"
    own = ["--checkpoint", checkpoint] if own_checkpoint else []
    args = ["train", art, *RUN, "--log", log, "--plot", plot, *own]
    proc = subprocess.Popen(
        python_m("edgetrain.cli", *args, step_pause=0.02),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    err.wait_for(lambda line: line.startswith("epoch   1"), "epoch 1 ended")
    time.sleep(0.5)  # into epoch 2's 105 steps (each paced to 20 ms or more): the signal lands mid-epoch
    proc.send_signal(sig)
    code = finish(proc, 120, out, err)
    stdout, stderr = out.text(10), err.text(10)
    assert code == 128 + sig, stdout + stderr
    assert "Traceback" not in stderr

    header, _ = read_container(checkpoint, kind="checkpoint")  # whole: its checksum verifies
    state = header["user_state"]
    step, position = header["step"], state["loader"]["position"]
    assert 105 < step < 210 and state["epoch"] == 1 and position == (step - 105) * 10, (step, position)
    name = "Ctrl-C" if sig == signal.SIGINT else "SIGTERM"
    assert f"{name}: stopping after this step" in stderr
    assert f"checkpoint  {checkpoint}: step {step} (epoch 2 of 2, {step - 105} of 105 batches done)" in stdout
    command = re.search(r"^continue with: (.*)$", stdout, re.M).group(1)
    want = f"edgetrain train {art} --resume" + (f" --checkpoint {checkpoint}" if own_checkpoint else "")
    assert command == want
    assert len(log.read_text().splitlines()) == 1

    resumed = ok(run_as_printed(command, tmp_path))  # no --data, --log or --plot: the checkpoint has them
    assert f"resuming from {checkpoint}: 1 epoch(s), {step} steps done" in resumed.stderr
    assert f"this run: {210 - step} steps in" in resumed.stdout
    assert_same_run(checkpoint, reference["checkpoint"], log, reference["log"])
    np.testing.assert_array_equal(pixels(plot), pixels(reference["plot"]))  # the whole history, drawn alike


@pytest.mark.slow
def test_a_second_ctrl_c_quits_at_once_and_leaves_a_whole_checkpoint(lenet, reference, tmp_path):
    """Two Ctrl-C in a row: the run stops either after saving its step (the second came during the write, which
    is let finish) or at once, with the last periodic checkpoint on disk. Either way the file is whole and the
    printed command ends the run where an uninterrupted one ends."""
    art = fresh(lenet, tmp_path)
    log = tmp_path / "run.jsonl"
    args = ["train", art, *RUN, "--log", log, "--checkpoint-every", 20]
    proc = subprocess.Popen(
        python_m("edgetrain.cli", *args, step_pause=0.02),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    err.wait_for(lambda line: line.startswith("epoch   1"), "epoch 1 ended")
    proc.send_signal(signal.SIGINT)
    err.wait_for(lambda line: "Ctrl-C: stopping" in line, "the first Ctrl-C was seen")
    proc.send_signal(signal.SIGINT)
    code = finish(proc, 120, out, err)
    stdout, stderr = out.text(10), err.text(10)
    # (-SIGINT: the second came after everything was saved and said, as the process ended; a shell shows 130 too)
    assert code in (130, -signal.SIGINT) and "Traceback" not in stderr, stdout + stderr
    step = read_container(tmp_path / "lenet.etck", kind="checkpoint")[0]["step"]
    if "without saving" in stdout:
        assert step % 20 == 0 or step == 105, step  # a periodic checkpoint, or epoch 1's end
    command = re.search(r"^continue with: (.*)$", stdout, re.M).group(1)
    ok(run_as_printed(command, tmp_path))
    assert_same_run(tmp_path / "lenet.etck", reference["checkpoint"], log, reference["log"])


# ---- --resume needs only the checkpoint, and refuses what would not continue the run --------------------------------
def small_npz(path: Path, n: int = 20, *, flip: bool = False) -> Path:
    """The first n of the new user's digits as an .npz of 8-bit pixels, as the model's input pipeline takes them
    (flip: the same number of other images)."""
    x, y = open_data(str(NEWUSER), split="train").raw().get_batch(np.arange(n))
    x = x.astype(np.uint8)
    np.savez(path, x=x[..., ::-1] if flip else x, y=y)
    return path


def test_resume_needs_only_the_artifact_and_continues_the_log(lenet, tmp_path):
    art, data = fresh(lenet, tmp_path), small_npz(tmp_path / "mine.npz")
    ok(cli("train", art, "--data", data, "--epochs", 2, "--seed", 4, "--log", tmp_path / "a.jsonl"))
    proc = ok(
        cli("train", art, "--resume", "--epochs", 3)
    )  # a run made longer: only the artifact, and --epochs
    assert f"on {data}:" in proc.stderr and "2 epoch(s), 4 steps done" in proc.stderr
    lines = [json.loads(s) for s in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in lines] == [1, 2, 3] and [r["step"] for r in lines] == [2, 4, 6]

    # the same three epochs in one run: the same numbers
    other = fresh(lenet, tmp_path / "other")
    ok(cli("train", other, "--data", data, "--epochs", 3, "--seed", 4, "--log", tmp_path / "b.jsonl"))
    assert_same_run(
        tmp_path / "lenet.etck", tmp_path / "other" / "lenet.etck", tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    )

    proc = cli("train", art)
    assert proc.returncode == 2 and "--data is required" in proc.stderr, proc.stderr


def test_resume_refuses_a_contradicting_flag_and_other_data(lenet, tmp_path):
    art, data = fresh(lenet, tmp_path), small_npz(tmp_path / "mine.npz")
    ok(cli("train", art, "--data", data, "--epochs", 1, "--seed", 4))
    before = tensors(tmp_path / "lenet.etck")

    proc = cli("train", art, "--resume", "--epochs", 2, "--seed", 5)
    assert proc.returncode == 2, proc.stderr
    assert "--seed 5 conflicts with the run in" in proc.stderr and "--init-from" in proc.stderr

    small_npz(data, n=30)  # another file under the same name: more samples
    proc = cli("train", art, "--resume", "--epochs", 2)
    assert proc.returncode == 1, proc.stderr
    assert f"{data} is not the data the run in" in proc.stderr and "20 samples then, 30 now" in proc.stderr
    assert f"--data {data} --init-from {tmp_path / 'lenet.etck'}" in proc.stderr

    small_npz(data, flip=True)  # as many samples as the run's, but other ones
    proc = cli("train", art, "--resume", "--epochs", 2)
    assert proc.returncode == 1 and "20 samples then and now, but other ones" in proc.stderr, proc.stderr

    data.unlink()
    proc = cli("train", art, "--resume", "--epochs", 2)
    assert proc.returncode == 1 and "which is not there any more" in proc.stderr, proc.stderr
    after = tensors(tmp_path / "lenet.etck")
    assert all(np.array_equal(before[k], after[k]) for k in before)  # nothing was trained or written

    # what the messages advise: a new run on the new data from the run's weights
    small_npz(data, n=30)
    ok(cli("train", art, "--data", data, "--init-from", tmp_path / "lenet.etck"))


def digit_loaders(n: int = 50) -> tuple[DataLoader, DataLoader]:
    """The new user's digits as the model takes them, shuffled, batch 10; and its test digits for validation."""

    def view(split, count):
        x, y = open_data(str(NEWUSER), split=split).get_batch(np.arange(count))
        return ArrayDataView(x.reshape(-1, 1, 28, 28).astype(np.float32), y)

    return DataLoader(view("train", n), 10, shuffle=True, seed=1), DataLoader(view("test", 100), 10)


KILLED = """
import os, signal, sys
sys.path[:0] = ["tests/cli", "tests/harness"]
from test_runs import digit_loaders
import edgetrain as et
from edgetrain.runtime.trainer import Trainer
train, val = digit_loaders()
def progress(info):
    if info["event"] == "step" and info["step"] == 11:  # epoch 2 ended at step 10 and was logged; saved at step 9
        os.kill(os.getpid(), signal.SIGKILL)
Trainer(et.TrainingSession(sys.argv[1]), train, val_loader=val, epochs=3, checkpoint=sys.argv[2],
        checkpoint_every=3, history=sys.argv[3], progress=progress).fit()
"""


def test_resume_cuts_the_log_lines_written_after_its_checkpoint(lenet, tmp_path):
    """A run killed after it logged an epoch its checkpoint does not hold: the resumed run does that epoch again,
    and the log reads as an uninterrupted run's, not with that epoch twice."""
    ckpt, log = tmp_path / "run.etck", tmp_path / "run.jsonl"
    proc = subprocess.run(
        [sys.executable, "-c", KILLED, str(lenet), str(ckpt), str(log)],
        cwd=ROOT,
        timeout=300,
        capture_output=True,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert read_container(ckpt, kind="checkpoint")[0]["step"] == 9
    assert [json.loads(s)["epoch"] for s in log.read_text().splitlines()] == [
        1,
        2,
    ]  # epoch 2: past the checkpoint

    train, val = digit_loaders()
    resumed = Trainer(
        et.TrainingSession(lenet), train, val_loader=val, epochs=3, checkpoint=ckpt, history=log
    )
    assert resumed.fit(resume=True).steps == 15
    train, val = digit_loaders()
    ref_log = tmp_path / "ref.jsonl"
    whole = Trainer(et.TrainingSession(lenet), train, val_loader=val, epochs=3, checkpoint=tmp_path / "ref.etck",
                    history=ref_log)  # fmt: skip
    whole.fit()
    assert_same_run(ckpt, tmp_path / "ref.etck", log, ref_log)


# ---- Trainer.request_stop: an app stops a run -------------------------------------------------------------------
def test_request_stop_from_another_thread_saves_and_resume_is_exact(lenet, tmp_path):
    """An app's UI thread asks the training thread to stop (the user left); fit() saves the step it stopped at
    and a new Trainer continues the run to the numbers of an uninterrupted one."""
    train, val = digit_loaders()
    whole = Trainer(et.TrainingSession(lenet), train, val_loader=val, epochs=2)
    ref = whole.fit()

    ckpt, log = tmp_path / "run.etck", tmp_path / "run.jsonl"
    train, val = digit_loaders()
    trainer = Trainer(
        et.TrainingSession(lenet), train, val_loader=val, epochs=2, checkpoint=ckpt, history=log
    )
    ui = threading.Thread(target=trainer.request_stop, args=("the user left",))

    def progress(info):
        if info["event"] == "step" and info["step"] == 7:
            ui.start()
            ui.join()

    trainer.progress = progress
    res = trainer.fit()
    assert res.interrupted and res.stopped_early and res.steps == 7 and res.epochs == 1
    assert res.stop_reason.startswith("the user left at step 7 (in epoch 2 of 2, 2 of 5 batches done)")
    header, _ = read_container(ckpt, kind="checkpoint")
    assert header["step"] == 7 and header["user_state"]["loader"]["position"] == 20
    assert trainer.saved_step == 7 and not trainer.writing

    train, val = digit_loaders()
    sess = et.TrainingSession(lenet)
    again = Trainer(sess, train, val_loader=val, epochs=2, checkpoint=ckpt, history=log).fit(resume=True)
    assert not again.interrupted and again.steps == 10
    for name, value in whole.session.parameters().items():
        np.testing.assert_array_equal(sess.parameters()[name], value, err_msg=name)
    strip = [{k: v for k, v in r.items() if not k.endswith("seconds")} for r in ref.history]
    assert [{k: v for k, v in r.items() if not k.endswith("seconds")} for r in again.history] == strip
    assert [{k: v for k, v in json.loads(s).items() if not k.endswith("seconds")}
            for s in log.read_text().splitlines()] == strip  # fmt: skip

    # asked before fit() starts: it stops at once, and saves the step it is at
    train, _ = digit_loaders()
    early = Trainer(et.TrainingSession(lenet), train, checkpoint=tmp_path / "early.etck")
    early.request_stop()
    res = early.fit()
    assert res.interrupted and res.steps == 0 and res.stop_reason.startswith("stop requested at step 0")
    assert read_container(tmp_path / "early.etck", kind="checkpoint")[0]["step"] == 0
    res = early.fit()  # the request was that fit()'s: this one runs the epoch
    assert not res.interrupted and res.steps == 5


# ---- times, plot, inspect -----------------------------------------------------------------------------------------
def test_summary_times_training_apart_from_validation(lenet, tmp_path):
    art, data, log = fresh(lenet, tmp_path), small_npz(tmp_path / "mine.npz"), tmp_path / "run.jsonl"
    proc = ok(cli("train", art, "--data", data, "--val-data", NEWUSER, "--epochs", 2, "--log", log))
    lines = [json.loads(s) for s in log.read_text().splitlines()]
    train = sum(r["train_seconds"] for r in lines)
    val = sum(r["val_seconds"] for r in lines)
    for r in lines:
        assert r["seconds"] == pytest.approx(r["train_seconds"] + r["val_seconds"], abs=2e-6)
    got = re.search(
        r"this run: 4 steps in ([\d.]+) s of training \([\d,]+ samples/s\), validation ([\d.]+) s;",
        proc.stdout,
    )
    assert got, proc.stdout
    assert float(got.group(1)) == pytest.approx(train, abs=0.051)  # printed to 0.1 s
    assert float(got.group(2)) == pytest.approx(val, abs=0.051)
    assert re.search(r"epoch   2  .*  train [\d.]+ s, validation [\d.]+ s", proc.stderr), proc.stderr


def test_plot_draws_the_curves_and_a_missing_matplotlib_is_a_note(lenet, tmp_path):
    art, data = fresh(lenet, tmp_path), small_npz(tmp_path / "mine.npz")
    png = tmp_path / "curves.png"
    proc = ok(cli("train", art, "--data", data, "--val-data", NEWUSER, "--epochs", 3, "--plot", png))
    assert f"plot        {png}" in proc.stdout
    assert png.read_bytes()[:8] == PNG
    image = pixels(png)
    assert image.ndim == 3 and image.shape[1] > image.shape[0] > 300  # two panels side by side
    colors = np.unique(image.reshape(-1, image.shape[2]), axis=0)
    assert len(colors) > 50 and float(image.std()) > 0.05  # drawn: axes, curves, text; not a blank page

    # the same run where matplotlib cannot be imported, as on a phone: a note, and the run is complete
    png.unlink()
    device = run_on_device(
        sys.executable,
        """
        from edgetrain.cli import main
        assert main(["train", sys.argv[1], "--data", sys.argv[2], "--overwrite", "--plot", sys.argv[3]]) == 0
        """,
        str(art),
        str(data),
        str(png),
        blocked=("matplotlib",),
    )
    assert device.returncode == 0, device.stderr
    assert "no plot drawn, matplotlib is not installed" in device.stderr and not png.exists()
    assert read_container(tmp_path / "lenet.etck", kind="checkpoint")[0]["step"] == 2


def test_inspect_shows_a_long_history_as_a_short_table(lenet, tmp_path):
    art, data = fresh(lenet, tmp_path), small_npz(tmp_path / "mine.npz", n=10)  # one step an epoch
    ok(cli("train", art, "--data", data, "--epochs", 50))
    ckpt = tmp_path / "lenet.etck"
    history = read_container(ckpt, kind="checkpoint")[0]["user_state"]["history"]
    assert len(history) == 50
    text = ok(cli("inspect", ckpt)).stdout
    lines = text.splitlines()
    assert max(map(len, lines)) < 160 and len(lines) < 50, text
    assert "history    50 epoch(s); the last 10 (... 40 earlier epochs)" in text
    table = lines[lines.index(next(s for s in lines if s.startswith("history"))) + 1 :][:11]
    assert table[0].split() == ["epoch", "step", "train", "loss", "lr", "train", "s"]
    for row, record in zip(table[1:], history[40:]):  # the rows are the last ten records, in order
        assert row.split()[:4] == [str(record["epoch"]), str(record["step"]), f"{record['train_loss']:.4f}",
                                   f"{record['lr']:.3g}"]  # fmt: skip
    summary = json.loads(ok(cli("inspect", ckpt, "--json")).stdout)  # everything, and the pipeline
    keys = {"path", "size_bytes", "kind", "step", "lr", "user_state", "tensors", "preprocessing"}
    assert set(summary) == keys
    assert summary["user_state"]["history"] == history
