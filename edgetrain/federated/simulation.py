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
        self._seen: dict[
            int, tuple[int, bool, bool]
        ] = {}  # pid -> (start time, under our home, names Ray's dir)
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
                str(self.port),  # no --database: Flower's in-memory state (see deploy.py)
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

    def _run_args(self, app_dir: str, config: str) -> list[str]:
        """`flwr run` on the simulation's superlink ("sim"), with the simulation's settings."""
        fed = " ".join(_toml({k: v}).strip().replace(" = ", "=") for k, v in self.federation_config().items())
        flwr = self._tool("flwr")
        return [flwr, "run", app_dir, "sim", "--stream", "--run-config", config, "--federation-config", fed]

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
        seen, self._seen = self._seen, {}
        for pid, sid, start in _processes():
            if pid == os.getpid() or sid == self._own_session:
                continue
            known = seen.get(pid)
            if known is not None and known[0] == start:  # a process's environment and command line stay
                marked, named = known[1], known[2]
            else:
                environ, cmdline = _read(pid, "environ"), _read(pid, "cmdline")
                marked, named = mark in environ + b"\0", self.ray_dir.encode() in cmdline
            self._seen[pid] = (start, marked, named)
            if marked:
                self._sessions.add(sid)
            if marked or named or sid in self._sessions:
                found.append(pid)
        return found

    @property
    def peak_rss(self) -> int:
        return self.memory.peak_rss

    @property
    def peak_pss(self) -> int:
        return self.memory.peak_pss


def _processes():
    """(pid, session id, start time) of each live process (zombies left out), from /proc."""
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:  # no /proc (not Linux): the process groups are all there is
        return
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[-1].split()
            if fields[0] != "Z":
                yield pid, int(fields[3]), int(fields[19])
        except (OSError, IndexError, ValueError):
            continue


def _read(pid: int, what: str) -> bytes:
    try:
        with open(f"/proc/{pid}/{what}", "rb") as f:
            return f.read()
    except OSError:
        return b""


class _MemorySampler:
    """Samples, every `every` seconds in a thread, the memory of this process and of the run's processes
    (`members`: the superlink, the server app, Ray's services and workers): the peak of the summed RSS (resident
    pages, the pages shared between processes counted in each), and every `pss_every`-th sample the summed PSS
    (shared pages split among their processes: what the run costs the machine; the kernel walks every mapping to
    count it, ~7 ms a Ray worker, so it is sampled less often). Also the CPU time the run's processes used."""

    def __init__(self, members, every: float, pss_every: int = 10):
        self.members, self.every, self.pss_every = members, every, pss_every
        self.peak_rss = self.peak_pss = 0
        self.peak_processes = 0
        self._cpu: dict[int, float] = {}  # pid -> CPU seconds last seen (the launcher's own left out)
        self._samples = 0
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

    @property
    def cpu_seconds(self) -> float:
        """CPU time (user and system) the run's processes had used when last seen: what the run cost, whatever
        else the machine was doing (a process's last moments before it ended are not counted)."""
        return sum(self._cpu.values())

    def sample(self) -> None:
        members = self.members()
        pids = [os.getpid(), *members]
        rss = 0
        for pid in pids:
            r, cpu = _stat(pid)
            rss += r
            if cpu is not None and pid != os.getpid():
                self._cpu[pid] = max(cpu, self._cpu.get(pid, 0.0))
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_processes = max(self.peak_processes, len(pids))
        if self._samples % self.pss_every == 0:
            self.peak_pss = max(self.peak_pss, sum(_pss(pid) for pid in pids))
        self._samples += 1


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> tuple[int, float | None]:
    """(RSS in bytes, CPU seconds) of a process, from /proc/PID/stat ((0, None) when it is gone or not Linux)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[-1].split()
        return int(fields[21]) * _PAGE, (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, IndexError, ValueError):
        return 0, None


def _pss(pid: int) -> int:
    """PSS of a process in bytes, from /proc/PID/smaps_rollup (0 when it is gone or not Linux)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


__all__ = ["ALPHA", "SCHEMES", "FederationError", "Simulation", "shard"]
