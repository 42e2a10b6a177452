"""The ARM64 job: proves that the device side (edgetrain.runtime and what it uses, loaders, android_demo) runs on an
aarch64 CPU with numpy alone, under QEMU user-mode emulation, and computes what x86-64 computes.

    .venv/bin/python tools/arm/job.py          # .ci/run runs it after tools/test.sh (which makes .venv)

1. builds (once; cached, git-ignored) two aarch64 Debian 12 sysroots with setup-aarch64.sh:
   .arm64-sysroot-debian (Debian's python3-numpy 1.24, the oldest numpy supported) and .arm64-sysroot-pypi (the
   numpy wheel the package index had when it was built; delete the folder to take a newer one), both with pytest
   and without onnx;
2. natively: converts edgetrain/data/digits_lenet.onnx into a training artifact (the build side, needs onnx) and
   runs tools/arm/device_check.py (TrainingSession steps over a DataLoader, a checkpoint round trip, an
   evaluation, a Trainer epoch; onnx blocked) to get the reference numbers;
3. runs device_check.py under emulation in each sysroot and compares every loss and metric with the native run
   (relative difference at most 1e-5);
4. runs the test modules that need numpy alone (TESTS) under emulation; their device scripts start
   `sys.executable` in child processes, which works through the sysroot's python3-qemu launcher;
5. runs `python -m android_demo simulate --quick --json` natively and emulated and compares its losses and
   accuracies (skipped, saying so, while android_demo/__main__.py does not exist);
6. prints a report and writes it to build/arm/report.json (logs of every run in build/arm/logs/).

Exit status 0 when all of it holds, 1 with the reasons otherwise. Without root and apt (no qemu, no sysroot) it
fails: CI must not pass without having run on ARM.

Environment:
  EDGETRAIN_SKIP_ARM=1       skip the whole job, exit 0 (for developers without root/apt; never set it in CI)
  EDGETRAIN_ARM_SYSROOTS     which sysroots, comma-separated (default "debian,pypi")
  ARM_PIP_PACKAGES           pypi sysroot's pip requirements (default "numpy pytest"), e.g. "numpy==2.3.5 pytest"
  QEMU_CPU                   the emulated CPU (default cortex-a72, see run-aarch64.sh)
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(ROOT, "build", "arm")
LOGS = os.path.join(OUT, "logs")
MODEL = os.path.join(ROOT, "edgetrain", "data", "digits_lenet.onnx")
SIMULATE = ["-m", "android_demo", "simulate", "--quick", "--json"]
DEMO_MAIN = os.path.join(ROOT, "android_demo", "__main__.py")  # until it exists, step 5 is skipped
RTOL = 1e-5
# Test modules that import nothing of the build side (no onnx, onnxruntime or torch, also not through
# tests/harness/models.py, zoo.py or kernel_harness.py) and run in ~15 s emulated. Their device-script tests start child
# pythons; the numpy-1.24 one runs in the debian sysroot only (there it is numpy 1.24), and skips in the other.
TESTS = [
    "tests/loaders/test_loaders.py",
    "tests/loaders/test_loaders_userdata.py",
    "tests/runtime/test_numpy_only.py",
    # the phone's sample store: SQLite, crash safety (fast set; the slow kills stay native)
    "tests/loaders/test_store.py",
]
SYSROOTS = {
    # name: (ARM_NUMPY mode, folder, check of the numpy version it must hold)
    "debian": ("debian", ".arm64-sysroot-debian", lambda v: v.startswith("1.24."), "1.24.x"),
    "pypi": ("pypi", ".arm64-sysroot-pypi", lambda v: int(v.split(".")[0]) >= 2, "2.x or newer"),
}
TIMEOUT = {"setup": 900, "probe": 120, "device": 900, "tests": 1200, "simulate": 1800}


class JobError(Exception):
    pass


def say(text: str = "") -> None:
    print(text, flush=True)


def run(
    name: str, cmd: list[str], *, timeout: float, env=None, cwd=ROOT
) -> tuple[subprocess.CompletedProcess, float]:
    """Runs cmd with its output in build/arm/logs/<name>.log; (process, seconds). A timeout is a JobError."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    except subprocess.TimeoutExpired as e:
        raise JobError(f"{name}: no result after {timeout} s: {' '.join(cmd)}") from e
    seconds = time.perf_counter() - t0
    with open(os.path.join(LOGS, name + ".log"), "w", encoding="utf-8") as f:
        f.write(f"$ {' '.join(cmd)}\n(cwd {cwd}; exit {proc.returncode}; {seconds:.1f} s)\n")
        f.write("---- stdout\n" + proc.stdout + "\n---- stderr\n" + proc.stderr)
    return proc, seconds


def tail(proc: subprocess.CompletedProcess, n: int = 25) -> str:
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    return "\n".join("    " + line for line in lines[-n:])


def json_line(proc: subprocess.CompletedProcess, what: str) -> dict:
    """The last line of stdout that is a JSON object."""
    for line in reversed(proc.stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    raise JobError(f"{what} printed no JSON line (exit {proc.returncode}):\n{tail(proc)}")


def device_env(sysroot: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env.pop("EDGETRAIN_NUMPY124_PYTHON", None)
    env.update(PYTHONPATH=ROOT, PYTHONNOUSERSITE="1")
    if sysroot is not None and SYSROOTS[sysroot][0] == "debian":
        # tests/harness/device.py's numpy-1.24 runs: the emulated python with Debian's numpy 1.24 (started on the host)
        env["EDGETRAIN_NUMPY124_PYTHON"] = os.path.join(
            ROOT, SYSROOTS[sysroot][1], "usr", "bin", "python3-qemu"
        )
    return env


def emulated(sysroot: str) -> list[str]:
    return [
        "bash",
        os.path.join(HERE, "run-aarch64.sh"),
        os.path.join(ROOT, SYSROOTS[sysroot][1]),
        "--",
        "python3",
    ]


# ---- comparing numbers --------------------------------------------------------------------------------------------
def numbers(value, path: str = "") -> dict[str, float]:
    """{path: number} of every number in a JSON value (bools excluded)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return {}
    if isinstance(value, (int, float)):
        return {path: float(value)}
    items = value.items() if isinstance(value, dict) else enumerate(value)
    out: dict[str, float] = {}
    for k, v in items:
        out.update(numbers(v, f"{path}.{k}" if isinstance(k, str) else f"{path}[{k}]"))
    return out


def rel_diff(a: float, b: float) -> float:
    if a == b:
        return 0.0
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / max(abs(a), abs(b))


def compare(
    native: dict, got: dict, keys: list[str], what: str, *, absolute: tuple[str, ...] = ()
) -> tuple[dict[str, float], list[str]]:
    """({key: max difference}, problems) of the numbers under `keys` of two runs' JSON: relative differences, but
    absolute ones for the keys in `absolute` (probabilities, where a tiny one would make any difference large)."""
    worst, problems = {}, []
    for key in keys:
        a, b = numbers(native.get(key), key), numbers(got.get(key), key)
        if a.keys() != b.keys():
            problems.append(
                f"{what}: '{key}' has a different shape: native {native.get(key)!r}, emulated {got.get(key)!r}"
            )
            continue
        if not a:
            problems.append(f"{what}: '{key}' holds no numbers (native {native.get(key)!r})")
            continue
        if key in absolute:
            diffs = {p: abs(a[p] - b[p]) if math.isfinite(a[p] - b[p]) else math.inf for p in a}
        else:
            diffs = {p: rel_diff(a[p], b[p]) for p in a}
        top = max(diffs, key=diffs.get)
        worst[key] = diffs[top]
        if diffs[top] > RTOL:
            problems.append(
                f"{what}: {top} differs by {diffs[top]:.2e} {'absolute' if key in absolute else 'relative'} "
                f"(native {a[top]!r}, emulated {b[top]!r}; tolerance {RTOL:g})"
            )
    return worst, problems


# ---- the parts ----------------------------------------------------------------------------------------------------
def setup(name: str) -> float:
    mode, folder, _, _ = SYSROOTS[name]
    env = dict(os.environ, ARM_NUMPY=mode)
    proc, seconds = run(
        f"{name}-setup",
        ["bash", os.path.join(HERE, "setup-aarch64.sh"), folder],
        timeout=TIMEOUT["setup"],
        env=env,
    )
    if proc.returncode != 0:
        raise JobError(
            f"could not build the aarch64 sysroot '{folder}' (needs root, apt-get and the network to Debian's "
            f"mirror and, for pypi, the package index):\n{tail(proc)}\n"
            "  Developers without root/apt can skip the ARM job with EDGETRAIN_SKIP_ARM=1 (CI must not)."
        )
    return seconds


PROBE = (
    "import importlib.util as u, json, platform, sys, numpy; print(json.dumps({'machine': platform.machine(), "
    "'python': platform.python_version(), 'numpy': numpy.__version__, 'executable': sys.executable, "
    "'build_side': [m for m in ('onnx', 'onnxruntime', 'torch') if u.find_spec(m)]}))"
)


def native_reference(report: dict) -> dict:
    work = os.path.join(OUT, "work", "native")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    t0 = time.perf_counter()
    sys.path.insert(0, ROOT)  # this checkout's edgetrain, also when .venv holds another
    try:
        import onnx  # noqa: F401

        import edgetrain as et  # the build side: needs onnx (tools/test.sh's .venv has it)
    except ImportError as e:
        raise JobError(
            f"run this with the python of tools/test.sh's .venv (edgetrain[dev], onnx): {e}"
        ) from e

    artifact = os.path.join(OUT, "digits_lenet.etrain")
    # the demo's full fine-tuning settings (edgetrain/demo/digits.py)
    et.convert(
        MODEL,
        loss=et.CrossEntropyLoss(),
        optimizer=et.SGD(lr=0.01, momentum=0.9, weight_decay=5e-4),
        batch_size=10,
    ).save(artifact)
    report["native"]["seconds"]["convert"] = round(time.perf_counter() - t0, 2)
    proc, seconds = run(
        "native-device",
        [sys.executable, os.path.join(HERE, "device_check.py"), artifact, work],
        timeout=TIMEOUT["device"],
        env=device_env(),
        cwd=work,
    )
    if proc.returncode != 0:
        raise JobError(
            f"the device check failed natively, so there is nothing to compare with:\n{tail(proc)}"
        )
    ref = json_line(proc, "the native device check")
    report["native"].update(machine=ref["machine"], python=ref["python"], numpy=ref["numpy"])
    report["native"]["seconds"]["device"] = round(seconds, 2)
    report["native"]["device"] = ref
    return ref


def simulate_native(report: dict) -> dict | None:
    if not os.path.exists(DEMO_MAIN):
        report["simulate"] = "skipped: android_demo/__main__.py does not exist yet"
        return None
    work = os.path.join(OUT, "work", "native-simulate")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    proc, seconds = run(
        "native-simulate",
        [sys.executable, *SIMULATE],
        timeout=TIMEOUT["simulate"],
        env=device_env(),
        cwd=work,
    )
    report["native"]["seconds"]["simulate"] = round(seconds, 2)
    # A failure here is the job's failure too, but the ARM checks of the other parts still run and report.
    try:
        if proc.returncode != 0:
            raise JobError(f"`python {' '.join(SIMULATE)}` failed natively:\n{tail(proc)}")
        ref = json_line(proc, "android_demo simulate (native)")
        missing = [key for key in ("losses", "accuracy") if key not in ref]
        if missing:
            raise JobError(f"android_demo simulate's JSON has no {missing} (it has {sorted(ref)})")
    except JobError as e:
        report["simulate"] = "failed natively: not compared"
        report["problems"].append(str(e))
        return None
    report["simulate"] = "ran"
    return ref


def check_sysroot(name: str, ref: dict, sim_ref: dict | None, entry: dict) -> list[str]:
    problems: list[str] = []
    sec = entry["seconds"]
    sec["setup"] = round(setup(name), 2)

    proc, seconds = run(
        f"{name}-probe", [*emulated(name), "-c", PROBE], timeout=TIMEOUT["probe"], env=device_env()
    )
    if proc.returncode != 0:
        return [f"{name}: the emulated python does not start or import numpy:\n{tail(proc)}"]
    sec["probe"] = round(seconds, 2)
    probe = json_line(proc, f"{name}: the probe")
    entry.update(machine=probe["machine"], python=probe["python"], numpy=probe["numpy"])
    _, folder, numpy_ok, numpy_want = SYSROOTS[name]
    if probe["machine"] != "aarch64":
        problems.append(f"{name}: platform.machine() is {probe['machine']!r}, not 'aarch64'")
    if not numpy_ok(probe["numpy"]):
        problems.append(f"{name}: numpy {probe['numpy']}, expected {numpy_want}")
    if probe["build_side"]:
        problems.append(
            f"{name}: {probe['build_side']} can be imported in {folder}: the device side must not have it"
        )

    # the device check
    work = os.path.join(OUT, "work", name)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    artifact = os.path.join(OUT, "digits_lenet.etrain")
    proc, seconds = run(
        f"{name}-device",
        [*emulated(name), os.path.join(HERE, "device_check.py"), artifact, work],
        timeout=TIMEOUT["device"],
        env=device_env(),
        cwd=work,
    )
    sec["device"] = round(seconds, 2)
    if proc.returncode != 0:
        problems.append(f"{name}: the device check failed under emulation:\n{tail(proc)}")
    else:
        got = json_line(proc, f"{name}: the device check")
        entry["device"] = got
        if got["batch_order_sha256"] != ref["batch_order_sha256"]:
            problems.append(f"{name}: the DataLoader shuffled the batches in another order than natively")
        keys = ["losses", "replay_losses", "eval", "trainer", "first_probabilities"]
        worst, bad = compare(ref, got, keys, name, absolute=("first_probabilities",))
        entry["device_max_diff"] = worst  # relative; absolute for first_probabilities
        entry["max_rel_loss_diff"] = max(worst.get("losses", 0.0), worst.get("replay_losses", 0.0))
        problems += bad

    # the numpy-only test modules
    proc, seconds = run(
        f"{name}-tests",
        [*emulated(name), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", *TESTS],
        timeout=TIMEOUT["tests"],
        env=device_env(name),
    )
    sec["tests"] = round(seconds, 2)
    summary = next(
        (
            ln.strip("= ")
            for ln in reversed(proc.stdout.splitlines())
            if re.search(r"\d+ (passed|failed|error)", ln)
        ),
        "",
    )
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", summary)}
    entry["tests"] = {"modules": TESTS, "summary": summary, **counts}
    if proc.returncode != 0 or not counts.get("passed"):
        hint = ""
        if re.search(r"No module named '(onnx|onnxruntime|torch)\b", proc.stdout + proc.stderr):
            hint = (
                "\n  (a test module in TESTS now imports the build side: move that test, or drop the module)"
            )
        problems.append(
            f"{name}: the emulated tests failed ({summary or 'no summary'}):\n{tail(proc, 40)}{hint}"
        )

    # android_demo simulate
    if sim_ref is not None:
        work = os.path.join(OUT, "work", f"{name}-simulate")
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        proc, seconds = run(
            f"{name}-simulate",
            [*emulated(name), *SIMULATE],
            timeout=TIMEOUT["simulate"],
            env=device_env(),
            cwd=work,
        )
        sec["simulate"] = round(seconds, 2)
        if proc.returncode != 0:
            problems.append(f"{name}: `python {' '.join(SIMULATE)}` failed under emulation:\n{tail(proc)}")
        else:
            got = json_line(proc, f"{name}: android_demo simulate")
            worst, bad = compare(sim_ref, got, ["losses", "accuracy"], f"{name} android_demo simulate")
            entry["simulate"] = {
                "machine": got.get("machine"),
                "numpy": got.get("numpy"),
                "max_rel_diff": worst,
            }
            if got.get("machine") != "aarch64":
                bad.append(f"{name}: android_demo simulate reports machine {got.get('machine')!r}")
            problems += bad
    return problems


def print_report(report: dict) -> None:
    n = report["native"]
    s = n["seconds"]
    say("")
    say(
        f"ARM64 job: {'PASSED' if report['ok'] else 'FAILED'} in {report['seconds']:.1f} s "
        f"(QEMU user-mode, cpu {report['qemu_cpu']}; {report['qemu']})"
    )
    say(
        f"  native   {n.get('machine', '?'):8s} python {n.get('python', '?'):7s} numpy {n.get('numpy', '?'):8s} "
        f"convert {s.get('convert', '-')} s, device check {s.get('device', '-')} s, simulate {s.get('simulate', '-')} s"
    )
    for name, e in report["sysroots"].items():
        t = e["seconds"]
        say(
            f"  {name:8s} {e.get('machine', '?'):8s} python {e.get('python', '?'):7s} numpy {e.get('numpy', '?'):8s} "
            f"setup {t.get('setup', '-')} s, probe {t.get('probe', '-')} s, device check {t.get('device', '-')} s, "
            f"tests {t.get('tests', '-')} s, simulate {t.get('simulate', '-')} s"
        )
        loss = e.get("max_rel_loss_diff")
        dev = {k: v for k, v in e.get("device_max_diff", {}).items() if k != "first_probabilities"}
        say(
            f"  {'':8s} device check: max relative difference {loss:.1e} in the training losses, "
            f"{max(dev.values(), default=0.0):.1e} in eval and Trainer metrics too; output probabilities "
            f"{e.get('device_max_diff', {}).get('first_probabilities', float('nan')):.1e} absolute"
            if loss is not None
            else f"  {'':8s} device check: not compared"
        )
        if "simulate" in e:
            sim = e["simulate"]["max_rel_diff"]
            say(
                f"  {'':8s} android_demo simulate: max relative difference {sim.get('losses', float('nan')):.1e} "
                f"in the losses, {sim.get('accuracy', float('nan')):.1e} in the accuracies"
            )
        tests = e.get("tests", {})
        say(f"  {'':8s} tests: {tests.get('summary') or 'not run'}")
    if report["simulate"] != "ran":
        say(f"  android_demo simulate: {report['simulate']}")
    for p in report["problems"]:
        say("  PROBLEM: " + p)
    say(
        f"  report: {os.path.relpath(os.path.join(OUT, 'report.json'), ROOT)}; logs: {os.path.relpath(LOGS, ROOT)}/"
    )


def main() -> int:
    if os.environ.get("EDGETRAIN_SKIP_ARM") == "1":
        say("ARM64 job: SKIPPED (EDGETRAIN_SKIP_ARM=1): nothing ran on an emulated aarch64 CPU")
        return 0
    names = [
        n.strip() for n in os.environ.get("EDGETRAIN_ARM_SYSROOTS", "debian,pypi").split(",") if n.strip()
    ]
    unknown = [n for n in names if n not in SYSROOTS]
    if unknown or not names:
        say(f"ARM64 job: EDGETRAIN_ARM_SYSROOTS names {unknown or 'nothing'}; known: {', '.join(SYSROOTS)}")
        return 1
    t_start = time.perf_counter()
    os.makedirs(LOGS, exist_ok=True)
    report: dict = {
        "ok": False,
        "qemu_cpu": os.environ.get("QEMU_CPU", "cortex-a72"),
        "qemu": "",
        "rtol": RTOL,
        "native": {"seconds": {}},
        "sysroots": {},
        "simulate": "not run",
        "problems": [],
    }
    say(
        f"ARM64 job: the device side on an emulated aarch64 CPU (sysroots: {', '.join(names)}; "
        f"host {platform.machine()})"
    )
    try:
        say(
            "  native reference: convert the demo model, run tools/arm/device_check.py and android_demo simulate"
        )
        ref = native_reference(report)
        sim_ref = simulate_native(report)
        if sim_ref is None:
            say(f"  android_demo simulate: {report['simulate']}")
        for name in names:
            entry = report["sysroots"][name] = {"folder": SYSROOTS[name][1], "seconds": {}}
            say(f"  {name}: setup, probe, device check, tests{', simulate' if sim_ref else ''} ...")
            t0 = time.perf_counter()
            try:
                report["problems"] += check_sysroot(name, ref, sim_ref, entry)
            except JobError as e:
                report["problems"].append(f"{name}: {e}")
            except Exception as e:  # a broken JSON line, a missing key: still a report, and a failure
                report["problems"].append(f"{name}: {type(e).__name__}: {e}")
            entry["seconds"]["total"] = round(time.perf_counter() - t0, 2)
    except JobError as e:
        report["problems"].append(str(e))
    qemu = shutil.which("qemu-aarch64-static")
    if qemu:
        out = subprocess.run([qemu, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
        report["qemu"] = out.strip()
    report["ok"] = not report["problems"] and len(report["sysroots"]) == len(names)
    report["seconds"] = round(time.perf_counter() - t_start, 2)
    with open(os.path.join(OUT, "report.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    print_report(report)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
