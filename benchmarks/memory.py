"""Peak memory of each measured side of a benchmark.

The peak memory of a side is the most memory in use while it runs *above* what was in use just before (model
and inputs already resident). On CPU each side runs in a fresh process (``--memory-job``): the process's
peak RSS (Linux ``VmHWM``, reset through ``/proc/self/clear_refs``) above its RSS before the side. That
process runs with glibc's ``MALLOC_MMAP_THRESHOLD_`` fixed at 64 KiB, so that every buffer from 64 KiB up
is mapped when allocated and unmapped when freed: otherwise malloc's heap keeps what model loading or a
warm-up freed, a later allocation reuses it without raising the RSS, and a side would look free. On CUDA
``torch.cuda.max_memory_allocated`` above ``memory_allocated`` after a warm-up run, in the timing process
(the allocator's counters count live tensors, whatever it has cached).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import ROOT, BenchError, timed, write_json


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise BenchError(f"no {field} in /proc/self/status")


def peak_here(fn: Callable[[], object], device: str) -> int:
    """Peak bytes in use while ``fn`` runs above those in use before it, in this process: on CUDA after a
    warm-up run; on CPU its first run, in a process started as the module docstring says."""
    import torch

    if device == "cuda":
        timed(fn, device)
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        timed(fn, device)
        return torch.cuda.max_memory_allocated() - before
    # torch's lazy one-time set-up (thread pool, kernel tables; 0 to 8 MiB depending on the environment)
    # is not the side's memory: a parallel reduction on a freed 4 MiB tensor does it before the reading
    torch.ones(1 << 20).sum()
    gc.collect()
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    except OSError as err:
        raise BenchError(
            f"CPU peak memory needs Linux /proc/self/clear_refs ({err}); pass --skip-memory"
        ) from err
    before = _status_kib("VmRSS")
    with torch.no_grad():
        fn()
    return (_status_kib("VmHWM") - before) * 1024


def peaks(
    jobs: dict[str, Callable[[], object]], names: list[str], args: argparse.Namespace, **child_args: str
) -> dict[str, int]:
    """Peak bytes of each named side: on CUDA here, on CPU each in a fresh run of this script with
    ``--memory-job NAME OUT`` (plus ``child_args`` as ``--key value`` options overriding the run's)."""
    if args.device == "cuda":
        return {name: peak_here(jobs[name], "cuda") for name in names}
    out: dict[str, int] = {}
    extra = [x for key, value in child_args.items() for x in (f"--{key.replace('_', '-')}", value)]
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            result = Path(tmp) / f"{name}.json"
            cmd = [sys.executable, sys.argv[0], *sys.argv[1:], *extra, "--memory-job", name, str(result)]
            proc = subprocess.run(cmd, env=child_env(), capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(
                    f"memory run of {name!r} failed:\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}"
                )
            out[name] = json.loads(result.read_text())["peak_bytes"]
            print(f"  peak memory of {name}: {out[name] / 2**20:.1f} MiB", flush=True)
    return out


def child_env() -> dict[str, str]:
    """The environment of a CPU memory run (see the module docstring)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env["MALLOC_MMAP_THRESHOLD_"] = str(64 * 1024)
    return env


def child(jobs: dict[str, Callable[[], object]], args: argparse.Namespace) -> None:
    """The ``--memory-job JOB OUT`` side of :func:`peaks`."""
    job, out = args.memory_job
    write_json(out, {"job": job, "peak_bytes": peak_here(jobs[job], args.device)})


def ratio(peak: dict[str, int], num: str, den: str) -> float | None:
    """``peak[num] / peak[den]``; None below 1 MiB in the denominator, where RSS granularity and
    allocator noise make a quotient meaningless."""
    return peak[num] / peak[den] if peak[den] >= 2**20 else None


def line(label: str, peak: dict[str, int], ours: str, theirs: str) -> str:
    quotient = ratio(peak, theirs, ours)
    return (
        f"  peak memory, {label}: {ours} {peak[ours] / 2**20:.1f} MiB, {theirs} {peak[theirs] / 2**20:.1f} MiB"
        f" -> {theirs}/{ours} "
        + (f"{quotient:.2f}x" if quotient is not None else f"n/a ({ours} below 1 MiB)")
    )


def note(device: str) -> str:
    if device == "cuda":
        return "CUDA max_memory_allocated above the allocation before the side (model and inputs resident)"
    return "peak RSS above the RSS before the side (model and inputs resident), a fresh process per side"
