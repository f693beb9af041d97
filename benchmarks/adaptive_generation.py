"""WebText generation with per-token adaptive alpha (docs/adaptive.md) beside nucleus sampling
and boosted nucleus sampling at fixed alphas (paper §4.1, Table 2).

Runs ``cblight generate`` (``BoostedGenerationEvaluator``) on the first sentences of WebText documents with
the same prompts, number of new tokens, top-p and seed for every row: nucleus (p = 0.95), boosted nucleus
at each fixed ``--alphas`` with the last ``--k`` tokens as the short expert, and each ``--rules`` rule at the
same ``k``. Then it prints Table 2's context columns with standard errors over documents: perplexity,
LTF and delta under the base model (each token's ``p_full`` and ``p_short`` from the run's cache;
documents are the independent units, so the standard errors are those of a ratio estimator over
documents), repetition (degen's, from ``results.json``) and the mean and spread of each adaptive row's
per-token alphas. Last, each adaptive row's LTF and delta against nucleus sampling and against the
strongest fixed alpha, as paired differences over the same prompts with their standard errors.

    python benchmarks/adaptive_generation.py --model smollm2 --webtext DIR_WITH_webtext.test.jsonl \\
        --limit 32 --new 32 --k 8 --out /tmp/adaptive-webtext
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import ZOO, BenchError, run_main, write_json  # noqa: E402


def config(args: argparse.Namespace) -> dict[str, Any]:
    nucleus = {"do_sample": True, "top_p": 0.95}
    rows: list[dict[str, Any]] = [{"name": "nucleus", "sampling": nucleus}]
    for alpha in args.alphas:
        rows.append(
            {"name": f"boost alpha={alpha:g}", "boosting": {"k": args.k, "alpha": alpha}, "sampling": nucleus}
        )
    for rule in args.rules:
        rows.append(
            {"name": f"adaptive {rule}", "boosting": {"k": args.k, "adaptive": rule}, "sampling": nucleus}
        )
    return {
        "model": {
            "class_path": "cblight.generate.generation_evaluator.BoostedGenerationEvaluator",
            "init_args": {
                "model": ZOO.get(args.model, args.model),
                "decodings": rows,
                "max_new_tokens": args.new,
                "seed": args.seed,
                "self_bleu_samples": None,
                "output_dir": str(Path(args.out) / args.model),
                "plots": False,
            },
        },
        "data": {"tasks": ["webtext"], "batch_size": args.batch_size, "limit": args.limit},
        "trainer": {"enable_progress_bar": False},
    }


def ratio_stderr(num: list[float], den: list[float]) -> tuple[float, float]:
    """``Σ num / Σ den`` and its standard error over independent documents (the ratio estimator's)."""
    n = len(num)
    total = sum(den)
    r = sum(num) / total
    if n < 2:
        return r, math.nan
    resid = [x - r * d for x, d in zip(num, den)]
    return r, math.sqrt(n / (n - 1) * sum(e * e for e in resid)) / total


def paired_ratio_diff(a: dict[int, tuple], b: dict[int, tuple], field: int) -> tuple[float, float]:
    """``R_a - R_b`` for two ratio estimators over the same documents (``{id: (ltf, delta, tokens)}``, the
    numerator at ``field``) in percentage points, and its standard error (the linearised difference)."""
    ids = sorted(set(a) & set(b))
    ta, tb = sum(a[i][2] for i in ids), sum(b[i][2] for i in ids)
    ra, rb = sum(a[i][field] for i in ids) / ta, sum(b[i][field] for i in ids) / tb
    e = [(a[i][field] - ra * a[i][2]) / ta - (b[i][field] - rb * b[i][2]) / tb for i in ids]
    n = len(ids)
    return 100 * (ra - rb), 100 * math.sqrt(n / (n - 1) * sum(x * x for x in e)) if n > 1 else math.nan


def row_stats(records: list[dict[str, Any]]) -> dict[str, Any]:
    ltf_n, delta_n, nll_n, den, alphas = [], [], [], [], []
    docs: dict[int, tuple[float, float, float]] = {}
    for r in records:
        if not r["tokens"]:
            continue
        pf = [math.exp(x) for x in r["lp_full"]]
        ps = [math.exp(x) for x in r["lp_short"]]
        ltf_n.append(sum(1.0 for a, b in zip(pf, ps) if a > 0.2 and b < 0.05))
        delta_n.append(sum(a - b for a, b in zip(pf, ps)))
        nll_n.append(-sum(r["lp_full"]))
        den.append(float(len(r["tokens"])))
        docs[r["id"]] = (ltf_n[-1], delta_n[-1], den[-1])
        alphas += r.get("alphas", [])
    ltf, ltf_se = ratio_stderr(ltf_n, den)
    delta, delta_se = ratio_stderr(delta_n, den)
    nll, nll_se = ratio_stderr(nll_n, den)
    out = {
        "documents": len(den), "tokens": int(sum(den)),
        "ltf": 100 * ltf, "ltf_se": 100 * ltf_se, "delta": 100 * delta, "delta_se": 100 * delta_se,
        "ppl": math.exp(nll), "ppl_se": math.exp(nll) * nll_se,
        "docs": docs,
    }  # fmt: skip
    if alphas:
        mean = sum(alphas) / len(alphas)
        out.update(alpha_mean=mean, alpha_sd=math.sqrt(sum((a - mean) ** 2 for a in alphas) / len(alphas)))
    return out


def records(folder: Path) -> list[dict[str, Any]]:
    rows = {}
    for shard in sorted(folder.glob("rank*.jsonl")):
        for line in shard.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            rows[row["id"]] = row
    return [rows[i] for i in sorted(rows)]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2", help="smollm2, gemma or a local model directory")
    parser.add_argument("--webtext", required=True, help="folder holding webtext.test.jsonl")
    parser.add_argument("--limit", type=int, default=32, help="prompts (the first N documents)")
    parser.add_argument("--new", type=int, default=32, help="new tokens per prompt")
    parser.add_argument("--k", type=int, default=8, help="the short expert's last k tokens")
    parser.add_argument("--alphas", type=float, nargs="*", default=[-0.05, -0.1, -0.2, -0.4])
    parser.add_argument("--rules", nargs="*", default=["jsd", "jsdist", "cocoa"])
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", required=True)
    parser.add_argument("--json")
    args = parser.parse_args()
    if not (Path(args.webtext) / "webtext.test.jsonl").is_file():
        raise BenchError(f"--webtext {args.webtext}: no webtext.test.jsonl there")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = out / f"{args.model}.json"
    cfg.write_text(json.dumps(config(args), indent=1), encoding="utf-8")
    cmd = [sys.executable, "-m", "cblight", "generate", "-c", str(cfg), "--data.data_dirs",
           json.dumps({"webtext": args.webtext})]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise BenchError(f"cblight generate failed:\n{done.stderr[-3000:]}")
    run = Path(args.out) / args.model
    results = json.loads((run / "results.json").read_text(encoding="utf-8"))["tasks"]["webtext"]
    from cblight.generate.rows import Decoding

    table = []
    print(f"WebText, {args.model}: {args.limit} prompts x {args.new} new tokens, top-p 0.95, k = {args.k}")
    print(
        f"{'row':<22} {'ppl':>7} {'± se':>6} {'LTF %':>6} {'± se':>5} {'delta %':>7} {'± se':>5} {'rep %':>6}  alpha"
    )
    for name in results["rows"]:
        slug = Decoding(name=name).slug
        stats = row_stats(records(run / "cache" / "webtext" / slug))
        stats.update(row=name, rep=results["rows"][name]["rep"])
        table.append(stats)
        alpha = f"{stats['alpha_mean']:+.3f} (sd {stats['alpha_sd']:.3f})" if "alpha_mean" in stats else ""
        print(
            f"{name:<22} {stats['ppl']:7.2f} {stats['ppl_se']:6.2f} {stats['ltf']:6.2f} {stats['ltf_se']:5.2f} "
            f"{stats['delta']:7.2f} {stats['delta_se']:5.2f} {stats['rep']:6.2f}  {alpha}"
        )
    by_name = {row["row"]: row.pop("docs") for row in table}
    strongest = f"boost alpha={min(args.alphas):g}" if args.alphas else None
    print("paired differences (percentage points, ± se over prompts): LTF, delta")
    for row in table:
        if "alpha_mean" not in row:
            continue
        for ref in ("nucleus", strongest):
            if ref is None:
                continue
            ltf, ltf_se = paired_ratio_diff(by_name[row["row"]], by_name[ref], 0)
            delta, delta_se = paired_ratio_diff(by_name[row["row"]], by_name[ref], 1)
            row[f"vs {ref}"] = {"ltf": ltf, "ltf_se": ltf_se, "delta": delta, "delta_se": delta_se}
            print(f"  {row['row']} vs {ref}: {ltf:+.2f} ± {ltf_se:.2f}, {delta:+.2f} ± {delta_se:.2f}")
    if args.json:
        write_json(
            args.json, {"model": args.model, "limit": args.limit, "new": args.new, "k": args.k, "rows": table}
        )


if __name__ == "__main__":
    run_main(main)
