"""How many threads numpy's BLAS uses (standard library and numpy only).

BLAS threads are the process's, not a session's: setting them for one session sets them for all. threadpoolctl,
when installed, knows every BLAS build; without it, the OpenBLAS that numpy's wheels bundle (the library
numpy loaded, found in /proc/self/maps) is asked directly. Elsewhere (another BLAS, no /proc) the variables
OMP_NUM_THREADS / OPENBLAS_NUM_THREADS, set before Python starts, are the way, and blas_threads says so.
"""

from __future__ import annotations

import ctypes
import re
import warnings

from edgetrain.core.errors import ConfigError

_SETTERS = (
    "openblas_set_num_threads",
    "openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
)
_limits = None  # threadpoolctl's limiter, kept alive for the process


def _openblas_libraries() -> list[str]:
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            maps = f.read()
    except OSError:
        return []
    return sorted(set(re.findall(r"(/\S*openblas\S*\.so[\w.]*)", maps)))


def _openblas(n: int | None) -> tuple[int | None, str]:
    """(threads now, how) of the OpenBLAS numpy loaded, after setting n when given."""
    import numpy  # noqa: F401  (loads numpy's BLAS, so that it is in the map)

    for path in _openblas_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _SETTERS:
            setter = getattr(lib, name, None)
            if setter is None:
                continue
            getter = getattr(lib, name.replace("set_num", "get_num"), None)
            if n is not None:
                setter(ctypes.c_int(n))
            now = int(getter()) if getter is not None else n
            return now, f"OpenBLAS ({path.rsplit('/', 1)[-1]})"
    return None, ""


def blas_threads(n: int | None = None) -> tuple[int | None, str]:
    """Sets numpy's BLAS to n threads (None: only asks); returns (threads now or None when unknown, how, or
    why it could not be done)."""
    global _limits
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ConfigError(f"threads must be a whole number >= 1, not {n!r}")
    try:
        from threadpoolctl import threadpool_info, threadpool_limits  # optional: knows every BLAS build
    except ImportError:
        pass
    else:
        if n is not None:
            _limits = threadpool_limits(limits=n, user_api="blas")
        blas = [p for p in threadpool_info() if p.get("user_api") == "blas"]
        if blas:
            return int(blas[0]["num_threads"]), f"threadpoolctl ({blas[0].get('internal_api', 'blas')})"
    now, how = _openblas(n)
    if how:
        return now, how
    return None, (
        "numpy's BLAS here is not one edgetrain can reach (install threadpoolctl, or set OMP_NUM_THREADS and "
        "OPENBLAS_NUM_THREADS before starting Python)"
    )


def apply_threads(threads: int | None) -> int | None:
    """A session's threads= (BLAS threads: the process's); warns when this numpy's BLAS cannot be told, and returns
    the number in effect (None when unknown)."""
    if threads is None:
        return None
    now, how = blas_threads(threads)
    if now is None:
        warnings.warn(f"threads={threads} was not applied: {how}", RuntimeWarning, stacklevel=3)
    return now
