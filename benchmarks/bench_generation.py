"""Speed of boosted decoding against its floor and its peers, measured in one run (DESIGN.md §5).

A random GPT-2-small-shaped model (``GPT2Config()`` defaults, built here: no download) on CPU, a batch of
random 32-token prompts, greedy decoding of exactly ``N`` new tokens (EOS disabled), for each ``N``:

* **last-k** (``mode="last_k"``, k = 32) against
  - its *floor*: plain cached ``generate`` for ``N`` tokens plus one ``k``-token window forward with
    last-position logits for every step that needs a window (the cost model of DESIGN.md §5);
  - the authors' ``BoostedModel`` wrapper (generation/generation.py of zhenwang9102/coherence-boosting),
    re-implemented faithfully: every step re-runs the model on the whole sequence and on its last ``k``
    tokens without a cache, computes logits at every position, and mixes raw logits.
* **response so far** (``mode="response"``, prompts ending in EOS) against transformers' classifier-free
  guidance on the same job (``guidance_scale`` + ``negative_prompt_ids`` = the separator), and plain
  ``generate`` for reference.

The machine may be shared: each repeat times every method back to back (interleaved), and the medians
over repeats are reported. Run::

    python benchmarks/bench_generation.py                       # the DESIGN.md sizes
    python benchmarks/bench_generation.py --new-tokens 16 --layers 2 --repeats 1   # a quick smoke run
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing


def build(layers: int, width: int, seed: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    from cblight.tiny import gpt2_tokenizer

    torch.manual_seed(seed)
    config = GPT2Config(n_layer=layers, n_embd=width) if (layers, width) != (12, 768) else GPT2Config()
    model = GPT2LMHeadModel(config).eval()
    # exactly N new tokens for every method: no EOS stop
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model, gpt2_tokenizer()


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        fn()
    return time.perf_counter() - start


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


def measure(args, model, tok, ids: torch.Tensor, dialog_ids: torch.Tensor, new: int):
    """Seconds per method for ``new`` tokens, every method once per repeat (interleaved)."""
    from cblight.generation import boosted_generate
    from cblight.scoring import last_position_log_probs

    # steps whose content (prompt + generated so far) is longer than k run a window
    n_windows = sum(1 for t in range(new) if args.prompt_len + t > args.k)
    window = ids[:, -args.k :]
    neg = torch.full((args.batch, 1), tok.eos_token_id)
    runs = {
        "last_k": lambda: boosted_generate(
            model, tok, ids, mode="last_k", k=args.k, alpha=args.alpha, max_new_tokens=new
        ),
        "plain": lambda: model.generate(ids, max_new_tokens=new, do_sample=False),
        "windows": lambda: [last_position_log_probs(model, window) for _ in range(n_windows)],
        "authors": lambda: authors_wrapper(model, ids, new, args.k, args.alpha),
        "response": lambda: boosted_generate(
            model, tok, dialog_ids, mode="response", alpha=args.dialog_alpha, max_new_tokens=new
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
    wanted = [m for m in ("last_k", "plain", "windows", "authors") if "last_k" in args.cases]
    wanted += [m for m in ("response", "cfg", "plain_dialog") if "response" in args.cases]
    authors_every = args.authors_repeats or args.repeats
    times: dict[str, list[float]] = {}
    for r in range(args.repeats):
        this: dict[str, float] = {}
        for name in wanted:
            if name == "authors" and r >= authors_every:
                continue
            this[name] = timed(runs[name])
            times.setdefault(name, []).append(this[name])
        print(
            f"  [N={new} repeat {r + 1}] " + ", ".join(f"{k}={v:.2f}s" for k, v in this.items()), flush=True
        )
    return times, n_windows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--cases", nargs="+", default=["last_k", "response"], choices=["last_k", "response"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    model, tok = build(args.layers, args.width, args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, tok.eos_token_id, (args.batch, args.prompt_len), generator=gen)
    eos = torch.full((args.batch, 1), tok.eos_token_id)
    dialog_ids = torch.cat([ids[:, :-1], eos], dim=1)
    print(
        f"GPT-2 {args.layers} layers x {args.width}, batch {args.batch}, {args.prompt_len}-token prompts, "
        f"greedy, {args.threads} threads, k={args.k}, {args.repeats} interleaved repeats (medians)"
    )

    for new in args.new_tokens:
        times, n_windows = measure(args, model, tok, ids, dialog_ids, new)
        med = {name: statistics.median(v) for name, v in times.items()}
        print(
            f"N = {new} new tokens (median seconds: "
            + ", ".join(f"{k} {v:.2f}" for k, v in med.items())
            + ")"
        )
        if "last_k" in med:
            floor = med["plain"] + med["windows"]
            print(
                f"  last-{args.k} boosting: {floor / med['last_k']:.2f}x of its floor "
                f"(plain cached generate + {n_windows} window forwards; target >= 0.85x)"
            )
            print(
                f"  last-{args.k} boosting: {med['authors'] / med['last_k']:.2f}x the authors' wrapper "
                f"(target >= {'2' if new <= 64 else '3.5'}x at {new} tokens)"
            )
            print(f"  last-{args.k} boosting costs {med['last_k'] / med['plain']:.2f}x plain generate")
        if "response" in med:
            print(
                f"  response-so-far boosting: {med['cfg'] / med['response']:.2f}x the throughput of "
                f"transformers' CFG (target >= 1.2x); {med['response'] / med['plain_dialog']:.2f}x the time "
                "of plain generate"
            )


if __name__ == "__main__":
    main()
