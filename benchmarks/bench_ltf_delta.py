"""LTF/delta speed (DESIGN.md §5): ours vs the authors' ``generation/metrics/likelihoods.py`` loop.

A GPT-2-small-shaped random model (``GPT2Config()`` defaults: 12 layers, 768 wide, 50257-token vocabulary)
on CPU; random prompts and generations. Both sides run the same full-context pass (one batched forward over
all documents); they differ in the 20-token short windows:

* authors: per document, one batch of right-padded windows ``tokens[max(0, t-20):t]`` through the model
  with logits and a log-softmax at every window position, then the last real position's value;
* ours: ``cblight.metrics.generated_token_log_probs``: windows only where more than 20 tokens precede
  the target, batched across documents, logits only at each window's end.

Prints (a) time per generated token at ``--tokens`` and ``2 x --tokens`` (linear scaling: ratio ~1) and
(b) the speed-up over the authors' loop on the same documents, plus the largest log-probability
difference between the two (they compute the same numbers).

    python benchmarks/bench_ltf_delta.py                   # defaults: 4 docs, 32-token prompts, 100 tokens
    python benchmarks/bench_ltf_delta.py --docs 2 --tokens 48 --repeats 3   # a quick run
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing


def build_model(seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config()).eval()


def make_documents(n_docs: int, prompt_len: int, gen_len: int, vocab: int, seed: int = 0):
    rng = random.Random(seed)
    ctxs = [[rng.randrange(vocab) for _ in range(prompt_len)] for _ in range(n_docs)]
    gens = [[rng.randrange(vocab) for _ in range(gen_len)] for _ in range(n_docs)]
    return ctxs, gens


@torch.no_grad()
def authors_log_probs(model, ctxs, gens, short_context_length: int = 20):
    """likelihoods.py, re-implemented: the whole set as one long batch, then one window batch per doc."""
    sequences = [torch.tensor(c + g) for c, g in zip(ctxs, gens)]
    batch = torch.nn.utils.rnn.pad_sequence(sequences, batch_first=True)
    logits = model(batch)[0].log_softmax(-1)[:, :-1].gather(-1, batch[:, 1:].unsqueeze(-1)).squeeze(-1)
    long = [lp[len(c) - 1 : len(c) + len(g) - 1] for lp, c, g in zip(logits, ctxs, gens)]
    del logits
    short = []
    for c, g in zip(ctxs, gens):
        all_tokens = torch.tensor(c + g)
        windows, window_lengths, targets = [], [], []
        for i in range(len(g)):
            windows.append(all_tokens[max(0, i + len(c) - short_context_length) : i + len(c)])
            window_lengths.append(len(windows[-1]))
            targets.append(all_tokens[i + len(c)])
        wb = torch.nn.utils.rnn.pad_sequence(windows, batch_first=True)
        lp = model(wb)[0].log_softmax(-1)[
            torch.arange(len(windows)), torch.tensor(window_lengths) - 1, torch.stack(targets)
        ]
        short.append(lp)
    return long, short


def ours_log_probs(model, ctxs, gens, k: int = 20):
    from cblight.metrics import generated_token_log_probs

    scored = generated_token_log_probs(model, ctxs, gens, k=k, batch_size=len(ctxs))
    return [f for f, _ in scored], [s for _, s in scored]


def interleaved(jobs: dict, repeats: int) -> tuple[dict, dict]:
    """Best time of each job over ``repeats`` rounds, the jobs alternating within a round so that load
    from other processes on a shared machine hits all of them alike."""
    best = dict.fromkeys(jobs, float("inf"))
    out: dict = {}
    for _ in range(repeats):
        for name, fn in jobs.items():
            start = time.perf_counter()
            out[name] = fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best, out


def ltf_delta(long, short):
    p_full, p_short = torch.cat(long).double().exp(), torch.cat(short).double().exp()
    return float(((p_full > 0.2) & (p_short < 0.05)).double().mean()), float((p_full - p_short).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=4, help="documents (one full-context batch)")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens per document")
    parser.add_argument("--tokens", type=int, default=100, help="generated tokens per document")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="best of this many timings")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = build_model()
    vocab = model.config.vocab_size
    print(
        f"GPT-2-small shape (12 x 768, vocab {vocab}), CPU, {args.threads} threads; {args.docs} docs, "
        f"{args.prompt}-token prompts, best of {args.repeats}"
    )
    ctxs, gens = make_documents(args.docs, args.prompt, args.tokens, vocab)
    ctxs2, gens2 = make_documents(args.docs, args.prompt, 2 * args.tokens, vocab, seed=1)
    ours_log_probs(model, ctxs[:1], [g[:24] for g in gens[:1]])  # warm-up
    times, out = interleaved(
        {
            "ours": lambda: ours_log_probs(model, ctxs, gens),
            "authors": lambda: authors_log_probs(model, ctxs, gens),
            "ours_2x": lambda: ours_log_probs(model, ctxs2, gens2),
        },
        args.repeats,
    )
    n1, n2 = args.docs * args.tokens, args.docs * 2 * args.tokens
    print(
        f"ours, {args.tokens:4d} generated tokens/doc: {times['ours']:7.2f} s ({1e3 * times['ours'] / n1:.1f} ms/token)"
    )
    print(
        f"ours, {2 * args.tokens:4d} generated tokens/doc: {times['ours_2x']:7.2f} s "
        f"({1e3 * times['ours_2x'] / n2:.1f} ms/token)"
    )
    print(f"authors' likelihoods.py loop, {args.tokens} tokens/doc: {times['authors']:7.2f} s")
    scaling = (times["ours_2x"] / n2) / (times["ours"] / n1)
    print(
        f"(a) time per token at {2 * args.tokens} vs {args.tokens} generated tokens: {scaling:.2f}x (linear: 1.00x)"
    )
    print(f"(b) speed-up over the authors' loop: {times['authors'] / times['ours']:.2f}x")
    (lo, so), (la, sa) = out["ours"], out["authors"]
    diff = max(
        (torch.cat(lo) - torch.cat(la)).abs().max().item(),
        (torch.cat(so) - torch.cat(sa)).abs().max().item(),
    )
    (ltf_o, delta_o), (ltf_a, delta_a) = ltf_delta(lo, so), ltf_delta(la, sa)
    print(
        f"agreement: max |log p_ours - log p_authors| = {diff:.1e}; delta {100 * delta_o:.5f} vs {100 * delta_a:.5f} %, "
        f"LTF {100 * ltf_o:.3f} vs {100 * ltf_a:.3f} %"
    )


if __name__ == "__main__":
    main()
