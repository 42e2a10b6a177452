"""A real Flower deployment on 127.0.0.1 (Flower's own processes; no simulation engine): one superlink and one
supernode per device, each node's config in a TOML file, a private Flower home with telemetry and update checks
off, free ports; `run` drives `flwr run APP loopback --stream`; leaving the `with` block stops every process it
started (and their children), also on an error or Ctrl-C.

    with Deployment(workdir, [{"partition-id": 0, "artifact": ..., "data": ..., "home": ...}, ...]) as d:
        d.run(APP_DIR, {"artifact": ..., "rounds": 3, "out": ...}, on_line=print)
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from edgetrain.core.errors import ExecutionError

APP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "app")


class FederationError(ExecutionError):
    """A Flower process that would not start, a run that failed or timed out; says which and where its log is."""


_GIVEN: set[int] = set()  # ports this process handed out: deployments side by side never get the same one
_GIVEN_LOCK = threading.Lock()


def free_port() -> int:
    """A port free on 127.0.0.1 now, and not handed out before by this process (a port is bound only later, by
    the Flower process that gets it: two deployments started together must not be given the same)."""
    with _GIVEN_LOCK:
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
            if port not in _GIVEN:
                _GIVEN.add(port)
                return port


def _toml(values: Mapping[str, Any]) -> str:
    lines = []
    for k, v in values.items():
        if isinstance(v, bool):
            text = "true" if v else "false"
        elif isinstance(v, (int, float)):
            text = repr(v)
        else:
            text = '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'
        lines.append(f"{k} = {text}")
    return "\n".join(lines) + "\n"


class Deployment:
    """Flower's superlink and supernodes as processes of this one; see the module docstring."""

    def __init__(self, workdir: str, nodes: Sequence[Mapping[str, Any]], *, start_timeout: float = 60.0):
        self.workdir = os.path.abspath(workdir)
        self.nodes = [dict(n) for n in nodes]
        self.start_timeout = start_timeout
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.port = 0
        self.env = self._environment()

    def _environment(self) -> dict[str, str]:
        home = os.path.join(self.workdir, "flower-home")
        os.makedirs(home, exist_ok=True)
        bin_dir = os.path.dirname(sys.executable)  # the nodes start flower-superexec by name
        return {
            **os.environ,
            "FLWR_HOME": home,
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
            "PYTHONUNBUFFERED": "1",
        }

    def _tool(self, name: str) -> str:
        path = os.path.join(os.path.dirname(sys.executable), name)
        if not os.path.exists(path):
            raise FederationError(
                f"Flower's `{name}` is not installed next to this Python ({sys.executable}): "
                "pip install 'edgetrain[federated]'"
            )
        return path

    def _start(self, label: str, args: list[str]) -> subprocess.Popen:
        log = open(os.path.join(self.workdir, f"{label}.log"), "w")
        proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.workdir, start_new_session=True
        )
        log.close()
        self.procs.append((label, proc))
        return proc

    def __enter__(self) -> Deployment:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self.port = free_port()
        with open(os.path.join(self.env["FLWR_HOME"], "config.toml"), "w") as f:
            f.write(
                '[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\n'
                f'address = "127.0.0.1:{self.port}"\ninsecure = true\n'
            )
        self._start(
            "superlink",
            [
                self._tool("flower-superlink"),
                "--insecure",
                "--disable-runtime-dependency-installation",  # or it runs `uv sync` over the network
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                # no --database: Flower's in-memory state. Its SQLite file lost replies to "database is locked"
                # on a busy 2-core machine (the round then waits, or the server app fails).
            ],
        )
        self._wait_for_port(self.port, "superlink")
        for k, node in enumerate(self.nodes):
            config = os.path.join(self.workdir, f"node-{k}.toml")
            with open(config, "w") as f:
                f.write(_toml(node))
            self._start(
                f"supernode-{k}",
                [
                    self._tool("flower-supernode"),
                    "--insecure",
                    "--superlink",
                    f"127.0.0.1:{self.port}",
                    "--port",
                    str(free_port()),
                    "--node-config",
                    config,
                ],
            )

    def _wait_for_port(self, port: int, label: str) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < self.start_timeout:
            proc = dict(self.procs)[label]
            if proc.poll() is not None:
                raise FederationError(f"Flower's {label} exited at start; see {self.workdir}/{label}.log")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.2)
        raise FederationError(
            f"Flower's {label} did not listen on 127.0.0.1:{port} within {self.start_timeout:g} s"
        )

    def run(
        self,
        app_dir: str,
        run_config: Mapping[str, Any],
        *,
        on_line: Callable[[str], None] | None = None,
        timeout: float = 3600.0,
    ) -> None:
        """`flwr run APP loopback --stream` with the run config; returns when the run ends, FederationError when it
        fails or times out (the nodes' logs are in the work folder)."""
        config = os.path.join(self.workdir, "run.toml")
        with open(config, "w") as f:
            f.write(_toml(run_config))
        proc = self._start_streaming(app_dir, config)
        t0 = time.monotonic()
        tail: list[str] = []
        for line in proc.stdout:
            tail = (tail + [line.rstrip()])[-20:]
            with open(os.path.join(self.workdir, "run.log"), "a") as f:
                f.write(line)
            if on_line is not None:
                on_line(line.rstrip())
            if time.monotonic() - t0 > timeout:
                break
        try:
            code = proc.wait(timeout=max(1.0, timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            raise FederationError(f"the federated run did not end within {timeout:g} s") from None
        errors = [t for t in tail if "ERROR" in t or "Traceback" in t]
        if code != 0 or errors:
            raise FederationError(self.failure(code, tail))

    def failure(self, code: int, tail: Sequence[str]) -> str:
        """Why a run failed, in one message: the first error of the ServerApp's log (the run's stream, run.log),
        else of a ClientApp's (supernode-K.log), else of the superlink's, with that log's path; Flower's own exit
        code when it said one; the last line of the stream when no log holds an error."""
        said = [m.group(1) for t in tail if (m := _EXIT_CODE.search(_plain(t)))]
        exited = f"flwr run exited {code}" + (f", Flower's exit code {said[-1]}" if said else "")
        supernodes = sorted(
            (f for f in os.listdir(self.workdir) if re.fullmatch(r"supernode-\d+\.log", f)),
            key=lambda f: int(f[10:-4]),
        )
        logs = [("the ServerApp", "run.log")]
        logs += [(f"the ClientApp of device {f[10:-4]}", f) for f in supernodes]
        logs += [("Flower's superlink", "superlink.log")]
        for who, name in logs:
            path = os.path.join(self.workdir, name)
            line = first_error(path)
            if line:
                return (
                    f"the federated run failed ({exited}): {who}'s first error was {line} (in {path}; every "
                    f"process's log is in {self.workdir})"
                )
        last = _plain(tail[-1]) if tail else "no output"
        return f"the federated run failed ({exited}): {last}; logs in {self.workdir}"

    def _run_args(self, app_dir: str, config: str) -> list[str]:
        """`flwr run`'s arguments: the app on this deployment's superlink, with the run config's file."""
        return [self._tool("flwr"), "run", app_dir, "loopback", "--stream", "--run-config", config]

    def _start_streaming(self, app_dir: str, config: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            self._run_args(app_dir, config),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env,
            cwd=self.workdir,
            start_new_session=True,
        )
        self.procs.append(("flwr-run", proc))
        return proc

    def stop(self, grace: float = 10.0) -> None:
        """Stops everything started, supernodes before the superlink (SIGTERM to each process group, then SIGKILL
        after `grace` seconds); idempotent."""
        order = [p for p in self.procs if p[0].startswith(("flwr-run", "supernode"))]
        order += [p for p in self.procs if p not in order]
        for _label, proc in order:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for _label, proc in order:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc, signal.SIGKILL)  # the group: children like flower-superexec go too
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.procs = []
        for pid in _ours(self.env["FLWR_HOME"]):  # those that left our groups (the server app's own process)
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # Flower colors its log levels
_EXIT_CODE = re.compile(r"Exit Code: (\d+)")
_ERROR = re.compile(r"(ERROR|CRITICAL)\s*:")  # Flower's level, as it begins a line of its log
_EXCEPTION = re.compile(
    r"(?:[A-Za-z_][\w]*\.)*([A-Za-z_]\w*)(:.*)?"
)  # a traceback's last line: package.Class: text
LOG_READ_MAX = 64 << 20  # a log is read this far for its first error


def first_error(path: str) -> str | None:
    """The first error in a Flower process's log: the exception that ends its first traceback (the class without
    its package, and its message), else its first ERROR line; without Flower's colors, cut at 600 characters.
    None when the log holds no error or cannot be read."""
    try:
        f = open(path, encoding="utf-8", errors="replace")
    except OSError:
        return None
    logged, read, in_traceback = None, 0, False
    with f:
        for raw in f:
            read += len(raw)
            if read > LOG_READ_MAX:
                break
            line = _plain(raw)
            if line.startswith("Traceback (most recent call last):"):
                in_traceback = True
            elif in_traceback and line and not line[0].isspace():
                m = _EXCEPTION.fullmatch(line)  # frames and their source lines are indented; this line is not
                return (m.group(1) + (m.group(2) or "") if m else line)[:600]
            elif logged is None and _ERROR.match(line):
                logged = line[:600]
    return logged


def _plain(line: str) -> str:
    """A log line without Flower's colors or its line end."""
    return _ANSI.sub("", line).rstrip()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _ours(flower_home: str) -> list[int]:
    """Live processes started under this deployment's Flower home (they inherit its environment), found in /proc;
    Flower starts the server app in a session of its own, out of reach of the process groups."""
    mark = f"FLWR_HOME={flower_home}\0".encode()
    found = []
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:  # no /proc (not Linux): the process groups are all there is
        return []
    for pid in pids:
        if pid == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if mark not in f.read() + b"\0":
                    continue
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[-1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        found.append(pid)
    return found
