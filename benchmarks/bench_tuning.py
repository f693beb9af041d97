"""Speed and memory of coherence tuning (docs/design.md, "Speed floors"), on a GPT-2-small-shaped random model
(``GPT2Config()`` defaults, built here) or a real one (``--model smollm2`` / ``gemma``: the offline zoo's
SmolLM2-135M, vocabulary 49152, and Gemma-3-270m, vocabulary 262144).

1. One tuning step (sample ``--new`` tokens + boosted teacher + student forward/backward) against a plain
   causal-LM training step (forward/backward of the cross-entropy) on the same ``[batch, prompt + new]``
   token batch, in this process; KL over the last ``--last-m`` positions and over all sampled positions.
   The optimizer step is left out of both. Goal: at most 3x the time with the last 8 positions.
   Peak memory of each step, each measured in a fresh subprocess after a warm-up step: on CPU the peak
   RSS above the process's RSS before the step (Linux ``/proc/self/clear_refs`` resets the high-water
   mark), on CUDA ``torch.cuda.max_memory_allocated`` above the allocation before the step. Goal: the
   tuning step's peak at most 1.5x the plain step's.
2. Throughput of the full Lightning training step (AdamW included) with 2 CPU DDP processes (gloo) of one
   thread each against one process of one thread, same per-process batch. Floor: at least 1.6x. For
   context it also runs two independent one-process jobs at once (no communication): what the machine
   itself gives two processes, the ceiling for DDP.
3. ``--strategy ddp fsdp2``: the same 2-process Lightning run replicated (DDP) and sharded (FSDP2,
   ``cblight.sharding.FSDP2Strategy``), per process: the bytes of its model states (its parameters,
   gradients and AdamW states of the student, and the frozen teacher's parameters; under FSDP2 its
   shards), its peak RSS (and that before the first step, the models built) and the step time. Goal:
   FSDP2's model states at most 0.55x DDP's. The workers run with glibc's ``MALLOC_MMAP_THRESHOLD_`` at
   64 KiB (as ``benchmarks/memory.py``'s), so that the RSS follows live tensors.
4. ``--lora-rank R``: peak RSS of a one-process LoRA run with the defaults (the frozen teacher and the
   collapse guard, validating: both need the initial model) against a plain LoRA run (the live teacher,
   no guard: nothing but the student), each in a fresh process. Goal: at most 1.1x (the initial model is
   the student with its adapters disabled, not a copy).

    python benchmarks/bench_tuning.py                     # parts 1 and 2, defaults below
    python benchmarks/bench_tuning.py --skip-ddp --batch 8 --repeats 5
    python benchmarks/bench_tuning.py --model smollm2 --skip-ddp --batch 2 --repeats 3          # CPU
    python benchmarks/bench_tuning.py --model gemma --device cuda --skip-ddp --batch 32 --prompt 32
    python benchmarks/bench_tuning.py --model smollm2 --skip-steps --skip-memory --strategy ddp fsdp2 \
        --skip-ceiling --batch 2 --prompt 16 --new 16 --k 8 --lora-rank 8

The machine is shared: the script prints the load average before and after, so a disturbed run shows.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def build_model(out: Path) -> Path:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from cblight.tiny import gpt2_tokenizer

    torch.manual_seed(0)
    tok = gpt2_tokenizer()
    GPT2LMHeadModel(GPT2Config()).save_pretrained(out)
    tok.save_pretrained(out)
    return out


PARTS = ("sampling", "teacher", "student")


class Split:
    """Where a tuning step's time goes: ``sampling`` (``generate``), ``teacher`` (every forward pass made with
    no gradient inside the loss: the frozen teacher's full-context pass and the ``k``-token windows) and
    ``student`` (the rest: the student's forward, the divergence in chunks, the backward pass). Forward
    passes are timed through an instance attribute set on the models only while the loss runs, so that the
    sampling loop (and a compiled decode step) never sees the timer."""

    def __init__(self, device: str):
        self.device = device
        self.wall = dict.fromkeys(PARTS, 0.0)
        self.cpu = dict.fromkeys(PARTS, 0.0)

    def add(self, part: str, wall: float, cpu: float) -> None:
        self.wall[part] += wall
        self.cpu[part] += cpu

    def reset(self) -> None:
        self.wall = dict.fromkeys(PARTS, 0.0)
        self.cpu = dict.fromkeys(PARTS, 0.0)

    def timing_forwards(self, models: list[Any]) -> Any:
        import contextlib
        import functools

        import torch

        split = self

        @contextlib.contextmanager
        def patched():
            for model in models:
                inner = model.forward

                @functools.wraps(inner)
                def forward(*a, _inner=inner, **kw):
                    if torch.is_grad_enabled():
                        return _inner(*a, **kw)
                    _sync(split.device)
                    wall, cpu = time.perf_counter(), time.process_time()
                    out = _inner(*a, **kw)
                    _sync(split.device)
                    split.add("teacher", time.perf_counter() - wall, time.process_time() - cpu)
                    return out

                model.forward = forward
            try:
                yield
            finally:
                for model in models:
                    del model.forward  # back to the class's method

        return patched()


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _interleaved(
    jobs: dict[str, Callable[[], object]], repeats: int, device: str, split: Split
) -> dict[str, dict[str, float]]:
    """Median wall time and CPU time (this process, all threads) of each job, and each tuning job's median
    split, the jobs timed back to back in every repeat, so that a slow spell of the machine hits all of them
    alike (timing one job after the other skews their ratios). On a shared machine the CPU time is the
    steadier figure: it does not count the time the process waited for a core."""
    for fn in jobs.values():
        fn()  # warm-up
    rows: dict[str, dict[str, list[float]]] = {name: {} for name in jobs}
    for _ in range(repeats):
        for name, fn in jobs.items():
            split.reset()
            _sync(device)
            wall, cpu = time.perf_counter(), time.process_time()
            fn()
            _sync(device)
            figures = {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}
            if name in ("last", "all"):
                figures["student_wall"] = figures["wall"] - split.wall["sampling"] - split.wall["teacher"]
                figures["student_cpu"] = figures["cpu"] - split.cpu["sampling"] - split.cpu["teacher"]
                for part in ("sampling", "teacher"):
                    figures[f"{part}_wall"], figures[f"{part}_cpu"] = split.wall[part], split.cpu[part]
            for key, value in figures.items():
                rows[name].setdefault(key, []).append(value)
    return {name: {k: statistics.median(v) for k, v in row.items()} for name, row in rows.items()}


ZOO = {"smollm2": "offline:smollm2-135m", "gemma": "offline:gemma3-270m"}


def _rollout_kwargs(args: argparse.Namespace, model: Any) -> dict[str, Any]:
    """``sample_sequences``'s decoding arguments from ``--rollout-cache`` / ``--rollout-compile``."""
    if args.rollout_cache == "dynamic" and not args.rollout_compile:
        return {}  # the call every version of sample_sequences takes
    import torch

    from cblight.tune.rollouts import RolloutOptions

    options = RolloutOptions(cache=args.rollout_cache, compile=True if args.rollout_compile else None)
    static, compiled = options.resolve(model, torch.device(args.device))
    return {"static_cache_len": args.prompt + args.new, "compile": compiled} if static else {}


def _steps(
    model_dir: str, args: argparse.Namespace, split: Split | None = None
) -> tuple[Any, dict[str, Callable[[], object]]]:
    """The model and the jobs: a plain step, tuning steps (last m, all positions), sampling alone."""
    import torch

    from cblight.models import load_causal_lm
    from cblight.tune.coherence_tuning import disable_dropout
    from cblight.tune.loss import LossOptions, tuning_kl_terms
    from cblight.tune.rollouts import sample_sequences

    torch.set_num_threads(args.threads)
    split = split or Split(args.device)
    model = load_causal_lm(model_dir).to(args.device)
    disable_dropout(model)
    model.train()
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, model.config.vocab_size - 1, (args.batch, args.prompt), generator=g)
    prompts = prompts.to(args.device)
    mask = torch.ones_like(prompts)
    eos = model.config.eos_token_id
    rollout = _rollout_kwargs(args, model)

    def sample():
        return sample_sequences(
            model, prompts, mask, max_new_tokens=args.new, eos_token_id=eos, pad_token_id=eos, **rollout
        )

    fixed = sample()
    assert fixed.sampled.sum() > 0
    # the frozen teacher's weights are a constant cost (one copy), outside the per-step peaks measured here
    teacher = None
    if args.teacher == "frozen":
        import copy

        teacher = copy.deepcopy(model).eval().requires_grad_(False)
    timed_models = [model] + ([teacher] if teacher is not None else [])

    def plain():
        model.zero_grad(set_to_none=True)
        out = model(input_ids=fixed.sequences, attention_mask=fixed.attention_mask, labels=fixed.sequences)
        out.loss.backward()

    def tuning(last_m):
        def run():
            model.zero_grad(set_to_none=True)
            _sync(args.device)
            wall, cpu = time.perf_counter(), time.process_time()
            sampled = sample()
            _sync(args.device)
            split.add("sampling", time.perf_counter() - wall, time.process_time() - cpu)
            with split.timing_forwards(timed_models):
                terms = tuning_kl_terms(
                    model,
                    sampled,
                    k=args.k,
                    alpha=args.alpha,
                    options=LossOptions(last_m=last_m),
                    teacher_model=teacher,
                )
            (terms.loss_sum / max(terms.kl.numel(), 1) + terms.anchor).backward()

        return run

    return model, {"plain": plain, "last": tuning(args.last_m), "all": tuning(None), "sample": sample}


def step_ratios(model_dir: str, args: argparse.Namespace) -> dict[str, Any]:
    split = Split(args.device)
    _, jobs = _steps(model_dir, args, split)
    t = _interleaved(jobs, args.repeats, args.device, split)
    out: dict[str, Any] = {"medians": t}
    for clock in ("wall", "cpu"):
        plain = t["plain"][clock]
        out[clock] = {
            "plain_s": plain,
            "sample_only_s": t["sample"][clock],
            "ratio_last_m": t["last"][clock] / plain,
            "ratio_all": t["all"][clock] / plain,
            "ratio_sample": t["sample"][clock] / plain,
        }
        for job in ("last", "all"):
            out[clock][f"{job}_s"] = t[job][clock]
            for part in PARTS:
                out[clock][f"{job}_{part}_x"] = t[job][f"{part}_{clock}"] / plain
    return out


# ---------------------------------------------------------------------------------------------------------
# DDP throughput: each process is a worker started by this script


def _local_bytes(tensors: Any) -> int:
    """Bytes of the elements this process holds of ``tensors`` (a DTensor: its local shard). Elements, not
    storages: a shard or a DDP gradient is often a view into a larger buffer."""
    from torch.distributed.tensor import DTensor

    local = [t.to_local() if isinstance(t, DTensor) else t for t in tensors if t is not None]
    return sum(t.numel() * t.element_size() for t in local)


#: The Lightning workers' prompts (``--prompt`` sizes part 1 only): three sentences, about 50 tokens.
WORKER_PROMPT = "prompts of 3 sentences (~50 tokens)"
#: What a worker runs: the strategy of 2 processes (or 1), or one of the two LoRA runs of part 4.
KINDS = ("ddp", "fsdp2", "lora-defaults", "lora-plain")


def worker(model_dir: str, out_file: str, args: argparse.Namespace) -> None:
    """One process of a Lightning tuning run (``args.worker_kind``, ``KINDS``): its step times, model-state
    bytes and peak RSS to ``OUT.rank<r>``."""
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import Callback

    from cblight.options import Boosting
    from cblight.sharding import FSDP2Strategy
    from cblight.tune.callbacks import GuardOptions
    from cblight.tune.coherence_tuning import CoherenceTuning
    from cblight.tune.export import ExportOptions
    from cblight.tune.lora import LoraOptions
    from cblight.tune.loss import LossOptions
    from cblight.tune.prompt_data import PromptDataModule
    from cblight.tune.teacher import TeacherOptions
    from cblight.tune.validation import ValidationOptions

    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    kind = args.worker_kind

    class StepTimer(Callback):
        """Wall time per step, this process's CPU time per step (all its threads, gloo's included), and the
        bytes of its model states while the gradients are there (before the optimizer step)."""

        def __init__(self):
            self.times: list[float] = []
            self.cpu: list[float] = []
            self.states: dict[str, int] = {}

        def on_train_start(self, trainer, pl_module):
            self.built_peak = _rss_kib("VmHWM") * 1024  # the models built, no step taken

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.start, self.cpu_start = time.perf_counter(), time.process_time()

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            params = list(pl_module.model.parameters())
            teacher = pl_module.teacher
            copies = {id(m): m for m in (teacher.model, teacher.initial) if isinstance(m, torch.nn.Module)}
            optim = [t for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t)]
            self.states = {
                "parameters": _local_bytes(params),
                "gradients": _local_bytes(p.grad for p in params),
                "optimizer": _local_bytes(optim),  # empty before the first step: read at the last one
                "teacher": sum(_local_bytes(m.parameters()) for m in copies.values()),
            }

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.times.append(time.perf_counter() - self.start)
            self.cpu.append(time.process_time() - self.cpu_start)

    timer = StepTimer()
    lora = kind.startswith("lora")
    module = CoherenceTuning(
        model=model_dir,
        boosting=Boosting(k=args.k, alpha=args.alpha),
        loss=LossOptions(last_m=args.last_m),
        max_new_tokens=args.new,
        export=ExportOptions(enabled=False),
        validation=ValidationOptions(log_samples_every_n_steps=0),
        lora=LoraOptions(rank=args.lora_rank if lora else 0),
        # the plain LoRA run keeps nothing but the student: the live teacher, no guard
        **(
            {"teacher": TeacherOptions(kind="live"), "guard": GuardOptions(None, None, None, None)}
            if kind == "lora-plain"
            else {}
        ),
    )
    text = " ".join(["The quick brown fox jumps over the lazy dog near the quiet river bank."] * 3)
    prompts = [f"{i}: {text}" for i in range(64)]
    validating = kind == "lora-defaults"  # the guard's reference: the initial model on held-out prompts
    strategy: Any = "auto"
    if world > 1:
        strategy = FSDP2Strategy() if kind == "fsdp2" else "ddp"
    trainer = L.Trainer(
        max_steps=args.ddp_steps + 1,
        accelerator="cpu",
        devices=world,
        strategy=strategy,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[timer],
        val_check_interval=1 if validating else None,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
    )
    data = PromptDataModule(prompts=prompts, batch_size=args.batch, val_size=args.batch if validating else 0)
    trainer.fit(module, data)
    step = statistics.median(timer.times[1:])  # the first step warms up
    cpu = statistics.median(timer.cpu[1:])
    result = {
        "step_s": step,
        "sequences_per_s": world * args.batch / step,
        "cpu_s": cpu,
        "model_states": timer.states,
        "peak_rss_bytes": _rss_kib("VmHWM") * 1024,
        "peak_rss_built_bytes": timer.built_peak,
    }
    Path(f"{out_file}.rank{trainer.global_rank}").write_text(json.dumps(result))


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def memory_worker(model_dir: str, job: str, out_file: str, args: argparse.Namespace) -> None:
    """Peak memory of one job above the memory before it (model loaded, batch built). On CUDA after a
    warm-up run (the caching allocator's counters are exact either way); on CPU its first run, because
    memory that malloc keeps after a warm-up would hide the step's own allocations from the RSS."""
    import torch

    _, jobs = _steps(model_dir, args)
    if args.device == "cuda":
        jobs[job]()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        jobs[job]()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        import gc

        gc.collect()
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        before = _rss_kib("VmRSS")
        jobs[job]()
        peak = (_rss_kib("VmHWM") - before) * 1024
    Path(out_file).write_text(json.dumps({"peak_bytes": peak}))


def memory_peaks(model_dir: str, args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    peaks = {}
    for job in ("plain", "last", "all"):
        out = tmp / f"mem-{job}.json"
        cmd = [sys.executable, __file__, "--memory-worker", model_dir, job, str(out), *_passthrough(args)]
        proc = subprocess.run(
            cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise RuntimeError(f"memory worker failed:\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
        peaks[job] = json.loads(out.read_text())["peak_bytes"]
    return peaks


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_workers(
    model_dir: Path,
    world: int,
    args: argparse.Namespace,
    tmp: Path,
    independent: bool = False,
    kind: str = "ddp",
) -> dict[str, Any]:
    """``world`` processes: one Lightning job (``kind``: ``KINDS``), or (``independent``) that many separate
    one-process jobs at once, which share the machine exactly as DDP does but never communicate (the
    machine's own ceiling). The busiest process's figures, and every process's (``ranks``)."""
    tag = f"{'indep' if independent else kind}{world}"
    port = str(_free_port())
    procs = []
    for rank in range(world):
        out = tmp / (f"{tag}-{rank}.json" if independent else f"{tag}.json")
        # buffers from 64 KiB up mapped and unmapped with their tensors (benchmarks/memory.py): the peak RSS
        # follows what is alive, not what malloc's arenas kept of freed gradients and all-gather buffers
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(ROOT),
            "MALLOC_MMAP_THRESHOLD_": "65536",
        }
        if world > 1 and not independent:
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE=str(world), NODE_RANK="0")
            env["LOCAL_RANK"] = str(rank)
        cmd = [sys.executable, __file__, "--worker", str(model_dir), str(out), f"--worker-kind={kind}"]
        cmd += _passthrough(args)
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    for proc in procs:
        log, _ = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"worker failed:\n{log.decode()[-4000:]}")
    if independent:
        runs = [json.loads(Path(f"{tmp / f'{tag}-{r}.json'}.rank0").read_text()) for r in range(world)]
        return {
            "sequences_per_s": sum(r["sequences_per_s"] for r in runs),
            "step_s": max(r["step_s"] for r in runs),
            "cpu_s": max(r["cpu_s"] for r in runs),
        }
    ranks = [json.loads(Path(f"{tmp / f'{tag}.json'}.rank{r}").read_text()) for r in range(world)]
    return {**ranks[0], "cpu_s": max(r["cpu_s"] for r in ranks), "ranks": ranks}


def _most_states(run: dict[str, Any]) -> int:
    """The most model-state bytes any process of a run held."""
    return max(sum(r["model_states"].values()) for r in run["ranks"])


def _passthrough(args: argparse.Namespace) -> list[str]:
    return [
        f"--batch={args.batch}",
        f"--prompt={args.prompt}",
        f"--new={args.new}",
        f"--k={args.k}",
        f"--alpha={args.alpha}",
        f"--last-m={args.last_m}",
        f"--ddp-steps={args.ddp_steps}",
        f"--device={args.device}",
        f"--threads={args.threads}",
        f"--teacher={args.teacher}",
        f"--lora-rank={args.lora_rank}",
        f"--rollout-cache={args.rollout_cache}",
        *(["--rollout-compile"] if args.rollout_compile else []),
    ]


def _model_arg(value: str) -> str:
    if value in ("gpt2-random", *ZOO) or (Path(value) / "config.json").is_file():
        return value
    raise argparse.ArgumentTypeError(
        f"unknown model {value!r}: gpt2-random, smollm2, gemma or a model directory"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=4, help="sequences per step (per process for DDP)")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens (step ratios)")
    parser.add_argument("--new", type=int, default=32, help="sampled tokens per sequence")
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--alpha", type=float, default=-0.05)
    parser.add_argument("--last-m", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="torch threads for the step ratios")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ddp-steps", type=int, default=3, help="timed steps per DDP configuration")
    parser.add_argument("--skip-ddp", action="store_true")
    parser.add_argument("--skip-steps", action="store_true")
    parser.add_argument("--skip-ceiling", action="store_true", help="skip the 2-independent-runs ceiling")
    parser.add_argument(
        "--model",
        default="gpt2-random",
        type=_model_arg,
        help="gpt2-random, smollm2, gemma or a model directory",
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument(
        "--teacher", default="live", choices=["live", "frozen"], help="teacher of the tuning step"
    )
    parser.add_argument(
        "--rollout-cache",
        default="dynamic",
        choices=["dynamic", "static", "auto"],
        help="KV cache of the sampling (cblight.tune.rollouts.RolloutOptions)",
    )
    parser.add_argument(
        "--rollout-compile", action="store_true", help="torch.compile the decode step (static cache)"
    )
    parser.add_argument(
        "--strategy",
        nargs="+",
        default=["ddp"],
        choices=["ddp", "fsdp2"],
        help="the 2-process strategies: ddp (part 2, against one process), fsdp2; both: part 3 compares them",
    )
    parser.add_argument(
        "--lora-rank", type=int, default=0, help="part 4: LoRA of this rank, defaults against plain (0: skip)"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the figures to this JSON file")
    parser.add_argument("--worker-kind", default="ddp", choices=KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--worker", nargs=2, metavar=("MODEL_DIR", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument(
        "--memory-worker", nargs=3, metavar=("MODEL_DIR", "JOB", "OUT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], args.worker[1], args)
        return
    if args.memory_worker:
        memory_worker(*args.memory_worker, args)
        return

    print(f"load average before: {os.getloadavg()}")
    results: dict[str, Any] = {"command": sys.argv, "settings": vars(args), "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if args.model in ZOO:
            model_dir = ZOO[args.model]  # load_causal_lm resolves offline names
        elif args.model == "gpt2-random":
            model_dir = str(build_model(tmp / "gpt2-small-random"))
        else:
            model_dir = args.model
        name = {"gpt2-random": "GPT2Config() random", **ZOO}.get(args.model, args.model)
        shape = (
            f"{name}, batch {args.batch}, prompt {args.prompt} + {args.new} sampled, k {args.k}, "
            f"{args.teacher} teacher, {args.device}"
        )
        if not args.skip_steps:
            r = step_ratios(model_dir, args)
            decoding = f"rollouts: cache {args.rollout_cache}{', compiled' if args.rollout_compile else ''}"
            print(
                f"\n[step] {shape}, {args.threads} thread(s), {decoding}, median of {args.repeats}, interleaved"
            )
            for clock, title in (("wall", "wall time"), ("cpu", "CPU time of this process")):
                f = r[clock]
                print(f"  {title}:")
                print(f"    plain causal-LM step (fwd+bwd):       {f['plain_s']:8.2f} s")
                print(
                    f"    sampling alone ({args.new} tokens):          {f['sample_only_s']:8.2f} s"
                    f"  -> {f['ratio_sample']:.2f}x plain"
                )
                for job, label in (("last", f"KL on last {args.last_m}"), ("all", "KL on all positions")):
                    ratio = f["ratio_last_m" if job == "last" else "ratio_all"]
                    parts = " + ".join(f"{part} {f[f'{job}_{part}_x']:.2f}x" for part in PARTS)
                    print(
                        f"    tuning step, {label:20s} {f[f'{job}_s']:8.2f} s  -> {ratio:.2f}x plain"
                        f" (goal: <= 3x) = {parts}"
                    )
            results["steps"] = r
        if not args.skip_memory:
            m = memory_peaks(model_dir, args, tmp)
            what = "CUDA max allocated" if args.device == "cuda" else "peak RSS"
            print(f"\n[memory] {shape}: {what} above the memory before the step, fresh process per job")
            print(f"  plain causal-LM step:              {m['plain'] / 2**20:8.1f} MiB")
            for job, label in (
                ("last", f"tuning step, KL on last {args.last_m}: "),
                ("all", "tuning step, KL on all:         "),
            ):
                ratio = m[job] / max(m["plain"], 1)
                print(f"  {label}  {m[job] / 2**20:8.1f} MiB  -> {ratio:.2f}x plain (goal: <= 1.5x)")
            results["peak_bytes"] = m
        two = None
        if not args.skip_ddp and "ddp" in args.strategy:
            one = run_workers(model_dir, 1, args, tmp)
            two = run_workers(model_dir, 2, args, tmp)
            pair = None if args.skip_ceiling else run_workers(model_dir, 2, args, tmp, independent=True)
            ratio = two["sequences_per_s"] / one["sequences_per_s"]
            print(
                f"\n[ddp] Lightning training step (KL on last {args.last_m}, AdamW), {args.batch} sequences/process"
            )
            print(
                f"  1 process  x 1 thread: {one['step_s']:.2f} s/step, {one['sequences_per_s']:.3f} sequences/s"
            )
            print(
                f"  2 processes x 1 thread: {two['step_s']:.2f} s/step, {two['sequences_per_s']:.3f} sequences/s"
            )
            print(f"  throughput ratio: {ratio:.2f}x (floor: >= 1.6x)")
            # With two free cores each process has one to itself and the wall time follows its CPU time;
            # when other jobs share the cores, this CPU-time ratio shows what DDP itself costs.
            cpu_ratio = 2 * one["cpu_s"] / two["cpu_s"]
            print(
                f"  CPU time per step: {one['cpu_s']:.2f} s (1 process), {two['cpu_s']:.2f} s (busiest of 2)"
            )
            print(f"  throughput ratio if each process had its own core: {cpu_ratio:.2f}x")
            if pair is not None:
                ceiling = pair["sequences_per_s"] / one["sequences_per_s"]
                print(
                    f"  machine ceiling: 2 independent 1-process runs at once give {ceiling:.2f}x"
                    f" (no communication); DDP reaches {ratio / ceiling:.0%} of it"
                )
            results["ddp"] = {"one": one, "two": two, "ceiling": pair}
        if not args.skip_ddp and "fsdp2" in args.strategy:
            sharded = run_workers(model_dir, 2, args, tmp, kind="fsdp2")
            results["fsdp2"] = sharded
            print(
                f"\n[sharding] {name}, batch {args.batch}/process, {WORKER_PROMPT} + {args.new} sampled, "
                f"k {args.k}, frozen teacher, AdamW, 2 processes x 1 thread, per process (the busiest)"
            )
            rows = [("FSDP2", sharded)] if two is None else [("DDP", two), ("FSDP2", sharded)]
            for label, run in rows:
                states = max((r["model_states"] for r in run["ranks"]), key=lambda s: sum(s.values()))
                parts = ", ".join(f"{k} {v / 2**20:.0f}" for k, v in states.items())
                peak = max(r["peak_rss_bytes"] for r in run["ranks"])
                built = max(r["peak_rss_built_bytes"] for r in run["ranks"])
                print(
                    f"  {label:5s}: model states {sum(states.values()) / 2**20:8.1f} MiB ({parts}), "
                    f"peak RSS {peak / 2**20:8.1f} MiB ({built / 2**20:.0f} before the first step), "
                    f"{run['step_s']:.2f} s/step"
                )
            if two is not None:
                ratio = _most_states(sharded) / _most_states(two)
                rss = max(r["peak_rss_bytes"] for r in sharded["ranks"]) / max(
                    r["peak_rss_bytes"] for r in two["ranks"]
                )
                print(
                    f"  FSDP2 / DDP: model states {ratio:.2f}x (goal: <= 0.55x), peak RSS {rss:.2f}x, "
                    f"step time {sharded['step_s'] / two['step_s']:.2f}x"
                )
                results["sharding"] = {"model_states_ratio": ratio, "peak_rss_ratio": rss}
        if args.lora_rank:
            runs = {
                kind: run_workers(model_dir, 1, args, tmp, kind=kind)
                for kind in ("lora-plain", "lora-defaults")
            }
            plain, defaults = (runs[k]["peak_rss_bytes"] for k in ("lora-plain", "lora-defaults"))
            print(
                f"\n[lora] {name}, batch {args.batch}, {WORKER_PROMPT} + {args.new} sampled, k {args.k}, "
                f"LoRA rank {args.lora_rank}, one process, peak RSS (a fresh process each)"
            )
            print(f"  plain (live teacher, no guard):             {plain / 2**20:8.1f} MiB")
            print(
                f"  defaults (frozen teacher, guard validating): {defaults / 2**20:8.1f} MiB"
                f"  -> {defaults / plain:.2f}x (goal: <= 1.1x)"
            )
            results["lora"] = {**runs, "peak_ratio": defaults / plain}
    print(f"\nload average after: {os.getloadavg()}")
    if args.json:
        from cblight.results import atomic_write_json

        atomic_write_json(Path(args.json), {**results, "load_after": os.getloadavg()})


if __name__ == "__main__":
    main()
