"""LTF/delta speed (docs/design.md, "Speed floors"): ours vs the authors' ``generation/metrics/likelihoods.py`` loop.

Random prompts and generations (token ids) scored by ``--model`` (default: a randomly initialised
GPT-2-small-shaped model; ``smollm2`` / ``gemma`` for the offline zoo's real models). Both sides run the same
full-context pass (one batched forward over all documents); they differ in the 20-token short windows:

* authors: per document, one batch of right-padded windows ``tokens[max(0, t-20):t]`` through the model
  with logits and a log-softmax at every window position, then the last real position's value;
* ours: ``cblight.metrics.generated_token_log_probs``: windows only where more than 20 tokens precede
  the target, batched across documents in chunks of ``--chunk-size`` windows (default
  ``cblight.batching.default_window_chunk``: 32 on CPU, 256 on CUDA), logits only at each window's end.

Prints (a) time per generated token at ``--tokens`` and ``2 x --tokens`` (linear scaling: ratio ~1),
(b) the speed-up over the authors' loop on the same documents, in wall time and (on CPU) in this process's
CPU time, which other processes on a shared machine disturb much less, (c) each side's peak memory, and
the largest log-probability difference between the two (they compute the same numbers).

The ratio depends on the machine; docs/metrics.md ("Speed: LTF/δ") says on what and how much.

    python benchmarks/bench_ltf_delta.py                   # defaults: 4 docs, 32-token prompts, 100 tokens
    python benchmarks/bench_ltf_delta.py --docs 2 --tokens 48 --repeats 3   # a quick run
    python benchmarks/bench_ltf_delta.py --model gemma --device cuda --docs 32 --tokens 256 --repeats 5
"""

from __future__ import annotations

import argparse
import random
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from benchmarks import common, memory
from cblight.metrics import generated_token_log_probs

K = 20  # the authors' short_context_length


def make_documents(n_docs: int, prompt_len: int, gen_len: int, vocab: int, seed: int = 0):
    rng = random.Random(seed)
    ctxs = [[rng.randrange(vocab) for _ in range(prompt_len)] for _ in range(n_docs)]
    gens = [[rng.randrange(vocab) for _ in range(gen_len)] for _ in range(n_docs)]
    return ctxs, gens


@torch.no_grad()
def authors_log_probs(model, ctxs, gens, short_context_length: int = K):
    """likelihoods.py, re-implemented: the whole set as one long batch, then one window batch per doc."""
    device = model.get_input_embeddings().weight.device
    sequences = [torch.tensor(c + g) for c, g in zip(ctxs, gens)]
    batch = torch.nn.utils.rnn.pad_sequence(sequences, batch_first=True).to(device)
    logits = model(batch)[0].log_softmax(-1)[:, :-1].gather(-1, batch[:, 1:].unsqueeze(-1)).squeeze(-1)
    long = [lp[len(c) - 1 : len(c) + len(g) - 1].cpu() for lp, c, g in zip(logits, ctxs, gens)]
    del logits
    short = []
    for c, g in zip(ctxs, gens):
        all_tokens = torch.tensor(c + g)
        windows, window_lengths, targets = [], [], []
        for i in range(len(g)):
            windows.append(all_tokens[max(0, i + len(c) - short_context_length) : i + len(c)])
            window_lengths.append(len(windows[-1]))
            targets.append(all_tokens[i + len(c)])
        wb = torch.nn.utils.rnn.pad_sequence(windows, batch_first=True).to(device)
        lp = model(wb)[0].log_softmax(-1)[
            torch.arange(len(windows)), torch.tensor(window_lengths) - 1, torch.stack(targets)
        ]
        short.append(lp.cpu())
    return long, short


def ours_log_probs(model, ctxs, gens, k: int = K, chunk_size: int | None = None):
    scored = generated_token_log_probs(model, ctxs, gens, k=k, batch_size=len(ctxs), chunk_size=chunk_size)
    return [f for f, _ in scored], [s for _, s in scored]


def ltf_delta(long, short):
    p_full, p_short = torch.cat(long).double().exp(), torch.cat(short).double().exp()
    return float(((p_full > 0.2) & (p_short < 0.05)).double().mean()), float((p_full - p_short).mean())


def build_jobs(args: argparse.Namespace, model):
    vocab = model.get_output_embeddings().weight.shape[0]
    ctxs, gens = make_documents(args.docs, args.prompt, args.tokens, vocab)
    ctxs2, gens2 = make_documents(args.docs, args.prompt, 2 * args.tokens, vocab, seed=1)
    return {
        "ours": lambda: ours_log_probs(model, ctxs, gens, chunk_size=args.chunk_size),
        "authors": lambda: authors_log_probs(model, ctxs, gens),
        "ours_2x": lambda: ours_log_probs(model, ctxs2, gens2, chunk_size=args.chunk_size),
    }


def multiply_adds(model) -> tuple[int, int]:
    """Multiply-adds per token of the transformer body's linear layers and of the LM head: their weight
    counts (embedding lookups cost none; attention scores over a 20-token window are negligible)."""
    from transformers.pytorch_utils import Conv1D

    head = model.get_output_embeddings()
    body = sum(
        m.weight.numel()
        for m in model.modules()
        if isinstance(m, (torch.nn.Linear, Conv1D)) and m is not head
    )
    return body, head.weight.numel()


def arithmetic_ratio(body: int, head: int, docs: int, prompt: int, tokens: int, k: int = K) -> float:
    """The speed-up that the multiply-adds alone predict for this job (memory traffic left out).

    Full-context pass: both sides run the body on every token; the authors run the LM head on every
    position, ours from the last prompt position on. Windows, one per generated token (the prompt is
    longer than ``k``): both run the body on all ``k`` positions, the authors the head on all of them too,
    ours on the last only. For GPT-2 small (``B`` = 85M, ``H`` = 39M) the windows alone give
    ``k(B + H) / (kB + H)`` = 1.42x, the default job 1.40x.
    """
    n = docs * (prompt + tokens)
    authors = n * (body + head) + docs * tokens * k * (body + head)
    ours = n * body + docs * (tokens + 1) * head + docs * tokens * (k * body + head)
    return authors / ours


def timed_cpu(fn, device: str) -> tuple[dict[str, float], object]:
    """Wall seconds, and this process's CPU seconds (all threads), kernel seconds and minor page faults
    (first touches of fresh memory), CUDA work waited for on both sides; and the output."""

    def usage():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return time.perf_counter(), r.ru_utime + r.ru_stime, r.ru_stime, r.ru_minflt

    common.synchronize(device)
    before = usage()
    out = fn()
    common.synchronize(device)
    after = usage()
    return dict(zip(("wall", "cpu", "sys", "page_faults"), (b - a for a, b in zip(before, after)))), out


def warm_up(args: argparse.Namespace, model, vocab: int) -> None:
    """Both sides once on one short document: first-call set-up (library buffers, lazy imports)."""
    ctxs, gens = make_documents(1, args.prompt, min(args.tokens, 24), vocab, seed=2)
    ours_log_probs(model, ctxs, gens, chunk_size=args.chunk_size)
    authors_log_probs(model, ctxs, gens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_common_args(parser)
    parser.add_argument("--docs", type=int, default=4, help="documents (one full-context batch)")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens per document")
    parser.add_argument("--tokens", type=int, default=100, help="generated tokens per document")
    parser.add_argument("--repeats", type=int, default=2, help="best of this many timings")
    parser.add_argument(
        "--chunk-size", type=int, default=None, help="our windows per forward (default: cblight's per device)"
    )
    args = parser.parse_args()
    for name in ("docs", "prompt", "tokens", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.prompt + 2 * args.tokens < K + 1:
        parser.error(f"--prompt + 2 x --tokens must exceed {K} (the short window)")
    common.setup(args)
    model, _ = common.load_model(args)
    jobs = build_jobs(args, model)
    vocab = model.get_output_embeddings().weight.shape[0]
    warm_up(args, model, vocab)
    if args.memory_job:
        memory.child(jobs, args)
        return

    host, facts = common.announce(args, model)
    from cblight.batching import default_window_chunk

    chunk = args.chunk_size or default_window_chunk(torch.device(args.device))
    print(
        f"{args.docs} docs, {args.prompt}-token prompts, {args.tokens} generated tokens/doc, short window {K}, "
        f"our windows in chunks of {chunk}; best of {args.repeats}, interleaved"
    )
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in jobs}
    out: dict = {}
    for _ in range(args.repeats):
        for name, fn in jobs.items():
            usage, out[name] = timed_cpu(fn, args.device)
            runs[name].append(usage)
    wall = {name: min(u["wall"] for u in r) for name, r in runs.items()}
    cpu = {name: min(u["cpu"] for u in r) for name, r in runs.items()}
    n1, n2 = args.docs * args.tokens, args.docs * 2 * args.tokens
    print(
        f"ours, {args.tokens:4d} generated tokens/doc: {wall['ours']:7.2f} s ({1e3 * wall['ours'] / n1:.1f} ms/token)"
    )
    print(
        f"ours, {2 * args.tokens:4d} generated tokens/doc: {wall['ours_2x']:7.2f} s "
        f"({1e3 * wall['ours_2x'] / n2:.1f} ms/token)"
    )
    print(f"authors' likelihoods.py loop, {args.tokens} tokens/doc: {wall['authors']:7.2f} s")
    scaling = (wall["ours_2x"] / n2) / (wall["ours"] / n1)
    speedup = wall["authors"] / wall["ours"]
    print(
        f"(a) time per token at {2 * args.tokens} vs {args.tokens} generated tokens: {scaling:.2f}x (linear: 1.00x)"
    )
    body, head = multiply_adds(model)
    arithmetic = arithmetic_ratio(body, head, args.docs, args.prompt, args.tokens)
    print(f"(b) speed-up over the authors' loop: {speedup:.2f}x wall time", end="")
    ratios = {"speedup_vs_authors": speedup, "per_token_2x_vs_1x": scaling}
    if args.device == "cpu":
        ratios["speedup_vs_authors_cpu_time"] = cpu["authors"] / cpu["ours"]
        print(
            f", {ratios['speedup_vs_authors_cpu_time']:.2f}x CPU time "
            f"(authors {cpu['authors']:.2f} s, ours {cpu['ours']:.2f} s of CPU)"
        )
        for name in ("authors", "ours"):
            fastest = min(runs[name], key=lambda u: u["wall"])
            print(
                f"    {name} (fastest run): {fastest['sys']:.2f} s of CPU in the kernel, {fastest['page_faults']:.0f} page faults"
                " (first touches of freshly mapped memory)"
            )
    else:
        print()
    print(
        f"    multiply-adds alone predict {arithmetic:.2f}x ({body / 1e6:.0f}M body and {head / 1e6:.0f}M LM-head"
        f" multiply-adds per token; ours runs the head on 1 of {K} window positions); the rest is memory"
        " traffic, which depends on the machine: docs/metrics.md"
    )
    ratios["arithmetic"] = arithmetic
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
    peak: dict[str, int] = {}
    if not args.skip_memory:
        print(f"(c) peak memory ({memory.note(args.device)}):")
        peak = memory.peaks(jobs, ["ours", "authors"], args)
        print(memory.line(f"{args.docs} x {args.tokens} tokens", peak, "ours", "authors"))
        ratios["peak_memory_authors_vs_ours"] = memory.ratio(peak, "authors", "ours")
    payload = common.record(
        "bench_ltf_delta",
        args,
        host,
        facts,
        settings={
            "docs": args.docs,
            "prompt": args.prompt,
            "tokens": args.tokens,
            "k": K,
            "chunk_size": chunk,
            "repeats": args.repeats,
            "statistic": "best",
        },
        seconds=wall,
        cpu_seconds=cpu if args.device == "cpu" else None,
        runs=runs,
        peak_bytes=peak or None,
        ratios=ratios,
        agreement={"max_abs_log_prob_diff": diff},
    )
    common.finish(args, payload)


if __name__ == "__main__":
    common.run_main(main)
