"""Helpers shared by the benchmark scripts: options, the model a run measures, timing on CPU and CUDA, JSON
output, synthetic prompts. The machine line is in ``machine.py``, peak memory in ``memory.py``.

Every script takes the same options (as ``bench_tuning.py`` does): ``--model`` (``gpt2-random``, the
default: a randomly initialised GPT-2-small-shaped model built here; ``smollm2`` / ``gemma``: the offline
zoo's SmolLM2-135M and Gemma-3-270m; or a local model directory), ``--device {cpu,cuda}``, ``--threads``,
``--json PATH`` and ``--skip-memory``. Every script prints the machine line first."""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

WORDS = (
    "the of and to in a is that for it as was with be by on not he this are or his from at which but have an "
    "they you were her all she there would their we him been has when who will more no if out so said what up "
    "its about into than them can only other new some could time these two may then do first any my now such "
    "like our over man me even most made after also did many before must through back years where much your way "
    "well down should because each just those people how too little state good very make world still own see men "
    "work long get here between both life being under never day same another know while last might us great old "
    "year off come since against go came right used take three"
).split()

# --model names: the random GPT-2 shape of the original figures, and the offline zoo's pretrained models
RANDOM_GPT2 = "gpt2-random"
ZOO = {"smollm2": "offline:smollm2-135m", "gemma": "offline:gemma3-270m"}
MODEL_CHOICES = (RANDOM_GPT2, *ZOO)


def sentence(rng: random.Random, n_words: int) -> str:
    words = [rng.choice(WORDS) for _ in range(n_words)]
    return " ".join(words).capitalize() + "."


# ---------------------------------------------------------------------------------------------------------
# options


class BenchError(Exception):
    """A bad option or a missing prerequisite: reported as ``error: ...`` with exit status 2."""


def model_name(value: str) -> str:
    """argparse type of ``--model``: a known name or an existing local model directory."""
    if value in MODEL_CHOICES or (Path(value) / "config.json").is_file():
        return value
    raise argparse.ArgumentTypeError(
        f"unknown model {value!r}: use one of {', '.join(MODEL_CHOICES)} or a local model directory"
    )


def add_common_args(parser: argparse.ArgumentParser, *, threads: int = 2) -> None:
    parser.add_argument(
        "--model",
        type=model_name,
        default=RANDOM_GPT2,
        help=f"{RANDOM_GPT2} (random GPT-2 small, the default), {', '.join(f'{k} ({v})' for k, v in ZOO.items())}, "
        "or a local model directory",
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=threads, help="torch CPU threads")
    parser.add_argument("--json", metavar="PATH", help="also write the figures to this JSON file")
    parser.add_argument("--skip-memory", action="store_true", help="time only; no peak-memory runs")
    parser.add_argument("--memory-job", nargs=2, metavar=("JOB", "OUT"), help=argparse.SUPPRESS)


def setup(args: argparse.Namespace) -> None:
    """Threads and device checks, before any model is built."""
    import torch

    if args.threads < 1:
        raise BenchError(f"--threads must be at least 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    import transformers

    transformers.utils.logging.disable_progress_bar()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise BenchError("--device cuda, but torch.cuda.is_available() is False on this machine")


def run_main(main: Callable[[], None]) -> None:
    """Entry point wrapper: bad input prints one ``error:`` line and exits 2, not a stack trace."""
    from cblight.errors import CblightError

    try:
        main()
    except (BenchError, CblightError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


# ---------------------------------------------------------------------------------------------------------
# models


def random_gpt2_dir(layers: int = 12, width: int = 768, n_positions: int = 1024) -> Path:
    """A randomly initialised GPT-2 (``GPT2Config()`` defaults at 12 x 768: GPT-2 small, 124M) with the
    real GPT-2 tokenizer, saved once under the temp directory (written aside, then renamed into place)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from cblight.tiny import gpt2_tokenizer

    path = Path(tempfile.gettempdir()) / f"cblight-bench-gpt2-{layers}x{width}-{n_positions}"
    if (path / "config.json").exists():
        return path
    torch.manual_seed(0)
    tok = gpt2_tokenizer()
    config = GPT2Config(n_layer=layers, n_embd=width, n_positions=n_positions, pad_token_id=tok.eos_token_id)
    partial = Path(tempfile.mkdtemp(prefix=path.name + ".", dir=path.parent))
    GPT2LMHeadModel(config).save_pretrained(partial)
    tok.save_pretrained(partial)
    try:
        partial.rename(path)
    except OSError:  # another process finished first
        import shutil

        shutil.rmtree(partial, ignore_errors=True)
    return path


def model_source(name: str, *, layers: int = 12, width: int = 768) -> str:
    """What ``load_causal_lm`` loads for a ``--model`` value."""
    if name == RANDOM_GPT2:
        return str(random_gpt2_dir(layers, width))
    return ZOO.get(name, name)


def load_model(args: argparse.Namespace, *, layers: int = 12, width: int = 768) -> tuple[Any, Any]:
    """(model in eval mode on ``args.device``, tokenizer) for ``args.model``."""
    from cblight.models import load_causal_lm, load_tokenizer

    source = model_source(args.model, layers=layers, width=width)
    return load_causal_lm(source, device=args.device), load_tokenizer(source)


def model_facts(model: Any, name: str) -> dict[str, Any]:
    config = model.config
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    n_params = sum(p.numel() for p in model.parameters())
    return {
        "name": name,
        "source": ZOO.get(name, "GPT2Config() random" if name == RANDOM_GPT2 else name),
        "architecture": config.model_type,
        "parameters": n_params,
        "vocab": int(head.shape[0]),
        "width": int(emb.shape[1]),
        "layers": int(getattr(config, "num_hidden_layers", getattr(config, "n_layer", 0))),
        "dtype": str(emb.dtype).removeprefix("torch."),
        "weights_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
    }


def describe(facts: dict[str, Any]) -> str:
    return (
        f"model: {facts['name']} ({facts['source']}; {facts['architecture']}, {facts['layers']} layers x "
        f"{facts['width']}, vocab {facts['vocab']}, {facts['parameters'] / 1e6:.0f}M parameters, {facts['dtype']})"
    )


def announce(args: argparse.Namespace, model: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Print the machine line and the model line every script starts with; return both as facts for
    ``--json``."""
    from benchmarks import machine

    host = machine.info(args)
    print(machine.line(host))
    facts = model_facts(model, args.model)
    print(describe(facts))
    return host, facts


# ---------------------------------------------------------------------------------------------------------
# timing


def synchronize(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def timed(fn: Callable[[], object], device: str) -> tuple[float, object]:
    """Wall seconds of ``fn()`` under ``no_grad``; on CUDA the queued kernels are waited for on both
    sides, so the time is the GPU's, not the launch's."""
    import torch

    synchronize(device)
    start = time.perf_counter()
    with torch.no_grad():
        out = fn()
    synchronize(device)
    return time.perf_counter() - start, out


def interleaved(
    jobs: dict[str, Callable[[], object]], repeats: int, device: str, *, warmup: bool = True
) -> tuple[dict[str, list[float]], dict[str, object]]:
    """Every job's wall times over ``repeats`` rounds, the jobs back to back within a round, so that load
    from other processes on a shared machine hits all of them alike; and each job's last output."""
    if warmup:
        for fn in jobs.values():
            timed(fn, device)
    times: dict[str, list[float]] = {name: [] for name in jobs}
    out: dict[str, object] = {}
    for _ in range(repeats):
        for name, fn in jobs.items():
            seconds, out[name] = timed(fn, device)
            times[name].append(seconds)
    return times, out


def median(xs: list[float]) -> float:
    return statistics.median(xs)


# ---------------------------------------------------------------------------------------------------------
# output


def write_json(path: str | Path, payload: dict[str, Any]) -> None:
    """Written aside and renamed into place: a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(payload, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def record(
    benchmark: str, args: argparse.Namespace, machine: dict[str, Any], model: dict[str, Any], **parts: Any
) -> dict[str, Any]:
    """The JSON of one run: what ran, where, on which model, and its figures (``parts``: ``settings``,
    ``seconds`` per side, ``peak_bytes`` per side, ``ratios`` by name)."""
    machine = {**machine, "load_average_end": [round(x, 2) for x in os.getloadavg()]}
    return {
        "benchmark": benchmark,
        "command": " ".join(["python", *sys.argv]),
        "machine": machine,
        "model": model,
        **parts,
    }


def finish(args: argparse.Namespace, payload: dict[str, Any]) -> None:
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        write_json(args.json, payload)
        print(f"figures written to {args.json}")
