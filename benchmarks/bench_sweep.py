"""The whole alpha sweep costs (almost) nothing beyond one alpha (docs/design.md, "Speed floors").

Multiple choice: scoring every choice after the full and the premise-free context (one pass each), then
accuracy at ONE alpha vs the whole 701-value grid (2 down to -5 by 0.01) from the same cached numbers.
Next-token (LAMBADA): one full pass plus one k-token pass per k, then the target's boosted rank at one alpha
vs an 11-value alpha grid per k. On ``--model`` (default: a random GPT-2-small-shaped model; ``smollm2`` /
``gemma`` for the offline zoo's real models); model calls are counted with a forward hook to show the
sweep adds none; each side's peak memory is measured too.

    python benchmarks/bench_sweep.py [--questions 60] [--passages 24] [--threads 2]
    python benchmarks/bench_sweep.py --model gemma
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks import common, memory  # noqa: E402
from benchmarks.bench_scoring_vs_lmeval import workload  # noqa: E402


def build_jobs(args: argparse.Namespace, model, tok):
    """The four sides (multiple choice / next token, one alpha / the grid) and the model-call counter."""
    import torch

    from cblight.boosting import AlphaGrid, choice_accuracy_curve, next_token_alpha_sweep
    from cblight.scoring import Scorer

    calls = [0]
    model.register_forward_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
    scorer = Scorer(model, tok, batch_size=16)

    questions = workload(args.questions, seed=1)
    rng = random.Random(0)
    labels = torch.tensor([rng.randrange(len(ch)) for _, _, ch in questions])
    groups = [(c, ch) for c, _, ch in questions] + [(f, ch) for _, f, ch in questions]

    def mc(alphas: list[float]) -> torch.Tensor:
        scores = scorer.score_text(groups)
        width = max(len(g) for g in scores)
        table = torch.full((len(scores), width), -float("inf"), dtype=torch.float64)
        for i, g in enumerate(scores):
            table[i, : len(g)] = torch.tensor([s.log_prob for s in g], dtype=torch.float64)
        n = len(questions)
        return choice_accuracy_curve(
            table[:n], table[n:].nan_to_num(neginf=0.0), labels, torch.tensor(alphas)
        )

    enc = scorer.encoder
    passages = [" ".join(common.sentence(rng, 14) for _ in range(4)) for _ in range(args.passages)]
    ids = [enc.context(p) for p in passages]
    contexts, targets = [i[:-1] for i in ids], torch.tensor([i[-1] for i in ids])

    def nt(alphas: list[float]) -> int:
        full = scorer.next_token_log_probs(contexts)
        hits = 0
        for k in args.ks:
            short = scorer.last_k_log_probs(contexts, k, full=full)
            sweep = next_token_alpha_sweep(full.cpu(), short.cpu(), targets, torch.tensor(alphas))
            hits += int(sweep["correct"].sum())
        return hits

    grid, nt_grid = AlphaGrid(2.0, -5.0, 0.01).values(), AlphaGrid(0.0, -1.0, 0.1).values()
    jobs = {
        "mc_one": lambda: mc([-1.0]),
        "mc_grid": lambda: mc(grid),
        "nt_one": lambda: nt([-0.5]),
        "nt_grid": lambda: nt(nt_grid),
    }
    return jobs, calls, len(grid), len(nt_grid), len(passages)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    common.add_common_args(parser)
    parser.add_argument("--questions", type=int, default=60)
    parser.add_argument("--passages", type=int, default=24)
    parser.add_argument("--ks", type=int, nargs="+", default=[4, 8, 12])
    parser.add_argument("--repeats", type=int, default=1, help="median of this many interleaved timings")
    args = parser.parse_args()
    if min(args.questions, args.passages, args.repeats, *args.ks) < 1:
        parser.error("--questions, --passages, --repeats and --ks must be at least 1")
    common.setup(args)
    model, tok = common.load_model(args)
    jobs, calls, n_grid, n_nt_grid, n_passages = build_jobs(args, model, tok)
    if args.memory_job:
        memory.child(jobs, args)
        return

    host, facts = common.announce(args, model)
    counted = {}
    for name, fn in jobs.items():  # warm-up, and the model calls of each side
        calls[0] = 0
        common.timed(fn, args.device)
        counted[name] = calls[0]
    times, out = common.interleaved(jobs, args.repeats, args.device, warmup=False)
    assert out["mc_grid"].numel() == n_grid
    med = {name: common.median(ts) for name, ts in times.items()}
    ratios = {
        "mc_grid_vs_one": med["mc_grid"] / med["mc_one"],
        "nt_grid_vs_one": med["nt_grid"] / med["nt_one"],
    }
    print(f"multiple choice, {args.questions} questions:")
    print(f"  one alpha   {med['mc_one']:7.2f} s  {counted['mc_one']} model calls")
    print(
        f"  {n_grid} alphas  {med['mc_grid']:7.2f} s  {counted['mc_grid']} model calls   "
        f"ratio {ratios['mc_grid_vs_one']:.3f}x (target <= 1.05x)"
    )
    print(f"next token, {n_passages} passages, k in {args.ks}:")
    print(f"  one alpha   {med['nt_one']:7.2f} s  {counted['nt_one']} model calls")
    print(
        f"  {n_nt_grid} alphas   {med['nt_grid']:7.2f} s  {counted['nt_grid']} model calls   "
        f"ratio {ratios['nt_grid_vs_one']:.3f}x (target <= 1.05x)"
    )
    peak: dict[str, int] = {}
    if not args.skip_memory:
        print(f"peak memory ({memory.note(args.device)}):")
        peak = memory.peaks(jobs, list(jobs), args)
        print(memory.line("multiple choice", peak, "mc_one", "mc_grid"))
        print(memory.line("next token", peak, "nt_one", "nt_grid"))
        ratios["peak_memory_mc_grid_vs_one"] = memory.ratio(peak, "mc_grid", "mc_one")
        ratios["peak_memory_nt_grid_vs_one"] = memory.ratio(peak, "nt_grid", "nt_one")
    payload = common.record(
        "bench_sweep",
        args,
        host,
        facts,
        settings={
            "questions": args.questions,
            "passages": n_passages,
            "ks": args.ks,
            "mc_alphas": n_grid,
            "nt_alphas": n_nt_grid,
            "repeats": args.repeats,
            "statistic": "median",
        },
        seconds=med,
        model_calls=counted,
        peak_bytes=peak or None,
        ratios=ratios,
    )
    common.finish(args, payload)


if __name__ == "__main__":
    common.run_main(main)
