"""A federated run that fails says why (issue 33): the error names the first error of the ServerApp's log (the run's
stream, run.log), else of a ClientApp's (supernode-K.log), and that log's path, not only Flower's exit code. From
crafted logs in process (quick), and from a real Flower deployment on 127.0.0.1 whose ServerApp refuses its run
config (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgetrain.federated.deploy import APP_DIR, Deployment, FederationError, first_error

ROOT = Path(__file__).resolve().parents[2]
ESC = "\x1b"
# The stream of `flwr run` in issue 33 (`federate --adapters-only --personal '*'`), colors and all
SERVERAPP_FAILED = f"""Using SuperLink: loopback (127.0.0.1:41925)
Successfully started run 12804685731211638803
{ESC}[92mINFO {ESC}[0m:      Start `flwr-serverapp` process
{ESC}[91mERROR {ESC}[0m:     ServerApp raised an exception
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/flwr/server/run_serverapp.py", line 60, in run
    server_app(grid=grid, context=context)
  File "/repo/edgetrain/federated/server.py", line 318, in run
    raise ConfigError(
edgetrain.core.errors.ConfigError: every adapter matches the personal patterns '*': nothing to share
{ESC}[91mERROR {ESC}[0m:     Exit Code: 201

An unhandled exception occurred in the ServerApp.
"""
CHAINED = """Traceback (most recent call last):
  File "a.py", line 1, in <module>
KeyError: 'val-data'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "b.py", line 2, in <module>
RuntimeError: the round could not start
"""


def deployment(folder: Path, logs: dict[str, str]) -> Deployment:
    """A Deployment of no process over `folder`, whose logs are as given."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in logs.items():
        (folder / name).write_text(text)
    d = Deployment.__new__(Deployment)  # its logs alone: no Flower home, no process
    d.workdir = str(folder)
    return d


def test_the_failure_names_the_serverapps_first_error_and_its_log(tmp_path):
    d = deployment(tmp_path, {"run.log": SERVERAPP_FAILED, "supernode-0.log": "INFO: fine\n"})
    tail = SERVERAPP_FAILED.splitlines()[-20:]
    assert d.failure(0, tail) == (
        "the federated run failed (flwr run exited 0, Flower's exit code 201): the ServerApp's first error was "
        "ConfigError: every adapter matches the personal patterns '*': nothing to share "
        f"(in {tmp_path / 'run.log'}; every process's log is in {tmp_path})"
    )


def test_first_error_takes_the_first_traceback_else_the_first_error_line(tmp_path):
    (tmp_path / "chained.log").write_text(CHAINED)
    assert (
        first_error(str(tmp_path / "chained.log")) == "KeyError: 'val-data'"
    )  # the cause, not what followed
    (tmp_path / "lines.log").write_text(
        f"INFO: a\n{ESC}[91mERROR {ESC}[0m:     Run failed: no nodes\nERROR: later\n"
    )
    assert first_error(str(tmp_path / "lines.log")) == "ERROR :     Run failed: no nodes"
    (tmp_path / "clean.log").write_text("INFO: nothing wrong\n")
    assert first_error(str(tmp_path / "clean.log")) is None
    assert first_error(str(tmp_path / "missing.log")) is None


def test_a_clientapps_error_is_named_when_the_serverapps_log_holds_none(tmp_path):
    logs = {
        "run.log": f"{ESC}[92mINFO {ESC}[0m:      Start\n",
        "supernode-0.log": "INFO: fine\n",
        "supernode-10.log": "INFO: fine\n",
        "supernode-2.log": CHAINED,
        "superlink.log": "ERROR: the superlink's, after the devices'\n",
    }
    message = deployment(tmp_path, logs).failure(1, ["the last line"])
    assert message.startswith(
        "the federated run failed (flwr run exited 1): the ClientApp of device 2's first error "
    )
    assert f"KeyError: 'val-data' (in {tmp_path / 'supernode-2.log'}" in message
    bare = deployment(tmp_path / "bare", {"run.log": "INFO: started\n"}).failure(3, ["the last line"])
    assert bare == f"the federated run failed (flwr run exited 3): the last line; logs in {tmp_path / 'bare'}"


def failing_run(folder: Path) -> str:
    """A deployment whose ServerApp refuses its run config (adapters-only, every adapter personal): the
    FederationError's message. The command line refuses this before any process starts (tests/cli); Flower's
    own `flwr run` with such a config fails this way."""
    # the fleet's test modules need flwr (they skip without it): imported by the slow job alone
    from test_federated import devices  # flwr, as above
    from test_federated_adapters import convert  # flwr, as above

    art = convert(folder / "lora.etrain")
    config = {
        "artifact": str(art), "rounds": 1, "local-steps": 2, "local-epochs": 0, "personal": "*",
        "adapters-only": True, "out": str(folder / "out"), "min-clients": 2,
    }  # fmt: skip
    try:
        with Deployment(str(folder / "flower"), devices(folder, 2, artifact=lambda k: art)) as d:
            d.run(APP_DIR, config, timeout=300)
    except FederationError as e:
        return str(e)
    return "the run did not fail"


@pytest.mark.slow
@pytest.mark.background(job=failing_run)
def test_a_real_failing_run_names_the_serverapps_error_and_its_log(background, report):
    pytest.importorskip("flwr", reason="the fleet needs the federated extra (flwr)")
    message, folder = background
    report("failing federated run", message)
    assert message.startswith("the federated run failed (flwr run exited"), message
    assert (
        "the ServerApp's first error was ConfigError: every adapter matches the personal patterns '*'"
        in message
    )
    assert f"(in {folder / 'flower' / 'run.log'}; every process's log is in {folder / 'flower'})" in message
    assert not json.dumps(message).count("Exit Code: 201")  # Flower's exit code is said, not its log line
