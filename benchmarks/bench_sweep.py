"""The whole alpha sweep costs (almost) nothing beyond one alpha (DESIGN.md §5).

Multiple choice: scoring every choice after the full and the premise-free context (one pass each), then
accuracy at ONE alpha vs the whole 701-value grid (2 down to -5 by 0.01) from the same cached numbers.
Next-token (LAMBADA): one full pass plus one k-token pass per k, then the target's boosted rank at one alpha
vs an 11-value alpha grid per k. Both on a random GPT-2-small-shaped model on CPU; model calls are counted
with a forward hook to show the sweep adds none.

    python benchmarks/bench_sweep.py [--questions 60] [--passages 24] [--threads 2]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks.bench_scoring_vs_lmeval import workload  # noqa: E402
from benchmarks.common import gpt2_small_dir, sentence  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--questions", type=int, default=60)
    parser.add_argument("--passages", type=int, default=24)
    parser.add_argument("--ks", type=int, nargs="+", default=[4, 8, 12])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model-dir", default=str(Path(tempfile.gettempdir()) / "cblight-bench-gpt2-small"))
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from cblight.boosting import AlphaGrid, choice_accuracy_curve, next_token_alpha_sweep
    from cblight.models import load_causal_lm, load_tokenizer
    from cblight.scoring import Scorer

    model_dir = gpt2_small_dir(args.model_dir)
    model, tok = load_causal_lm(str(model_dir)), load_tokenizer(str(model_dir))
    calls = [0]
    model.register_forward_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
    scorer = Scorer(model, tok, batch_size=16)

    # -- multiple choice -------------------------------------------------------------------------------
    questions = workload(args.questions, seed=1)
    rng = random.Random(0)
    labels = torch.tensor([rng.randrange(len(ch)) for _, _, ch in questions])

    def mc(alphas: list[float]) -> torch.Tensor:
        groups = [(c, ch) for c, _, ch in questions] + [(f, ch) for _, f, ch in questions]
        scores = scorer.score_text(groups)
        width = max(len(g) for g in scores)
        table = torch.full((len(scores), width), -float("inf"), dtype=torch.float64)
        for i, g in enumerate(scores):
            table[i, : len(g)] = torch.tensor([s.log_prob for s in g], dtype=torch.float64)
        n = len(questions)
        return choice_accuracy_curve(
            table[:n], table[n:].nan_to_num(neginf=0.0), labels, torch.tensor(alphas)
        )

    grid = AlphaGrid(2.0, -5.0, 0.01).values()
    mc([0.0])  # warm-up
    timings = {}
    for name, alphas in (("one alpha", [-1.0]), ("701 alphas", grid)):
        calls[0] = 0
        start = time.perf_counter()
        curve = mc(alphas)
        timings[name] = (time.perf_counter() - start, calls[0])
    assert curve.numel() == len(grid)
    (t1, c1), (tg, cg) = timings["one alpha"], timings["701 alphas"]
    print(f"multiple choice, {len(questions)} questions:")
    print(f"  one alpha   {t1:7.2f} s  {c1} model calls")
    print(f"  701 alphas  {tg:7.2f} s  {cg} model calls   ratio {tg / t1:.3f}x (target <= 1.05x)")

    # -- next token --------------------------------------------------------------------------------------
    enc = scorer.encoder
    passages = [" ".join(sentence(rng, 14) for _ in range(4)) for _ in range(args.passages)]
    ids = [enc.context(p) for p in passages]
    contexts, targets = [i[:-1] for i in ids], torch.tensor([i[-1] for i in ids])

    def nt(alphas: list[float]) -> int:
        full = scorer.next_token_log_probs(contexts)
        hits = 0
        for k in args.ks:
            short = scorer.last_k_log_probs(contexts, k, full=full)
            hits += int(next_token_alpha_sweep(full, short, targets, torch.tensor(alphas))["correct"].sum())
        return hits

    nt([0.0])
    lam = {}
    for name, alphas in (("one alpha", [-0.5]), ("11 alphas", AlphaGrid(0.0, -1.0, 0.1).values())):
        calls[0] = 0
        start = time.perf_counter()
        nt(alphas)
        lam[name] = (time.perf_counter() - start, calls[0])
    (t1, c1), (tg, cg) = lam["one alpha"], lam["11 alphas"]
    print(f"next token, {len(passages)} passages, k in {args.ks}:")
    print(f"  one alpha   {t1:7.2f} s  {c1} model calls")
    print(f"  11 alphas   {tg:7.2f} s  {cg} model calls   ratio {tg / t1:.3f}x (target <= 1.05x)")


if __name__ == "__main__":
    main()
