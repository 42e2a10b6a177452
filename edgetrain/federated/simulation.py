"""Many simulated devices on one machine, on Flower's own simulation engine (its Ray backend): a superlink in
simulation mode, started as deploy.py starts a deployment's, and `flwr run APP sim --stream --federation-config
'num-supernodes=N ...'`. The N simulated devices run the same ClientApp as real ones and the server the same
ServerApp; each device takes its own non-IID shard of one dataset (shard()) and keeps its own home (sim-home/client-K).
Ray is kept small (a few workers, a capped object store, no dashboard, no usage statistics), a sampler records the
memory of every process the run starts, and leaving the `with` block stops them all, Ray's included.

    with Simulation(workdir, clients=1000, workers=2) as sim:
        sim.run(APP_DIR, {"artifact": ..., "sim-data": ..., "sim-home": ..., "clients-per-round": 50, ...})
    sim.peak_rss, sim.peak_pss   # bytes, summed over the processes

How a simulated device's data is drawn (shard): with 1,000 devices and the 1,050 shipped digits the shards cannot
be disjoint, so each device draws `samples` samples of its own from the whole dataset, seeded by the run's seed and
its partition id (the same device gets the same shard in every round and every run with that seed):
  - "label-skew" (non-IID, as real users' data is): the device's class mix is a draw from a symmetric
    Dirichlet(ALPHA = 0.5) over the dataset's classes (Hsu et al., 2019), its sample count per class a multinomial
    draw from that mix, and the samples of each class a draw without replacement from that class (with replacement
    only if a class has fewer samples than asked). On the digits, 40 samples a device: its main class holds 40%
    of its samples on average, its three main classes 77%, and it has 7 of the 10 classes at all (iid: 18%,
    46%, 10);
  - "iid": `samples` samples drawn uniformly without replacement.
Devices' shards overlap (a digit is on about samples x devices / dataset devices), as the same kinds of pictures
are on many phones; what differs between devices is the mix.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from edgetrain.core.errors import ConfigError

from .deploy import Deployment, FederationError, _toml, free_port

ALPHA = 0.5  # the Dirichlet concentration of a simulated device's class mix: smaller is more skewed
SCHEMES = ("label-skew", "iid")


def shard(labels: np.ndarray, partition_id: int, *, samples: int, scheme: str = "label-skew", seed: int = 0):
    """Sorted indices (into the dataset whose `labels` are given) of simulated device `partition_id`'s samples;
    see the module docstring. Deterministic in (labels, partition_id, samples, scheme, seed)."""
    y = np.asarray(labels)
    n = len(y)
    if not 1 <= samples <= n:
        raise ConfigError(f"a simulated device cannot draw {samples} samples from a dataset of {n}")
    if partition_id < 0 or seed < 0:
        raise ConfigError(f"partition id and seed must be >= 0, got {partition_id} and {seed}")
    rng = np.random.default_rng([seed, partition_id])  # a stream of its own per device
    if scheme == "iid":
        return np.sort(rng.choice(n, samples, replace=False))
    if scheme != "label-skew":
        raise ConfigError(f"unknown simulated partition {scheme!r}; use {' or '.join(SCHEMES)}")
    y = y.reshape(n, -1)[:, 0]
    if y.dtype.kind not in "iub":
        raise ConfigError(
            f"label-skew draws by class, and these labels are {y.dtype.name} values, not classes: use iid"
        )
    classes = np.unique(y)
    counts = rng.multinomial(samples, rng.dirichlet(np.full(len(classes), ALPHA)))
    picked = []
    for c, k in zip(classes, counts):
        if k:
            pool = np.flatnonzero(y == c)
            picked.append(rng.choice(pool, k, replace=bool(k > len(pool))))
    return np.sort(np.concatenate(picked))


class Simulation(Deployment):
    """Flower's superlink in simulation mode as a process of this one, with `clients` simulated devices run by
    `workers` Ray workers (each one CPU) at a time; see the module docstring."""

    def __init__(
        self,
        workdir: str,
        *,
        clients: int,
        workers: int = 2,
        object_store_mb: int = 256,
        start_timeout: float = 60.0,
        sample_every: float = 0.5,
    ):
        if clients < 1 or workers < 1:
            raise ConfigError(
                f"a simulation needs clients >= 1 and workers >= 1, got {clients} and {workers}"
            )
        self.clients, self.workers = int(clients), int(workers)
        self.object_store_mb = int(object_store_mb)
        # Ray's sockets live under its temp folder, whose path must stay short (a socket path has ~107 bytes)
        self.ray_dir = tempfile.mkdtemp(prefix="etsim-")
        super().__init__(workdir, [], start_timeout=start_timeout)
        self._sessions: set[int] = set()
        self._own_session = os.getsid(0)
        self.left: list[int] = []
        self.seconds = 0.0
        self.memory = _MemorySampler(self.members, sample_every)

    def _environment(self) -> dict[str, str]:
        return {
            **super()._environment(),
            "RAY_TMPDIR": self.ray_dir,
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_DEFAULT_OBJECT_STORE_MAX_MEMORY_BYTES": str(self.object_store_mb * 2**20),
            "RAY_DISABLE_IMPORT_WARNING": "1",
            "RAY_DEDUP_LOGS": "0",
            "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",  # no GPUs here; and Ray's warning about it is quiet
            # Ray's services on 127.0.0.1, not on the machine's network address (Ray's name for the switch)
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            # One BLAS thread per process: each worker is one CPU; and the server app, which runs in a thread of
            # Flower's simulation process, crawled (100x slower) in OpenBLAS's threaded GEMM, whose helper threads
            # that process does not have
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
        }

    def start(self) -> None:
        self.port = free_port()
        with open(os.path.join(self.env["FLWR_HOME"], "config.toml"), "w") as f:
            f.write(
                '[superlink]\ndefault = "sim"\n\n[superlink.sim]\n'
                f'address = "127.0.0.1:{self.port}"\ninsecure = true\n'
            )
        self.memory.start()
        self._start(
            "superlink",
            [
                self._tool("flower-superlink"),
                "--simulation",
                "--insecure",
                "--disable-runtime-dependency-installation",  # or it runs `uv sync` over the network
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--database",
                os.path.join(self.workdir, "superlink.db"),
            ],
        )
        self._wait_for_port(self.port, "superlink")

    def federation_config(self) -> dict[str, Any]:
        """Flower's simulation settings (`flwr run --federation-config`): N devices, Ray with `workers` CPUs, one a
        device at a time, its own log lines kept out of the run's stream."""
        return {
            "num-supernodes": self.clients,
            "backend": "ray",
            "client-resources-num-cpus": 1,
            "init-args-num-cpus": self.workers,
            "init-args-num-gpus": 0,
            "init-args-logging-level": "ERROR",
            "init-args-log-to-driver": False,
        }

    def _start_streaming(self, app_dir: str, config: str) -> subprocess.Popen:
        fed = " ".join(_toml({k: v}).strip().replace(" = ", "=") for k, v in self.federation_config().items())
        proc = subprocess.Popen(
            [
                self._tool("flwr"),
                "run",
                app_dir,
                "sim",
                "--stream",
                "--run-config",
                config,
                "--federation-config",
                fed,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env,
            cwd=self.workdir,
            start_new_session=True,
        )
        self.procs.append(("flwr-run", proc))
        return proc

    def run(self, app_dir: str, run_config: Mapping[str, Any], **kwargs) -> None:
        for key in ("artifact", "sim-data", "sim-home"):
            if not run_config.get(key):
                raise ConfigError(f"a simulated run needs the run config's {key!r}")
        t0 = time.monotonic()
        try:
            super().run(app_dir, run_config, **kwargs)
        finally:
            self.seconds = time.monotonic() - t0

    def stop(self, grace: float = 10.0) -> None:
        """Stops everything started (Deployment.stop: SIGTERM, then SIGKILL, to the process groups and to every
        process under this run's Flower home), then kills what is left of the run (members(): Ray's agents and
        workers too) until nothing is, and removes Ray's temp folder; idempotent."""
        try:
            super().stop(grace)
            deadline = time.monotonic() + grace
            while (left := self.members()) and time.monotonic() < deadline:
                for pid in left:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                time.sleep(0.2)
            self.left = self.members()
            if self.left:
                print(f"warning: processes of the simulation outlived it: {self.left}", file=sys.stderr)
        finally:
            self.memory.stop()
            shutil.rmtree(self.ray_dir, ignore_errors=True)

    def members(self) -> list[int]:
        """The live processes of this run: those under its Flower home (they inherit its environment), those in
        the sessions of those (Ray's agents and workers rename themselves, which hides their environment; Ray's
        services stay in the session of the simulation process that started them) and those whose command line
        names Ray's temp folder. Our own process and its session are never in it."""
        found = []
        mark = f"FLWR_HOME={self.env['FLWR_HOME']}\0".encode()
        for pid, sid, cmdline, environ in _processes():
            if pid == os.getpid() or sid == self._own_session:
                continue
            if mark in environ + b"\0":
                self._sessions.add(sid)
            elif sid not in self._sessions and self.ray_dir.encode() not in cmdline:
                continue
            found.append(pid)
        return found

    @property
    def peak_rss(self) -> int:
        return self.memory.peak_rss

    @property
    def peak_pss(self) -> int:
        return self.memory.peak_pss


def _processes():
    """(pid, session id, command line, environment) of each live process (zombies left out), from /proc."""
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:  # no /proc (not Linux): the process groups are all there is
        return
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[-1].split()
            if fields[0] == "Z":
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    environ = f.read()
            except OSError:
                environ = b""
        except (OSError, IndexError):
            continue
        yield pid, int(fields[3]), cmdline, environ


class _MemorySampler:
    """Samples, every `every` seconds in a thread, the memory of this process and of the run's processes
    (`members`: the superlink, the server app, Ray's services and workers): the peak of the summed RSS (resident
    pages, the pages shared between processes counted in each) and of the summed PSS (shared pages split among
    their processes: what the run costs the machine)."""

    def __init__(self, members, every: float):
        self.members, self.every = members, every
        self.peak_rss = self.peak_pss = 0
        self.peak_processes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="memory-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def sample(self) -> None:
        pids = [os.getpid(), *self.members()]
        rss = pss = 0
        for pid in pids:
            r, p = _memory(pid)
            rss, pss = rss + r, pss + p
        self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
        self.peak_processes = max(self.peak_processes, len(pids))


def _memory(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of a process in bytes, from /proc (0, 0 when it is gone or not Linux)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line and not line[0].isdigit())
        return int(fields["Rss"].split()[0]) * 1024, int(fields["Pss"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return 0, 0


__all__ = ["ALPHA", "SCHEMES", "FederationError", "Simulation", "shard"]
