"""Continuation scoring: cblight's Scorer vs lm-evaluation-harness's Hugging Face backend (HFLM).

Same model (a random GPT-2-small-shaped model, 124M parameters), same requests, same CPU threads, measured
in one run. The requests are the multiple-choice workload of the paper (Table 4): every choice after the
full context and after the premise-free context, for three question shapes (HellaSwag-like: long context,
four long endings; COPA-like: short context, two short choices; BoolQ-like: a passage and one-token answers).
lm-eval runs in its own environment (created on first use: ``python -m venv`` + ``pip install lm-eval``),
through ``benchmarks/lmeval_runner.py``. The script also checks that both give the same log-likelihoods.

    python benchmarks/bench_scoring_vs_lmeval.py [--questions 24] [--batch-size 16] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks.common import best_of, gpt2_small_dir, sentence  # noqa: E402


def workload(n_questions: int, seed: int = 0) -> list[tuple[str, str, list[str]]]:
    """(full context, premise-free context, choices with leading space) for three question shapes."""
    rng = random.Random(seed)
    out = []
    for i in range(n_questions):
        shape = i % 3
        if shape == 0:  # HellaSwag-like
            ctx = sentence(rng, 30) + " " + sentence(rng, 12)[:-1]
            free = " " + ctx.rsplit(".", 1)[-1].strip()
            choices = [" " + sentence(rng, 15) for _ in range(4)]
        elif shape == 1:  # COPA-like
            ctx = sentence(rng, 9)[:-1] + " because"
            free = " because"
            choices = [" " + sentence(rng, 6).lower() for _ in range(2)]
        else:  # BoolQ-like
            question = sentence(rng, 8)[:-1] + "?"
            ctx = f"Title: {sentence(rng, 100)}\n Question: {question}?\n The answer is:"
            free = f" Question: {question}?\n The answer is:"
            choices = [" no", " yes"]
        out.append((ctx, free, choices))
    return out


def ensure_lmeval_python(path: str | None) -> str:
    if path:
        return path
    env = HERE / ".venv-lmeval"
    python = env / "bin" / "python"
    if not python.exists():
        print(f"creating {env} with lm-eval (one time)...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "torch==2.13.0"], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "lm-eval", "transformers", "accelerate"], check=True
        )
    return str(python)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--questions", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--lmeval-python", default=None, help="python of an environment with lm-eval installed"
    )
    parser.add_argument("--model-dir", default=str(Path(tempfile.gettempdir()) / "cblight-bench-gpt2-small"))
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from cblight.models import load_causal_lm, load_tokenizer
    from cblight.scoring import Scorer

    model_dir = gpt2_small_dir(args.model_dir)
    questions = workload(args.questions)
    groups = [(ctx, ch) for ctx, _, ch in questions] + [(free, ch) for _, free, ch in questions]
    pairs = [(ctx, c) for ctx, ch in groups for c in ch]
    n_tokens = sum(len(load_tokenizer(str(model_dir))(c + x)["input_ids"]) for c, x in pairs)
    print(f"{len(questions)} questions, {len(pairs)} (context, continuation) requests, {n_tokens} tokens")

    python = ensure_lmeval_python(args.lmeval_python)
    with tempfile.TemporaryDirectory() as tmp:
        req, out = Path(tmp) / "req.json", Path(tmp) / "out.json"
        req.write_text(json.dumps(pairs))
        cmd = [python, str(HERE / "lmeval_runner.py"), str(model_dir), str(req), str(out)]
        cmd += [str(args.batch_size), str(args.repeats), str(args.threads)]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        lmeval = json.loads(out.read_text())

    model = load_causal_lm(str(model_dir))
    tok = load_tokenizer(str(model_dir))
    results = {}
    for share in (True, False):
        scorer = Scorer(model, tok, batch_size=args.batch_size, share_context=share)
        seconds, scores = best_of(lambda s=scorer: s.score_text(groups), args.repeats)
        flat = [s.log_prob for group in scores for s in group]
        diff = max(abs(a - b) for a, b in zip(flat, lmeval["loglikelihoods"]))
        results[share] = (seconds, diff)

    t_lm = lmeval["seconds"]
    print(f"lm-eval HFLM (batch {args.batch_size}):            {t_lm:8.2f} s")
    for share, label in ((False, "rows, as lm-eval "), (True, "shared context   ")):
        seconds, diff = results[share]
        print(
            f"cblight Scorer ({label}):          {seconds:8.2f} s   speed-up vs lm-eval {t_lm / seconds:5.2f}x"
            f"   max |log-lik diff| {diff:.2e}"
        )
    print(f"(threads={args.threads}, best of {args.repeats}, {time.strftime('%Y-%m-%d')})")


if __name__ == "__main__":
    main()
