"""Resuming a run from a crafted checkpoint (issue 33, surface "resume"). A real Trainer's checkpoint, its header
re-encoded with a valid checksum after one edit: every key of the run's record (the trainer's position, settings,
loader, history, best, run options: nested keys too) deleted, set to None, to a list, a string, a negative, a huge
or a non-finite number, and Hypothesis-generated values besides. `Trainer.fit(resume=True)` either refuses it with an
EdgeTrainError naming the file and the field, leaving the session as it was, or resumes and ends exactly where a
run resumed from the untouched checkpoint ends (the edit was to a value the run does not depend on)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from crafting import DELETE, crafted, encode
from hostile import Tally
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from models import MODELS

import edgetrain as et
from edgetrain.core.container import read_container
from edgetrain.runtime.trainer import Trainer
from loaders import ArrayDataView, DataLoader

BATCH = 8
MUTATIONS = {
    "deleted": DELETE,
    "None": None,
    "a list": [1, 2],
    "a string": "x",
    "negative": -3,
    "huge": 10**30,
    "nan": float("nan"),
    "a float": 2.5,
}


def _loaders():
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((40, 784)).astype(np.float32), rng.integers(0, 10, 40)
    vx, vy = rng.standard_normal((16, 784)).astype(np.float32), rng.integers(0, 10, 16)
    train = DataLoader(ArrayDataView(x, y), BATCH, shuffle=True, seed=3, drop_last=True)
    return train, DataLoader(ArrayDataView(vx, vy), BATCH)


def _trainer(path, checkpoint, epochs=4):
    train, val = _loaders()
    return Trainer(et.TrainingSession(path), train, val_loader=val, epochs=epochs, checkpoint=str(checkpoint))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(artifact, a checkpoint after 2 of 4 epochs, the parameters a resumed run ends with)."""
    d = tmp_path_factory.mktemp("resume")
    art = et.convert(
        MODELS["mlp"][0](),
        loss=et.CrossEntropyLoss(),
        optimizer=et.SGD(lr=0.05, momentum=0.9),
        batch_size=BATCH,
    )
    path = d / "mlp.etrain"
    art.save(path)
    _trainer(path, d / "run.etck", epochs=2).fit()
    ends = _trainer(path, d / "run.etck")
    ends.fit(resume=True)
    again = d / "again.etck"
    _trainer(path, again, epochs=2).fit()
    return path, again, ends.session.parameters()


def key_paths(value, prefix=()):
    """Every path of keys (and first list items) into the run's record."""
    if isinstance(value, dict):
        for k in value:
            yield (*prefix, k)
            yield from key_paths(value[k], (*prefix, k))
    elif isinstance(value, list) and value:
        yield (*prefix, 0)
        yield from key_paths(value[0], (*prefix, 0))


def _try(tally: Tally, run, tmp_path, path: tuple, value, case: str) -> None:
    artifact, source, ends = run
    header, tensors = read_container(source)
    target = tmp_path / "crafted.etck"
    arrays = {k: np.array(v) for k, v in tensors.items()}
    target.write_bytes(encode(crafted(header, path, value), arrays, kind="checkpoint"))
    fields = [str(k) for k in path if isinstance(k, str)]
    with tally.case(case, names=str(target), either=True):
        trainer = _trainer(artifact, target)
        before = trainer.session.snapshot()
        try:
            trainer.fit(resume=True)
        except et.EdgeTrainError as e:
            after = trainer.session.snapshot()
            assert after["step"] == before["step"], "a refused resume moved the session"
            for k, v in before["values"].items():
                np.testing.assert_array_equal(
                    after["values"][k], v, err_msg="a refused resume changed the session"
                )
            assert any(f in str(e) for f in fields), f"the refusal names none of {fields}: {e}"
            raise
        got = trainer.session.parameters()  # resumed: it must end where the untouched run ends
        for k, v in ends.items():
            np.testing.assert_array_equal(got[k], v, err_msg=f"{case}: {k}")


@pytest.mark.slow  # 408 resumes, about 40 s
def test_every_key_of_the_run_record_crafted(run, tmp_path, report):
    header, _ = read_container(run[1])
    tally = Tally("resume (crafted run records)")
    for path in key_paths({"user_state": header["user_state"]}):
        for how, value in MUTATIONS.items():
            _try(
                tally,
                run,
                tmp_path,
                path,
                value if value is DELETE else copy.deepcopy(value),
                f"{'.'.join(map(str, path))} {how}",
            )
    report("hostile inputs", tally.line())
    tally.assert_clean()
    assert tally.refused > 100


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_generated_values_in_the_run_record(run, tmp_path, report, data):
    header, _ = read_container(run[1])
    paths = list(key_paths({"user_state": header["user_state"]}))
    path = data.draw(st.sampled_from(paths))
    value = data.draw(JSON)
    tally = Tally("resume (generated values)")
    _try(tally, run, tmp_path, path, value, f"{'.'.join(map(str, path))} = {value!r}"[:120])
    tally.assert_clean()
