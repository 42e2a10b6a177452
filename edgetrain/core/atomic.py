"""Atomic file writes (no numpy): a temporary file beside the target, fsynced, renamed over it (os.replace) and
the directory fsynced, so that a crash at any instant leaves the old file or the new one, whole; and the removal
of the temporary files that killed writers left. The container format (container.py) writes through it, and so
does everything else edgetrain writes whole (exports, reports, the apps' state)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import BinaryIO

from .errors import ArtifactError, StorageError


def _temp_name(directory: str, base: str) -> str:
    return os.path.join(directory, f".{base}.{os.getpid()}.{os.urandom(4).hex()}.tmp")


def _temp_pattern(base: str) -> re.Pattern:
    """The temporary files of _temp_name for base: .BASE.PID.HEX8.tmp."""
    return re.compile(rf"\.{re.escape(base)}\.(\d{{1,10}})\.[0-9a-f]{{8}}\.tmp")


def _writer_alive(pid: int) -> bool:
    """Whether process pid may still be writing (signal 0 asks without signalling). A pid that is ours, exists or
    cannot be asked about counts as alive: only a temporary file whose writer is certainly gone is removed."""
    if pid == os.getpid():
        return True
    if not 0 < pid < 2**31:
        return False  # no process ever had it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: another user's process, alive
        return True
    return True


def remove_stale_temporaries(path: str | os.PathLike) -> list[str]:
    """Removes the temporary files that writers of path killed midway left beside it (.NAME.PID.HEX.tmp, see
    _replace_atomically) whose writer process is gone; a live writer's (ours, or another process's) stays.
    Returns the paths removed. Best effort: a file that cannot be listed or removed is left. POSIX only (elsewhere
    a process cannot be asked whether it lives without being signalled). A writer in another PID namespace
    sharing the folder (another container) would look gone: do not share checkpoint folders across them."""
    if os.name != "posix":
        return []
    directory, base = os.path.split(os.path.abspath(os.fspath(path)))
    pattern = _temp_pattern(base)
    removed = []
    try:
        with os.scandir(directory) as entries:
            stale = [
                e.path
                for e in entries
                if e.name.startswith(f".{base}.")
                and (m := pattern.fullmatch(e.name))
                and not _writer_alive(int(m.group(1)))
            ]
    except OSError:
        return []
    for tmp in stale:
        try:
            os.unlink(tmp)
            removed.append(tmp)
        except OSError:
            pass
    return removed


def _create_temp(path: str) -> tuple[int, str]:
    """A new file beside path (same directory, so os.replace is atomic), created with the usual permissions.
    OSError (a missing, read-only or forbidden folder) propagates: the caller names path."""
    directory, base = os.path.split(os.path.abspath(path))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = _temp_name(directory, base)
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise ArtifactError(f"cannot write '{path}': could not create a temporary file in {directory}")


def _fsync_dir(path: str) -> None:
    """Makes the rename durable; some systems (Windows) cannot open a directory, which is fine there."""
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _replace_atomically(path: str, fill: Callable[[BinaryIO], None], what: str = "") -> None:
    """fill() writes a temp file beside path, which is fsynced and renamed over path, and the directory fsynced:
    a crash at any instant leaves the old file or the new one, whole. On an error the temp file is removed. A
    file-system failure (missing, read-only or forbidden folder, full disk) is a StorageError naming path (not
    the temp file); `what` names the kind of file in its message ("the checkpoint"). Temporary files of path
    that killed writers left are removed first."""
    doing = f"cannot write {what}".rstrip()
    remove_stale_temporaries(path)
    try:
        fd, tmp = _create_temp(path)
    except OSError as e:
        raise StorageError.of(e, path, doing) from e
    try:
        with os.fdopen(fd, "wb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise StorageError.of(e, path, doing) from e
        raise
    _fsync_dir(path)


def atomic_write(path: str | os.PathLike, data: bytes) -> int:
    """Writes bytes to path atomically (see _replace_atomically); returns the size. A file-system failure is a
    StorageError naming path."""
    _replace_atomically(os.fspath(path), lambda f: f.write(data))
    return len(data)
