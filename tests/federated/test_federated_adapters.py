"""`edgetrain federate --adapters-only`: only a LoRA artifact's adapters cross the network. One real Flower deployment
on 127.0.0.1 (edgetrain's own superlink and supernode processes, as tests/federated/test_federated.py's) on
the digits LeNet
with rank-4 adapters on fc1 and fc2 and its head fc3 trained beside them, federated over the new user's digits:
every round carries exactly the adapters' bytes each way (a small share of the model's), the global adapters are
the sample-weighted mean of the clients' own adapter files, the head stays on each device, the frozen base is bit
for bit the model's on every client, and accuracy improves. Without Flower's processes: the refusal of an artifact
without adapters, the option's way into the run config, and which parameters are shared and which stay."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import edgetrain as et
from edgetrain.core.errors import ConfigError

flwr = pytest.importorskip(
    "flwr", reason="Flower is the extra 'federated': pip install 'edgetrain[federated]'"
)

from test_federated import ROOT, client_records, federate, live_flower_processes  # noqa: E402

LENET = ROOT / "edgetrain" / "data" / "digits_lenet.onnx"
NEWUSER = ROOT / "edgetrain" / "data" / "newuser"  # 50 digits to share out, 400 held out for the server
BODY = ["fc1.lora_A", "fc1.lora_B", "fc2.lora_A", "fc2.lora_B"]
HEAD = ["fc3.weight", "fc3.bias"]


def convert(path: Path, lora: bool = True) -> Path:
    """The digits LeNet as an artifact: with rank-4 adapters on fc1 and fc2 and the head fc3 trained beside them
    (lora), or plain."""
    extra = {"adapters": et.LoRA(rank=4, alpha=8, targets=["fc1*", "fc2*"]), "trainable": ["fc3.*"]}
    art = et.convert(
        str(LENET), loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=0.01, momentum=0.9), batch_size=8,
        **(extra if lora else {}),
    )  # fmt: skip
    art.save(path)
    return path


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("federated-adapters")
    return {"lora": convert(d / "lora.etrain"), "plain": convert(d / "plain.etrain", lora=False)}


def model_weights() -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in onnx.load(str(LENET)).graph.initializer}


def adapters_of(art: Path, path: Path) -> dict[str, np.ndarray]:
    sess = et.TrainingSession(str(art))
    sess.load_adapters(path)
    return {k: v for k, v in sess.parameters().items() if k in BODY}


def adapters_run(folder: Path) -> tuple[subprocess.CompletedProcess, str]:
    """The federation, in the background (tests/conftest.py), with the artifact's digest before it."""
    art = convert(folder / "lora.etrain")
    digest = hashlib.sha256(art.read_bytes()).hexdigest()
    proc = federate(
        art, "--adapters-only", "--data", NEWUSER, "--val-data", NEWUSER, "--clients", 2, "--rounds", 2,
        "--local-epochs", 5, "--partition", "label-skew", "--out", folder / "run",
    )  # fmt: skip
    return proc, digest


@pytest.mark.slow
@pytest.mark.background(job=adapters_run)
def test_only_the_adapters_cross_the_network(background, report):
    (proc, digest), folder = background
    art, out = folder / "lora.etrain", folder / "run"
    s = json.loads((out / "summary.json").read_text())
    initial = et.TrainingSession(str(art)).parameters()
    adapter_bytes = sum(initial[n].nbytes for n in BODY)
    model = sum(v.nbytes for v in model_weights().values())  # 61,706 float32 weights
    # what crossed: the adapters alone, each way, every round; the head is personal
    assert s["adapters_only"] and s["shared"] == sorted(BODY) and s["personal"] == HEAD
    assert s["model_bytes"] == model and s["adapters"]["trained_beside"] == HEAD
    assert [r["round"] for r in s["rounds"]] == [1, 2]
    for r in s["rounds"]:
        p = r["payload_bytes"]
        assert p["per_client_sent"] == p["per_client_received"] == adapter_bytes and p["clients"] == 2, r
        assert p["total"] == 4 * adapter_bytes
    assert (
        s["payload_bytes"]["total"] == 2 * 4 * adapter_bytes and s["payload_bytes"]["share_of_model"] < 0.05
    )
    for _, arrays, log in client_records(out):  # each device's own record of what it sent and received
        assert sorted(arrays) == sorted(BODY)
        assert all(
            r["names"] == sorted(BODY) and r["bytes_sent"] == r["bytes_received"] == adapter_bytes
            for r in log
        )
    assert "11.3 KiB sent, 11.3 KiB received per client (4.7% of the model's 241.0 KiB)" in proc.stderr
    assert "only they crossed the network" in proc.stdout
    # the global adapters are the sample-weighted mean of the clients' own adapter files after the last round
    records = client_records(out)
    homes = sorted((out / "clients").iterdir())
    total = sum(n for n, _, _ in records)
    mine = [adapters_of(art, home / "adapters.etad") for home in homes]
    glob = adapters_of(art, out / "global.etad")
    for name in BODY:
        want = sum(n * a[name].astype(np.float64) for (n, _, _), a in zip(records, mine)) / total
        np.testing.assert_allclose(glob[name], want, rtol=1e-5, atol=1e-7, err_msg=name)
        np.testing.assert_array_equal(mine[0][name], records[0][1][name])  # the file is what the device sent
    # the base is bit for bit the model's on every device; the head is each device's own, the server's the initial
    base = model_weights()
    heads = []
    for home in homes:
        sess = et.TrainingSession(str(art))
        assert sess.load_checkpoint(home / "client.etck")["round"] == 2
        sess.export_onnx(home / "served.onnx", adapters="serving")
        served = {
            i.name: numpy_helper.to_array(i) for i in onnx.load(str(home / "served.onnx")).graph.initializer
        }
        for name, value in base.items():
            if name not in HEAD:
                assert served[name].tobytes() == value.tobytes(), name
        heads.append(sess.parameters()["fc3.weight"])
    assert not np.array_equal(heads[0], heads[1])
    server = et.TrainingSession(str(art))
    server.load_checkpoint(out / "global.etck")
    np.testing.assert_array_equal(server.parameters()["fc3.weight"], initial["fc3.weight"])
    assert hashlib.sha256(art.read_bytes()).hexdigest() == digest  # the devices' artifact is untouched
    # accuracy improves: the global model on the 400 held-out digits, and each device on its own held-out fifth
    assert s["final_val_accuracy"] > s["initial_val_accuracy"] + 0.04, s["rounds"]
    before = np.mean([c["local_val_accuracy_before"] for c in s["clients"]])
    after = np.mean([c["local_val_accuracy_after"] for c in s["clients"]])
    assert after > before + 0.2, (before, after)
    assert not live_flower_processes(out / "flower")
    report(
        "federated LoRA adapters (digits LeNet, rank 4 on fc1 and fc2)",
        f"{adapter_bytes:,} bytes sent and received per client a round, the model's weights {model:,} "
        f"({100 * adapter_bytes / model:.1f}%); global accuracy {s['initial_val_accuracy']:.1%} -> "
        f"{s['final_val_accuracy']:.1%}",
    )


def test_adapters_only_refuses_an_artifact_without_adapters(artifacts, tmp_path, capsys):
    from edgetrain.cli import main
    from edgetrain.federated.common import RUN_DEFAULTS
    from edgetrain.federated.server import run

    out = tmp_path / "out"
    code = main(["federate", str(artifacts["plain"]), "--adapters-only", "--data", str(NEWUSER), "--clients", "2",
                 "--rounds", "1", "--out", str(out)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "plain.etrain' has none" in err and "edgetrain convert MODEL --lora-rank R" in err, (
        err
    )
    assert not out.exists()  # refused before anything started
    cfg = {**RUN_DEFAULTS, "artifact": str(artifacts["plain"]), "adapters-only": True, "out": str(out)}
    with pytest.raises(ConfigError, match="--lora-rank R"):  # the server app refuses it too
        run(None, cfg)


def test_the_option_reaches_the_run_config_and_decides_what_is_shared(artifacts, tmp_path):
    from edgetrain.cli.federate import run_config_of
    from edgetrain.cli.parser import build_parser
    from edgetrain.federated.common import RUN_DEFAULTS, model_bytes, shared_and_personal

    try:
        import tomllib
    except ImportError:  # Python 3.10: tomli, a dependency of Flower
        import tomli as tomllib
    argv = ["federate", str(artifacts["lora"]), "--data", str(NEWUSER), "--clients", "2", "--rounds", "1",
            "--out", str(tmp_path)]  # fmt: skip
    args = build_parser().parse_args([*argv, "--adapters-only"])
    assert args.adapters_only and run_config_of(args, str(tmp_path))["adapters-only"] is True
    assert run_config_of(build_parser().parse_args(argv), str(tmp_path))["adapters-only"] is False
    app = tomllib.loads((ROOT / "edgetrain" / "federated" / "app" / "pyproject.toml").read_text())
    assert app["tool"]["flwr"]["app"]["config"]["adapters-only"] is False is RUN_DEFAULTS["adapters-only"]

    lora, plain = et.TrainingSession(str(artifacts["lora"])), et.TrainingSession(str(artifacts["plain"]))
    assert shared_and_personal(lora, "", adapters_only=True) == (BODY, HEAD)  # the head trained beside stays
    assert shared_and_personal(lora, "fc2.lora*", adapters_only=True) == (BODY[:2], BODY[2:] + HEAD)
    assert shared_and_personal(lora, "") == (
        BODY + HEAD,
        [],
    )  # without the option: as any trainable parameter
    assert shared_and_personal(plain, "fc3.*") == ([n for n in plain.parameter_names if n not in HEAD], HEAD)
    with pytest.raises(ConfigError, match="has none"):
        shared_and_personal(plain, "", adapters_only=True)
    model = sum(v.nbytes for v in model_weights().values())
    assert model_bytes(lora) == model_bytes(plain) == model  # the adapters are not the model's
