"""The output directory of a run: where it is (``{model}`` filled in), whether it can be written, and the
lock that keeps two runs from writing it at once.

Shared by every evaluation module and the CLI, below all of them: it imports only its errors and
``cblight.models`` (for the model's short name: ``offline:smollm2-135m`` -> ``smollm2-135m``). The CLI
checks the directory and takes the lock right after parsing the command line, before any model or data is
loaded.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cblight.errors import CblightError

LOCK_NAME = ".cblight.lock"


class OutputDirError(CblightError):
    """An output directory that cannot be used: a file in its path, not writable, or in use by another run."""


def resolve_output_dir(template: str, model: str) -> Path:
    """``template`` with ``{model}`` replaced by the model's short name (``gpt2``, ``Llama-2-7b-hf``, ``smollm2-135m``)."""
    from cblight.models import model_label

    return Path(template.replace("{model}", model_label(model)))


def check_output_dir(path: Path, option: str = "model.output_dir") -> None:
    """Refuse a directory that could not hold the results: a file on its path, or a deepest existing
    directory that cannot be written (read-only file system, permissions). Checked by writing, and at once
    removing, a probe file, which also catches what ``os.access`` misses for root."""
    path = Path(path).expanduser()
    existing = path
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        where = "it" if existing == path else str(existing)
        raise OutputDirError(f"{option} {str(path)!r} cannot be a directory: {where} is a file")
    try:
        fd, probe = tempfile.mkstemp(prefix=".cblight-probe-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise OutputDirError(f"{option} {str(path)!r} is not writable ({existing}: {err.strerror})") from None


def _process_start(pid: int) -> str | None:
    """The start time of a process in clock ticks since boot (Linux), to tell a reused pid from the locker."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(owner: dict[str, Any]) -> bool:
    pid = owner.get("pid")
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    started = owner.get("proc_start")
    return started is None or _process_start(pid) in (None, started)


class OutputLock:
    """An exclusive lock on an output directory (``<dir>/.cblight.lock``, holding the owner's pid, host,
    start time and command). A second run is refused with a message naming the first; a lock left by a
    process that no longer runs on this host is taken over. Released at exit."""

    def __init__(self, directory: str | Path, option: str = "model.output_dir"):
        self.dir = Path(directory).expanduser()
        self.path = self.dir / LOCK_NAME
        self.option = option
        self.held = False
        self._created: list[Path] = []  # directories the lock made, removed again if left empty

    def _owner(self) -> dict[str, Any] | None:
        try:
            owner = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}
        return owner if isinstance(owner, dict) else {}

    def acquire(self) -> OutputLock:
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "proc_start": _process_start(os.getpid()),
            "command": " ".join(sys.argv),
        }
        try:
            missing = self.dir
            while not missing.exists() and missing != missing.parent:
                self._created.append(missing)
                missing = missing.parent
            self.dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f"{LOCK_NAME}.", dir=self.dir)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(info, fh)
        except OSError as err:
            raise OutputDirError(
                f"{self.option} {str(self.dir)!r} is not writable ({err.strerror})"
            ) from None
        try:
            for _ in range(3):
                try:
                    os.link(tmp, self.path)  # atomic: fails when a lock exists, never shows half a file
                    self.held = True
                    atexit.register(self.release)
                    return self
                except FileExistsError:
                    owner = self._owner()
                    if owner is None:
                        continue  # released meanwhile
                    same_host = owner.get("host") == info["host"]
                    if owner and same_host and _alive(owner):
                        raise OutputDirError(self._busy(owner)) from None
                    if owner and not same_host:
                        raise OutputDirError(
                            self._busy(owner) + f"; if that run is dead, delete {self.path}"
                        ) from None
                    self.path.unlink(missing_ok=True)  # stale: its process is gone (or the file is garbage)
            raise OutputDirError(f"{self.option} {str(self.dir)!r}: could not take the lock {self.path}")
        finally:
            Path(tmp).unlink(missing_ok=True)

    def _busy(self, owner: dict[str, Any]) -> str:
        return (
            f"{self.option} {str(self.dir)!r} is in use by another run (pid {owner.get('pid')} on host "
            f"{owner.get('host')}, started {owner.get('started')}: {owner.get('command', '')[:200]}); "
            "wait for it to finish or choose another output_dir"
        )

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        owner = self._owner()
        if owner and owner.get("pid") == os.getpid():
            self.path.unlink(missing_ok=True)
        for directory in self._created:  # a run refused before writing anything leaves no directory
            try:
                directory.rmdir()
            except OSError:
                break  # not empty: the run wrote results there

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()
