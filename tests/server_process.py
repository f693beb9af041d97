"""A test server in a child process: started on a free local port, awaited until ``GET /models`` answers,
stopped afterwards, and said to be dead when it dies.

A server that crashes mid-request leaves its clients with "connection closed" and then "connection
refused"; which process died, how, and where its log is are known only here, so the tests that use a
server go through :meth:`ServerProcess.alive` (before) and :meth:`ServerProcess.watch` (around the work).
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest


def _die_with_parent() -> None:
    """In the server's process: ask Linux to end it when the test process dies (no orphan server if the
    test run is killed before its ``finally``)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """``cmd`` (which must listen on ``port``) as a child process writing to ``log``; ``name`` is what the
    failure messages call it."""

    def __init__(self, name: str, cmd: Sequence[str], port: int, log: Path):
        self.name, self.cmd, self.log = name, list(cmd), log
        self.url = f"http://127.0.0.1:{port}/v1"
        self.proc: subprocess.Popen | None = None

    def exit_message(self) -> str | None:
        """``"the NAME exited with signal 11 (SIGSEGV) (log: PATH)"`` and the log's last lines once the process
        has ended, else None."""
        code = self.proc.poll() if self.proc is not None else None
        if code is None:
            return None
        how = f"signal {-code} ({signal.Signals(-code).name})" if code < 0 else f"status {code}"
        tail = self.log.read_text(errors="replace").splitlines()[-5:] if self.log.exists() else []
        return "\n".join([f"the {self.name} exited with {how} (log: {self.log})", *tail])

    def alive(self) -> None:
        """Fail the calling test, in one line, when the server has died."""
        if (message := self.exit_message()) is not None:
            pytest.fail(message, pytrace=False)

    @contextlib.contextmanager
    def watch(self) -> Iterator[None]:
        """Whatever the work inside raises, a dead server is what is reported: its exit, not the
        client's "connection refused" that follows from it."""
        try:
            yield
        except BaseException:
            # a crash closes the server's sockets before its exit status can be read: give it a moment
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=2)
            self.alive()
            raise

    @contextlib.contextmanager
    def running(self, wait: float = 300.0) -> Iterator[ServerProcess]:
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                self.cmd, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
            )
            try:
                deadline = time.monotonic() + wait
                while True:
                    self.alive()
                    try:
                        with urllib.request.urlopen(f"{self.url}/models", timeout=5):
                            break
                    except OSError:
                        if time.monotonic() > deadline:
                            pytest.fail(f"the {self.name} did not answer in {wait:.0f} s (log: {self.log})")
                        time.sleep(0.5)
                yield self
            finally:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
