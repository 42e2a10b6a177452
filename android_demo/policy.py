"""The "may I train now?" policy (standard library only): a policy name -> (allowed, why), from the phone's battery
as Termux:API reports it (`termux-battery-status`) and the system's load.

    always          train whenever asked
    charging        only while the phone charges (or is full on the charger)
    charging-idle   only while it charges and the system is idle (load average below half the cores)

Where no battery can be read (a desktop, Termux without the Termux:API app), `charging` and `charging-idle` say
so and allow training: the policy protects a phone's battery, and there is none to protect.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

from edgetrain.core.errors import ConfigError

POLICIES = ("always", "charging", "charging-idle")


def battery() -> dict | None:
    """Termux:API's battery status ({"status": "CHARGING", "plugged": "PLUGGED_AC", "percentage": 80, ...}), or the
    Linux power-supply class's, or None when neither exists."""
    cmd = shutil.which("termux-battery-status")
    if cmd:
        try:
            out = subprocess.run([cmd], capture_output=True, text=True, timeout=10, check=True).stdout
            status = json.loads(out)
            if isinstance(status, dict):
                return status
        except (OSError, subprocess.SubprocessError, ValueError):
            return None
    root = "/sys/class/power_supply"
    try:
        supplies = sorted(os.listdir(root))
    except OSError:
        return None
    for name in supplies:  # a laptop or a phone with a readable sysfs
        try:
            with open(os.path.join(root, name, "type")) as f:
                if f.read().strip() != "Battery":
                    continue
            with open(os.path.join(root, name, "status")) as f:
                return {"status": f.read().strip().upper(), "source": f"{root}/{name}"}
        except OSError:
            continue
    return None


def idle() -> tuple[bool, str]:
    try:
        load = os.getloadavg()[0]
    except OSError:
        return True, "load unknown"
    cores = os.cpu_count() or 1
    return load < cores / 2, f"load {load:.2f} on {cores} cores"


def may_train(policy: str) -> tuple[bool, str]:
    """(allowed, why) for a policy name; ConfigError (a ValueError) for an unknown one."""
    if policy not in POLICIES:
        raise ConfigError(f"unknown training policy {policy!r}; use one of: {', '.join(POLICIES)}")
    if policy == "always":
        return True, "always allowed"
    b = battery()
    if b is None:
        return True, "no battery status can be read here (Termux:API's termux-battery-status): allowed"
    status = str(b.get("status", "")).upper()
    charging = status in ("CHARGING", "FULL") or str(b.get("plugged", "")).upper().startswith("PLUGGED_")
    if not charging:
        return False, f"not charging (battery {status.lower() or 'unknown'}); training waits for the charger"
    if policy == "charging":
        return True, "charging"
    quiet, load = idle()
    return (True, f"charging and idle ({load})") if quiet else (False, f"charging but busy ({load})")
