"""The machine line every benchmark prints first, and its JSON: CPU model, caches, threads, torch, the GPU.

A ratio measured on one machine moves on another (docs/metrics.md, "Speed: LTF/δ", shows by how much and
why), so every figure carries the machine it came from.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path
from typing import Any


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def cpu_facts() -> dict[str, Any]:
    """CPU model and caches from /proc/cpuinfo and sysfs (Linux; fields are empty elsewhere). VMs often
    show a generic name ("AMD EPYC"): family/model/stepping then tell the generation (family 25 model 17
    is Zen 4, 25/1 Zen 3, 23/49 Zen 2)."""
    fields: dict[str, str] = {}
    for line in _read("/proc/cpuinfo").splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key and key not in fields:
            fields[key] = value.strip()
        if not line.strip() and fields:
            break  # the first processor is enough
    flags = fields.get("flags", "").split()
    caches = {}
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        level, kind = _read(f"{index}/level"), _read(f"{index}/type")
        if kind in ("Unified", "Data"):
            caches[f"L{level}"] = _read(f"{index}/size")
    thp = _read("/sys/kernel/mm/transparent_hugepage/enabled")
    return {
        "cpu": fields.get("model name") or platform.processor() or platform.machine(),
        "cpu_family_model_stepping": "/".join(
            fields.get(k, "?") for k in ("cpu family", "model", "stepping")
        ),
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "caches": dict(sorted(caches.items())),
        "avx512": "avx512f" in flags,
        "virtualised": "hypervisor" in flags,
        "transparent_hugepages": thp[thp.find("[") + 1 : thp.find("]")] if "[" in thp else thp,
    }


PERF_ENV = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OMP_WAIT_POLICY",
    "GOMP_SPINCOUNT",
    "THP_MEM_ALLOC_ENABLE",
    "ATEN_CPU_CAPABILITY",
    "MKL_ENABLE_INSTRUCTIONS",
    "ONEDNN_MAX_CPU_ISA",
    "LD_PRELOAD",
    "MALLOC_MMAP_THRESHOLD_",
)


def info(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import transformers

    info: dict[str, Any] = {
        **cpu_facts(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "blas": "MKL" if torch.backends.mkl.is_available() else "other",
        # settings that move the figures (threads, OpenMP waiting, huge pages for torch's allocations)
        "env": {k: v for k, v in os.environ.items() if k in PERF_ENV},
        "device": args.device,
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }
    if args.device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
        info["cuda"] = torch.version.cuda
    return info


def line(info: dict[str, Any]) -> str:
    caches = ", ".join(f"{k} {v}" for k, v in info["caches"].items())
    cpu = (
        f"CPU {info['cpu']} (family/model/stepping {info['cpu_family_model_stepping']}"
        f"{'; ' + caches if caches else ''}), {info['cpus_usable']} of {info['cpus']} CPUs usable"
        f"{', virtualised' if info['virtualised'] else ''}, THP {info['transparent_hugepages'] or '?'}"
    )
    env = "".join(f", {k}={v}" for k, v in info["env"].items())
    torch_part = (
        f"torch {info['torch']} ({info['torch_cpu_capability']}, {info['blas']}), "
        f"{info['torch_threads']} threads, transformers {info['transformers']}{env}"
    )
    gpu = f"; GPU {info['gpu']} (CUDA {info['cuda']})" if info["device"] == "cuda" else ""
    load = " ".join(str(x) for x in info["load_average_start"])
    return f"machine: {cpu}; {torch_part}{gpu}; device {info['device']}; load average {load}"
