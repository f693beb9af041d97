"""Continuation scoring: cblight's Scorer vs lm-evaluation-harness's Hugging Face backend (HFLM).

Same model (``--model``: default a random GPT-2-small-shaped model, 124M parameters; ``smollm2`` /
``gemma`` for the offline zoo's real models), same requests, same CPU threads, measured in one run. The
requests are the multiple-choice workload of the paper (Table 4): every choice after the full context and
after the premise-free context, for three question shapes (HellaSwag-like: long context, four long endings;
COPA-like: short context, two short choices; BoolQ-like: a passage and one-token answers). lm-eval runs in
a process of its own through ``benchmarks/lmeval_runner.py``, with this Python (``pip install
'cblight[lmeval]'``) or ``--lmeval-python`` of another environment. The script also checks that both give
the same log-likelihoods, and measures each side's peak memory.

    python benchmarks/bench_scoring_vs_lmeval.py [--questions 24] [--batch-size 16] [--threads 2]
    python benchmarks/bench_scoring_vs_lmeval.py --model gemma --questions 24 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks import common, memory  # noqa: E402


def workload(n_questions: int, seed: int = 0) -> list[tuple[str, str, list[str]]]:
    """(full context, premise-free context, choices with leading space) for three question shapes."""
    rng = random.Random(seed)
    out = []
    for i in range(n_questions):
        shape = i % 3
        if shape == 0:  # HellaSwag-like
            ctx = common.sentence(rng, 30) + " " + common.sentence(rng, 12)[:-1]
            free = " " + ctx.rsplit(".", 1)[-1].strip()
            choices = [" " + common.sentence(rng, 15) for _ in range(4)]
        elif shape == 1:  # COPA-like
            ctx = common.sentence(rng, 9)[:-1] + " because"
            free = " because"
            choices = [" " + common.sentence(rng, 6).lower() for _ in range(2)]
        else:  # BoolQ-like
            question = common.sentence(rng, 8)[:-1] + "?"
            ctx = f"Title: {common.sentence(rng, 100)}\n Question: {question}?\n The answer is:"
            free = f" Question: {question}?\n The answer is:"
            choices = [" no", " yes"]
        out.append((ctx, free, choices))
    return out


def lmeval_python(path: str | None) -> str:
    """The Python that runs lm-eval: ``--lmeval-python``, else this one, which must have lm-eval."""
    python = path or sys.executable
    probe = subprocess.run([python, "-c", "import lm_eval"], capture_output=True, text=True)
    if probe.returncode != 0:
        raise common.BenchError(
            f"lm-eval is not importable by {python}: pip install 'cblight[lmeval]', or pass --lmeval-python "
            "of an environment that has it"
        )
    return python


def run_lmeval(args: argparse.Namespace, model_dir: str, pairs: list[tuple[str, str]], peak: bool) -> dict:
    """lm-eval's timings and log-likelihoods, or (``peak``) its peak memory, from a process of its own."""
    python = lmeval_python(args.lmeval_python)
    with tempfile.TemporaryDirectory() as tmp:
        req, out = Path(tmp) / "req.json", Path(tmp) / "out.json"
        req.write_text(json.dumps(pairs))
        cmd = [python, str(HERE / "lmeval_runner.py"), "--model-dir", model_dir, "--requests", str(req)]
        cmd += ["--out", str(out), "--batch-size", str(args.batch_size), "--repeats", str(args.repeats)]
        cmd += ["--threads", str(args.threads), "--device", args.device]
        cmd += ["--memory-only"] if peak else []
        env = memory.child_env() if peak else None
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"lm-eval run failed:\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
        return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    common.add_common_args(parser)
    parser.add_argument("--questions", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="best of this many timings")
    parser.add_argument(
        "--lmeval-python", default=None, help="python of an environment with lm-eval installed"
    )
    args = parser.parse_args()
    if min(args.questions, args.batch_size, args.repeats) < 1:
        parser.error("--questions, --batch-size and --repeats must be at least 1")
    common.setup(args)
    from cblight.models import resolve_model_path
    from cblight.scoring import Scorer

    model, tok = common.load_model(args)
    questions = workload(args.questions)
    groups = [(ctx, ch) for ctx, _, ch in questions] + [(free, ch) for _, free, ch in questions]
    pairs = [(ctx, c) for ctx, ch in groups for c in ch]
    scorers = {
        "shared": Scorer(model, tok, batch_size=args.batch_size, share_context=True),
        "rows": Scorer(model, tok, batch_size=args.batch_size, share_context=False),
    }
    jobs = {name: (lambda s=s: s.score_text(groups)) for name, s in scorers.items()}
    if args.memory_job:
        memory.child(jobs, args)
        return

    host, facts = common.announce(args, model)
    n_tokens = sum(len(tok(c + x)["input_ids"]) for c, x in pairs)
    print(f"{len(questions)} questions, {len(pairs)} (context, continuation) requests, {n_tokens} tokens")

    model_dir = resolve_model_path(common.model_source(args.model))
    lmeval = run_lmeval(args, model_dir, pairs, peak=False)
    times, scores = common.interleaved(jobs, args.repeats, args.device)  # after a warm-up run, as lm-eval
    best = {name: min(ts) for name, ts in times.items()}
    diffs = {}
    for name, result in scores.items():
        flat = [s.log_prob for group in result for s in group]
        diffs[name] = max(abs(a - b) for a, b in zip(flat, lmeval["loglikelihoods"]))
    t_lm = lmeval["seconds"]
    print(f"lm-eval {lmeval['lm_eval']} HFLM (batch {args.batch_size}):      {t_lm:8.2f} s")
    ratios = {}
    for name, label in (("rows", "rows, as lm-eval "), ("shared", "shared context   ")):
        ratios[f"speedup_{name}_vs_lmeval"] = t_lm / best[name]
        print(
            f"cblight Scorer ({label}):          {best[name]:8.2f} s   speed-up vs lm-eval "
            f"{t_lm / best[name]:5.2f}x   max |log-lik diff| {diffs[name]:.2e}"
        )
    print(f"(best of {args.repeats} after a warm-up run; lm-eval timed in its own process before ours)")
    peak: dict[str, int] = {}
    if not args.skip_memory:
        print(f"peak memory ({memory.note(args.device)}):")
        peak = {"lmeval": run_lmeval(args, model_dir, pairs, peak=True)["peak_bytes"]}
        print(f"  peak memory of lmeval: {peak['lmeval'] / 2**20:.1f} MiB", flush=True)
        peak.update(memory.peaks(jobs, list(jobs), args))
        for name in ("rows", "shared"):
            print(memory.line("one scoring pass", peak, name, "lmeval"))
            ratios[f"peak_memory_lmeval_vs_{name}"] = memory.ratio(peak, "lmeval", name)
    payload = common.record(
        "bench_scoring_vs_lmeval",
        args,
        host,
        facts,
        settings={
            "questions": args.questions,
            "requests": len(pairs),
            "tokens": n_tokens,
            "batch_size": args.batch_size,
            "repeats": args.repeats,
            "statistic": "best",
            "lm_eval": lmeval["lm_eval"],
        },
        seconds={"lmeval": t_lm, **best},
        peak_bytes=peak or None,
        ratios=ratios,
        agreement={f"max_abs_loglik_diff_{name}": d for name, d in diffs.items()},
    )
    common.finish(args, payload)


if __name__ == "__main__":
    common.run_main(main)
