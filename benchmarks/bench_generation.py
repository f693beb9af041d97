"""Speed of boosted decoding against its floor and its peers, measured in one run (docs/design.md, "Speed floors").

``--model`` (default: a randomly initialised GPT-2-small-shaped model built here; ``smollm2`` / ``gemma``:
the offline zoo's real models), a batch of ``--prompt-len``-token prompts (word text through the model's
tokenizer), greedy decoding of exactly ``N`` new tokens (EOS disabled), for each ``N``:

* **last-k** (``mode="last_k"``, k = 32) against
  - its *floor*: plain cached ``generate`` for ``N`` tokens plus one ``k``-token window forward with
    last-position logits for every step that needs a window (the cost model of docs/design.md, "Speed floors");
  - the authors' ``BoostedModel`` wrapper (generation/generation.py of zhenwang9102/coherence-boosting),
    re-implemented faithfully: every step re-runs the model on the whole sequence and on its last ``k``
    tokens without a cache, computes logits at every position, and mixes raw logits.
* **response so far** (``mode="response"``, prompts ending in EOS) against transformers' classifier-free
  guidance on the same job (``guidance_scale`` + ``negative_prompt_ids`` = the separator), and plain
  ``generate`` for reference.

The machine may be shared: each repeat times every method back to back (interleaved), and the medians
over repeats are reported. Peak memory of every method (``--memory-tokens`` new tokens, default the first
``N``) follows. Run::

    python benchmarks/bench_generation.py                       # the sizes of docs/design.md, "Speed floors"
    python benchmarks/bench_generation.py --new-tokens 16 --layers 2 --repeats 1   # a quick smoke run
    python benchmarks/bench_generation.py --model smollm2 --repeats 3 --authors-repeats 1
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from benchmarks import common, memory

METHODS = {
    "last_k": ("last_k", "plain", "windows", "authors"),
    "response": ("response", "cfg", "plain_dialog"),
}


def prompts(tok, batch: int, length: int, seed: int, device: str) -> torch.Tensor:
    """``[batch, length]`` prompt ids: random word text through the tokenizer (with its BOS, if any)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(batch):
        text = " ".join(common.sentence(rng, 12) for _ in range(length))
        rows.append(tok(text)["input_ids"][:length])
    return torch.tensor(rows, device=device)


def authors_wrapper(model, ids: torch.Tensor, new: int, k: int, alpha: float) -> torch.Tensor:
    """The reference's BoostedModel under generate: no cache, whole sequence every step, raw logits mixed
    as ``alpha_long * long + alpha_short * short`` with ``alpha_long = 1 - alpha``."""
    seq = ids
    for _ in range(new):
        long = model(input_ids=seq, use_cache=False).logits
        short = model(input_ids=seq[:, -k:], use_cache=False).logits
        mixed = (1 - alpha) * long[:, -1, :] + alpha * short[:, -1, :]
        seq = torch.cat([seq, mixed.argmax(-1, keepdim=True)], dim=1)
    return seq


def build_jobs(args, model, tok, ids: torch.Tensor, dialog_ids: torch.Tensor, new: int):
    """The methods for ``new`` tokens, and how many steps need a last-k window."""
    from cblight.batching import last_position_log_probs
    from cblight.generate import Boosting, boosted_generate

    # steps whose content (prompt + generated so far) is longer than k run a window
    n_windows = sum(1 for t in range(new) if args.prompt_len + t > args.k)
    window = ids[:, -args.k :]
    neg = torch.full((args.batch, 1), tok.eos_token_id, device=ids.device)
    jobs = {
        "last_k": lambda: boosted_generate(
            model, tok, ids, boosting=Boosting(mode="last_k", k=args.k, alpha=args.alpha), max_new_tokens=new
        ),
        "plain": lambda: model.generate(ids, max_new_tokens=new, do_sample=False),
        "windows": lambda: [last_position_log_probs(model, window) for _ in range(n_windows)],
        "authors": lambda: authors_wrapper(model, ids, new, args.k, args.alpha),
        "response": lambda: boosted_generate(
            model,
            tok,
            dialog_ids,
            boosting=Boosting(mode="response", alpha=args.dialog_alpha),
            max_new_tokens=new,
        ),
        "cfg": lambda: model.generate(
            dialog_ids,
            max_new_tokens=new,
            do_sample=False,
            guidance_scale=1 / (1 + args.dialog_alpha),
            negative_prompt_ids=neg,
        ),
        "plain_dialog": lambda: model.generate(dialog_ids, max_new_tokens=new, do_sample=False),
    }
    wanted = [m for case in args.cases for m in METHODS[case]]
    return {m: jobs[m] for m in wanted}, n_windows


def measure(args, jobs: dict, new: int) -> dict[str, list[float]]:
    """Seconds per method for ``new`` tokens, every method once per repeat (interleaved)."""
    authors_every = args.authors_repeats or args.repeats
    times: dict[str, list[float]] = {}
    for r in range(args.repeats):
        this: dict[str, float] = {}
        for name, fn in jobs.items():
            if name == "authors" and r >= authors_every:
                continue
            this[name], _ = common.timed(fn, args.device)
            times.setdefault(name, []).append(this[name])
        print(
            f"  [N={new} repeat {r + 1}] " + ", ".join(f"{k}={v:.2f}s" for k, v in this.items()), flush=True
        )
    return times


def report(args, med: dict[str, float], new: int, n_windows: int) -> dict[str, float]:
    ratios: dict[str, float] = {}
    if "last_k" in med:
        floor = med["plain"] + med["windows"]
        ratios["last_k_vs_floor"] = floor / med["last_k"]
        ratios["last_k_speedup_vs_authors"] = med["authors"] / med["last_k"]
        ratios["last_k_time_vs_plain"] = med["last_k"] / med["plain"]
        print(
            f"  last-{args.k} boosting: {ratios['last_k_vs_floor']:.2f}x of its floor "
            f"(plain cached generate + {n_windows} window forwards; target >= 0.85x)"
        )
        print(
            f"  last-{args.k} boosting: {ratios['last_k_speedup_vs_authors']:.2f}x the authors' wrapper "
            f"(target >= {'2' if new <= 64 else '3.5'}x at {new} tokens)"
        )
        print(f"  last-{args.k} boosting costs {ratios['last_k_time_vs_plain']:.2f}x plain generate")
    if "response" in med:
        ratios["response_throughput_vs_cfg"] = med["cfg"] / med["response"]
        ratios["response_time_vs_plain"] = med["response"] / med["plain_dialog"]
        print(
            f"  response-so-far boosting: {ratios['response_throughput_vs_cfg']:.2f}x the throughput of "
            f"transformers' CFG (target >= 1.2x); {ratios['response_time_vs_plain']:.2f}x the time "
            "of plain generate"
        )
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_common_args(parser)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[64, 200])
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument(
        "--alpha", type=float, default=-0.05, help="last-k alpha (speed does not depend on it)"
    )
    parser.add_argument("--dialog-alpha", type=float, default=-0.3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--authors-repeats", type=int, default=None, help="repeats of the slow wrapper")
    parser.add_argument("--memory-tokens", type=int, default=None, help="new tokens of the memory runs")
    parser.add_argument("--layers", type=int, default=12, help="layers of the gpt2-random model")
    parser.add_argument("--width", type=int, default=768, help="width of the gpt2-random model")
    parser.add_argument("--cases", nargs="+", default=["last_k", "response"], choices=list(METHODS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if (args.layers, args.width) != (12, 768) and args.model != common.RANDOM_GPT2:
        parser.error(f"--layers/--width shape the {common.RANDOM_GPT2} model only")
    # the floor's window is the prompt's last k tokens, so the prompt needs k of them (32 and 32 by default)
    if min(args.new_tokens) < 1 or args.batch < 1 or args.repeats < 1 or args.prompt_len < args.k:
        parser.error("--new-tokens, --batch and --repeats must be at least 1, and --prompt-len at least --k")
    memory_tokens = args.memory_tokens or args.new_tokens[0]
    common.setup(args)
    model, tok = common.load_model(args, layers=args.layers, width=args.width)
    # exactly N new tokens for every method: no EOS stop
    model.generation_config.eos_token_id = None
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = 0
    ids = prompts(tok, args.batch, args.prompt_len, args.seed, args.device)
    eos = torch.full((args.batch, 1), tok.eos_token_id, device=args.device)
    dialog_ids = torch.cat([ids[:, :-1], eos], dim=1)
    if args.memory_job:
        memory.child(build_jobs(args, model, tok, ids, dialog_ids, memory_tokens)[0], args)
        return

    host, facts = common.announce(args, model)
    print(
        f"batch {args.batch}, {args.prompt_len}-token prompts, greedy, k={args.k}, "
        f"{args.repeats} interleaved repeats (medians)"
    )
    for fn in build_jobs(args, model, tok, ids, dialog_ids, 2)[0].values():
        common.timed(fn, args.device)  # warm-up: first-call set-up stays out of the timings
    results = []
    for new in args.new_tokens:
        jobs, n_windows = build_jobs(args, model, tok, ids, dialog_ids, new)
        times = measure(args, jobs, new)
        med = {name: common.median(v) for name, v in times.items()}
        print(
            f"N = {new} new tokens (median seconds: "
            + ", ".join(f"{k} {v:.2f}" for k, v in med.items())
            + ")"
        )
        results.append(
            {
                "new_tokens": new,
                "seconds": times,
                "median_seconds": med,
                "ratios": report(args, med, new, n_windows),
            }
        )
    peak: dict[str, int] = {}
    if not args.skip_memory:
        print(f"peak memory at N = {memory_tokens} ({memory.note(args.device)}):")
        jobs, _ = build_jobs(args, model, tok, ids, dialog_ids, memory_tokens)
        peak = memory.peaks(jobs, list(jobs), args, memory_tokens=str(memory_tokens))
        pairs = [
            ("last_k", "authors"),
            ("plain", "last_k"),
            ("response", "cfg"),
            ("plain_dialog", "response"),
        ]
        for ours, theirs in pairs:
            if ours in peak and theirs in peak:
                print(memory.line(f"N = {memory_tokens}", peak, ours, theirs))
    payload = common.record(
        "bench_generation",
        args,
        host,
        facts,
        settings={
            "batch": args.batch,
            "prompt_len": args.prompt_len,
            "k": args.k,
            "alpha": args.alpha,
            "dialog_alpha": args.dialog_alpha,
            "repeats": args.repeats,
            "authors_repeats": args.authors_repeats or args.repeats,
            "statistic": "median",
            "memory_tokens": memory_tokens,
        },
        runs=results,
        peak_bytes=peak or None,
    )
    common.finish(args, payload)


if __name__ == "__main__":
    common.run_main(main)
