"""Boosting LAMBADA without labelled selection data (docs/adaptive.md): every label-free rule of
``cblight.adaptive`` beside the base model, the validation-chosen (k*, alpha*) and the oracle (k, alpha).

Each passage's last token is predicted (paper §3, Table 1) from ``f_max`` and the short experts ``f_k``:
``k`` in the grid (1..20, for k* and the oracle) and the ``k`` of the input's last sentence and last clause
(``cblight.adaptive.unit_k``). For every expert the script keeps, per passage, whether the target wins at
every alpha of the grid (0..-1 by 0.1), each per-token rule's alpha and whether the target wins under it
(argmax over the whole vocabulary), and a candidate set (the 64 top tokens of ``f_max`` and of
``f_max - f_k``, and the target) whose scores give the argmax at any alpha in [-1, 0]: for the transductive
``jsd_mean`` and ``jsdist_mean`` (one alpha for the split: the mean of the passages' alphas, rounded to
0.01) and for the per-passage rules scored from cached statistics (``jsdist`` from ``jsd``'s alpha,
``cocoa`` from ``STATS``). The table checks the candidate-set accuracy against the exact one on the whole
grid. Scores are cached per chunk under ``--out`` (a rerun resumes; a larger ``--limit`` adds passages),
then one table is printed: accuracy with its standard error, and each row's paired difference from alpha*
with the standard error of that difference.

    python benchmarks/adaptive_next_token.py --model smollm2 --test lambada_test.jsonl \\
        --dev lambada_development_plain_text.txt --limit 200 --out /tmp/adaptive-lambada

Passages are a fixed-seed sample of each file (the first ``--limit`` of one shuffle), so a larger limit
extends the same sample.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import BenchError, add_common_args, load_model, run_main, setup, write_json  # noqa: E402

UNITS = ("sentence", "clause")
CANDIDATES = 64  # per ranking; the candidate-set argmax is checked against the exact one on the grid


def passages(path: Path, split: str, limit: int, seed: int) -> list[tuple[int, str]]:
    """``(line index, text)`` of the first ``limit`` passages of one seeded shuffle, preprocessed as the
    LAMBADA task does (``cblight.data.tasks.lambada``)."""
    from cblight.data.tasks.lambada import preprocess_test, read_passages

    if not path.is_file():
        raise BenchError(f"--{split}: no file {path}")
    records = read_passages(path)
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    out = []
    for i in order[:limit]:
        text = records[i].fields["text"]
        out.append((i, preprocess_test(text.strip()) if split == "test" else text))
    return out


def score_chunk(
    model: Any, tok: Any, items: list[tuple[int, str]], ks: list[int], args: argparse.Namespace
) -> dict:
    import torch

    from cblight.adaptive import token_alphas, unit_k
    from cblight.boosting import boosted_log_probs, next_token_alpha_sweep, short_context_ids
    from cblight.scoring import Encoder, Scorer

    scorer = Scorer(model, tok, batch_size=args.batch_size)
    enc = Encoder(tok)
    prefix = enc.prefix
    contexts, targets, units = [], [], {u: [] for u in UNITS}
    for _, text in items:
        ids = enc.context(text)
        contexts.append(ids[:-1])
        targets.append(ids[-1])
        pieces = [tok.decode([t]) for t in ids[len(prefix) : -1]]
        for u in UNITS:
            units[u].append(unit_k(pieces, u))
    tgt = torch.tensor(targets)
    alphas = torch.tensor(args.alphas)
    full = scorer.next_token_log_probs(contexts)
    columns: list[torch.Tensor] = []
    for k in ks:
        columns.append(scorer.last_k_log_probs(contexts, k, full=full))
    for u in UNITS:
        shorts = [short_context_ids(c, k, prefix) for c, k in zip(contexts, units[u])]
        todo = [i for i, (s, c) in enumerate(zip(shorts, contexts)) if len(s) < len(c)]
        col = full.clone()
        if todo:
            col[torch.tensor(todo)] = scorer.next_token_log_probs([shorts[i] for i in todo])
        columns.append(col)
    out: dict[str, Any] = {
        "ids": torch.tensor([i for i, _ in items]),
        "target": tgt,
        "base_correct": full.argmax(-1) == tgt,
        "k_unit": torch.tensor([units[u] for u in UNITS]).T,
        "lengths": torch.tensor([len(c) - len(prefix) for c in contexts]),
    }
    grid, rules, cands, stats = [], {r: ([], []) for r in ("jsd",)}, [], []
    for short in columns:
        stats.append(expert_stats(full, short))
        grid.append(next_token_alpha_sweep(full, short, tgt, alphas)["correct"])
        for rule, (alpha_list, correct_list) in rules.items():
            a = token_alphas(rule, full, short, "next_token")
            alpha_list.append(a)
            correct_list.append(boosted_log_probs(full, short, a).argmax(-1) == tgt)
        ids = torch.cat(
            [full.topk(CANDIDATES, -1).indices, (full - short).topk(CANDIDATES, -1).indices, tgt[:, None]], -1
        )  # the target last: a candidate set's argmax is right when the target's score is the largest
        cands.append(torch.stack([full.gather(1, ids), short.gather(1, ids)], -1))
    out["grid_correct"] = torch.stack(grid, 1)  # [n, K + units, A]
    for rule, (alpha_list, correct_list) in rules.items():
        out[f"{rule}_alpha"] = torch.stack(alpha_list, 1)
        out[f"{rule}_correct"] = torch.stack(correct_list, 1)
    out["stats"] = torch.stack(stats, 1)  # [n, K + units, len(STATS)]
    out["candidate_scores"] = torch.stack(cands, 1)  # [n, K + units, 2M + 1, (full, short)], target last
    return out


STATS = ("renyi_half", "entropy_full", "entropy_short", "margin_full")


def expert_stats(full: Any, short: Any) -> Any:
    """Per passage, what a label-free per-token weight may read of the two predictions ``[n, len(STATS)]``
    (nats): the Rényi divergence of order 1/2 of ``f_max`` from ``f_short`` (``-2 log Σ √(p q)``), both
    entropies, and the margin between ``f_max``'s two most likely tokens (CoCoA's ingredients)."""
    import torch

    full, short = full.double(), short.double()
    renyi = -2 * torch.logsumexp((full + short) / 2, -1)
    entropy = [-(lp.exp() * lp.clamp_min(-1e30)).sum(-1) for lp in (full, short)]
    top = full.exp().topk(2, -1).values
    return torch.stack([renyi.clamp_min(0), *entropy, top[:, 0] - top[:, 1]], -1).float()


def cocoa_from_stats(stats: Any) -> Any:
    """``cblight.adaptive.cocoa_alpha`` (next-token form) from the cached ``STATS`` of one expert."""
    from cblight.adaptive import alpha_of_weight, cocoa_weight

    renyi, _, _, margin = stats.double().unbind(-1)
    return alpha_of_weight(cocoa_weight(renyi, margin))


def jsdist_from_jsd(split: dict, col: int) -> Any:
    """``cblight.adaptive.jsdist_alpha`` (next-token form) of expert ``col`` from its cached ``jsd`` alpha:
    the weight ``a = -alpha / (1 + alpha)`` is the JSD, and ``jsdist``'s weight is its square root."""
    from cblight.adaptive import alpha_of_weight

    jsd = split["jsd_alpha"][:, col].double()
    return alpha_of_weight((-jsd / (1 + jsd)).clamp_min(0).sqrt())


def scored_split(
    model: Any, tok: Any, name: str, items: list, ks: list[int], args: argparse.Namespace
) -> dict:
    """Every passage's numbers, from the chunk cache where present."""
    import torch

    grid = "" if ks == list(range(1, 21)) else "-k" + "_".join(map(str, ks))
    folder = Path(args.out) / args.model.replace("/", "_") / f"{name}{grid}"
    folder.mkdir(parents=True, exist_ok=True)
    parts = []
    for lo in range(0, len(items), args.chunk):
        path = folder / f"chunk{lo:06d}-{args.chunk}.pt"
        if path.is_file():
            parts.append(torch.load(path))
            continue
        start = time.perf_counter()
        part = score_chunk(model, tok, items[lo : lo + args.chunk], ks, args)
        tmp = path.with_suffix(".tmp")
        torch.save(part, tmp)
        tmp.replace(path)
        parts.append(part)
        print(
            f"  {name}: {lo + len(part['ids'])}/{len(items)} ({time.perf_counter() - start:.0f} s)",
            flush=True,
        )
    for p in parts:  # chunks of the first version kept (token id, full, short) in float16; ids unused
        if "candidates" in p:
            p["candidate_scores"] = p.pop("candidates")[..., 1:].float()
    return {key: torch.cat([p[key] for p in parts]) for key in parts[0]}


def candidate_correct(split: dict, col: int, alpha: Any) -> Any:
    """Whether the target wins at ``alpha`` (one value, or one per passage) among the candidate set of
    expert ``col`` (see the module docstring); ``table`` checks this against the exact whole-vocabulary
    grid."""
    scores = split["candidate_scores"][:, col].float()
    alpha = alpha.float()[:, None] if hasattr(alpha, "float") else alpha
    mixed = scores[..., 0] + alpha * scores[..., 1]
    return mixed[:, -1] >= mixed.max(-1).values


def stderr(correct: Any) -> float:
    p = float(correct.double().mean())
    return math.sqrt(p * (1 - p) / correct.numel())


def paired(a: Any, b: Any) -> tuple[float, float]:
    """Mean and standard error of the per-passage difference ``a - b`` (percentage points)."""
    d = a.double() - b.double()
    return 100 * float(d.mean()), 100 * float(d.std(unbiased=True) / math.sqrt(d.numel()))


def table(test: dict, dev: dict, args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch

    from benchmarks.common import BenchError

    ks, alphas = list(args.test_ks), list(args.alphas)
    nk = len(ks)
    ki, ai = ks.index(args.k_star), args.alpha_star_index
    star = test["grid_correct"][:, ki, ai]
    test_acc = test["grid_correct"][:, :nk].double().mean(0)
    oi = int(torch.nonzero(test_acc.reshape(-1) == test_acc.max())[0, 0])
    ko, ao = divmod(oi, len(alphas))
    if not len(test["ids"]):
        raise BenchError("no test passages")
    rows = [
        ("base (alpha = 0)", test["base_correct"], ""),
        (f"alpha* {alphas[ai]:g}, k* {ks[ki]} (dev)", star, "labelled"),
        (f"oracle {alphas[ao]:g}, k {ks[ko]} (test)", test["grid_correct"][:, ko, ao], "test labels"),
    ]
    unit_col = {u: nk + i for i, u in enumerate(UNITS)}
    exact = test["grid_correct"].float().mean(0)
    approx = torch.tensor(
        [[float(candidate_correct(test, c, a).float().mean()) for a in alphas] for c in range(exact.shape[0])]
    )
    mismatch = float((exact - approx).abs().max())
    for u, col in unit_col.items():
        rows.append(
            (f"alpha = -0.5 (paper prior), k = last {u}", test["grid_correct"][:, col, 5], "no labels")
        )
        for rule, alpha in (("jsd", test["jsd_alpha"][:, col]), ("jsdist", jsdist_from_jsd(test, col))):
            split_alpha = round(float(alpha.mean()), 2)
            rows.append(
                (
                    f"{rule}_mean (alpha {split_alpha:.2f}), k = last {u}",
                    candidate_correct(test, col, split_alpha),
                    "no labels",
                )
            )
            per_passage = (
                test["jsd_correct"][:, col] if rule == "jsd" else candidate_correct(test, col, alpha)
            )
            rows.append(
                (f"{rule} (mean alpha {float(alpha.mean()):.2f}), k = last {u}", per_passage, "no labels")
            )
        cocoa = cocoa_from_stats(test["stats"][:, col])
        rows.append(
            (
                f"cocoa (mean alpha {float(cocoa.mean()):.2f}), k = last {u}",
                candidate_correct(test, col, cocoa),
                "no labels",
            )
        )
    mean_alpha = float(test["jsd_alpha"][:, ki].mean())
    rows.append(
        (f"jsd (mean alpha {mean_alpha:.2f}), k = k* {ks[ki]}", test["jsd_correct"][:, ki], "k labelled")
    )
    out = []
    print(f"LAMBADA test sample: n = {len(test['ids'])}; selection: dev sample n = {len(dev['ids'])}")
    print(f"{'row':<52} {'acc %':>7} {'± se':>6}   {'vs alpha*':>9} {'± se':>6}  uses")
    for name, correct, uses in rows:
        acc = 100 * float(correct.double().mean())
        diff, diff_se = paired(correct, star)
        print(f"{name:<52} {acc:7.2f} {100 * stderr(correct):6.2f}   {diff:+9.2f} {diff_se:6.2f}  {uses}")
        out.append(
            {
                "row": name,
                "acc": acc,
                "stderr": 100 * stderr(correct),
                "vs_alpha_star": diff,
                "vs_alpha_star_stderr": diff_se,
                "uses": uses,
            }
        )
    print(f"candidate-set accuracy vs the exact grid: largest difference {mismatch:.4f} (0: exact)")
    for u in unit_col:
        k = test["k_unit"][:, UNITS.index(u)].double()
        print(f"k = last {u}: median {float(k.median()):.0f}, mean {float(k.mean()):.1f} tokens")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_common_args(parser, threads=1)
    parser.add_argument("--test", type=Path, required=True, help="lambada_test.jsonl (OpenAI's test set)")
    parser.add_argument("--dev", type=Path, required=True, help="lambada_development_plain_text.txt")
    parser.add_argument("--limit", type=int, default=200, help="passages of each file")
    parser.add_argument(
        "--dev-limit", type=int, default=None, help="passages of the dev file (default --limit)"
    )
    parser.add_argument("--seed", type=int, default=2022)
    parser.add_argument("--chunk", type=int, default=8, help="passages per cached chunk")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--out", required=True, help="folder of the per-chunk score cache")
    parser.add_argument("--ks", type=int, nargs="+", default=list(range(1, 21)))
    parser.add_argument(
        "--test-grid",
        choices=("all", "k*"),
        default="all",
        help="k of the test split: the whole grid (for the oracle row) or the dev-chosen k* alone",
    )
    args = parser.parse_args()
    args.alphas = [round(-0.1 * i, 1) + 0.0 for i in range(11)]
    if args.limit < 1:
        raise BenchError(f"--limit must be at least 1, got {args.limit}")
    setup(args)
    model, tok = load_model(args)
    test_items = passages(args.test, "test", args.limit, args.seed)
    dev_items = passages(args.dev, "dev", args.dev_limit or args.limit, args.seed)
    dev = scored_split(model, tok, "dev", dev_items, list(args.ks), args)
    dev_acc = dev["grid_correct"][:, : len(args.ks)].double().mean(0)  # [K, A]
    best = int((dev_acc.reshape(-1) == dev_acc.max()).nonzero()[0, 0])  # ties: first, as the evaluator
    ki, args.alpha_star_index = divmod(best, len(args.alphas))
    args.k_star = args.ks[ki]
    # the test split needs the grid of k only for the oracle row: --test-grid k* keeps k* alone (faster)
    args.test_ks = [args.k_star] if args.test_grid == "k*" else list(args.ks)
    test = scored_split(model, tok, "test", test_items, args.test_ks, args)
    rows = table(test, dev, args)
    if args.json:
        write_json(
            args.json, {"model": args.model, "n_test": len(test_items), "n_dev": len(dev_items), "rows": rows}
        )


if __name__ == "__main__":
    run_main(main)
