"""Does coherence tuning move a real model toward its boosted self? (paper appendix "From coherence
boosting to coherence tuning", Table 2's "+ self-tune" row.)

Tunes SmolLM2-135M (``offline:smollm2-135m``; ``--gemma`` adds Gemma-3-270m) on WebText first-sentence
prompts of ``webtext.valid.jsonl`` with each teacher (live: the paper; frozen: the initial model; EMA of
the student), through ``CoherenceTuning`` and Lightning's Trainer, then evaluates every model on held-out
prompts of ``webtext.test.jsonl``:

* ``KL(boosted initial || f)`` and top-1 agreement with the boosted initial model, at the positions where
  boosting acts (context longer than ``k``) of continuations sampled once from the base model (so every
  model is scored on the same tokens); "before" is the base model itself;
* LTF, delta and perplexity (under the base LM, ``cblight.metrics.context_sensitivity``) and repetition
  (``repetition_rate``) of nucleus sampling (p = 0.95, as Table 2) from each tuned model, next to boosted
  sampling from the base (``boosted_generate``) and plain sampling from the base;
* each model's perplexity on the held-out human documents;
* with ``--lambada-dir``, LAMBADA accuracy (the last token of a passage, paper §3) on a seeded sample of
  ``--lambada-passages`` test passages: of every model at alpha = 0, and of the base model boosted as the
  teacher is (does tuning move unboosted accuracy toward boosted accuracy?). The teacher's
  generation-form boost ``(1-alpha) log f_max + alpha log f_k`` picks the same token as the next-token
  form ``log f_max + alpha / (1-alpha) · log f_k`` (a positive rescaling), which is what this row scores.

A teacher is ``frozen``, ``live`` or ``ema``, and the live one takes its brakes: ``live+trust=1.0``
(``teacher.trust_region``), ``live+refresh=8`` (``teacher.refresh_every``).

    python benchmarks/tuning_evidence.py --device cuda --webtext-dir DIR                 # ~5 min on one H100
    python benchmarks/tuning_evidence.py --device cpu --webtext-dir DIR --small          # ~10 min on 2 cores
    python benchmarks/tuning_evidence.py --device cpu --webtext-dir DIR --lambada-dir DIR2 --batch 16 \
        --skip-generation --teachers frozen,live,live+trust=1.0,live+refresh=8

It prints one table and writes JSON (``--out``, atomically, after every model, so a long run keeps what it
finished).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def model_name(gemma: bool = False) -> str:
    """The real model: the offline zoo's converted GGUF (one line to change for another)."""
    return "offline:gemma3-270m" if gemma else "offline:smollm2-135m"


def webtext(split: str, n: int | None, data_dir: str, seed: int = 0) -> tuple[list[str], list[str]]:
    """First sentences and whole documents of a WebText split (``n`` held out by a seeded shuffle)."""
    from cblight.tune.prompt_data import PromptDataModule

    if n is None:
        data = PromptDataModule(task="webtext", data_dir=data_dir, split=split)
        return data.train_prompts(), []
    data = PromptDataModule(task="webtext", data_dir=data_dir, split=split, val_size=n, seed=seed)
    return data.val_prompts(), data.val_texts()


def teacher_options(spec: str, ema_decay: float) -> Any:
    """``kind[+trust=beta][+refresh=N]`` as ``TeacherOptions``."""
    from cblight.tune.teacher import TeacherOptions

    kind, *brakes = spec.split("+")
    extra: dict[str, Any] = {}
    for brake in brakes:
        key, _, value = brake.partition("=")
        if key == "trust":
            extra["trust_region"] = float(value)
        elif key == "refresh":
            extra["refresh_every"] = int(value)
        else:
            raise SystemExit(
                f"error: --teachers: unknown brake {brake!r} in {spec!r} (trust=BETA, refresh=N)"
            )
    return TeacherOptions(kind=kind, ema_decay=ema_decay, **extra)


def tune(name: str, teacher: str, prompts: list[str], args: argparse.Namespace) -> Any:
    import lightning as L
    import torch

    from cblight.options import Boosting, Sampling
    from cblight.tune.coherence_tuning import CoherenceTuning
    from cblight.tune.export import ExportOptions
    from cblight.tune.loss import LossOptions
    from cblight.tune.prompt_data import PromptDataModule
    from cblight.tune.validation import ValidationOptions

    module = CoherenceTuning(
        model=name,
        boosting=Boosting(k=args.k, alpha=args.alpha),
        sampling=Sampling(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, seed=args.seed),
        teacher=teacher_options(teacher, args.ema_decay),
        loss=LossOptions(last_m=args.last_m),
        max_new_tokens=args.new,
        optimizer=partial(torch.optim.AdamW, lr=args.lr, weight_decay=0.0),
        export=ExportOptions(enabled=False),
        validation=ValidationOptions(log_samples_every_n_steps=0),
    )
    trainer = L.Trainer(
        max_steps=args.steps,
        accelerator="gpu" if args.device == "cuda" else "cpu",
        devices=1,
        gradient_clip_val=1.0,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
    )
    start = time.perf_counter()
    trainer.fit(module, PromptDataModule(prompts=prompts, batch_size=args.batch, seed=args.seed))
    seconds = time.perf_counter() - start
    # Lightning moves the module to the CPU when fit ends; the teacher copies are dropped with it
    return module.model.to(args.device).eval(), seconds


def agreement(
    model: Any, base: Any, sampled: Any, prefix: list[int], args: argparse.Namespace
) -> dict[str, float]:
    """KL(boosted base || model) and top-1 agreement at the long positions of fixed continuations."""
    import torch

    from cblight.tune.loss import tuning_kl_terms

    with torch.no_grad():
        terms = tuning_kl_terms(model, sampled, k=args.k, alpha=args.alpha, prefix=prefix, teacher_model=base)
    long = terms.long
    return {
        "kl_boosted_initial": float(terms.kl[long].mean()),
        "top1_boosted_initial": float(terms.agree[long].float().mean()),
        "positions": int(long.sum()),
    }


def generation_metrics(base: Any, tok: Any, result: Any, prefix: list[int]) -> dict[str, float]:
    from cblight.metrics import context_sensitivity, repetition_rate

    contexts = [
        [t for t, m in zip(row, mask) if m]
        for row, mask in zip(result.prompts.input_ids.tolist(), result.prompts.attention_mask.tolist())
    ]
    scores = context_sensitivity(base, contexts, result.tokens, prefix=prefix, pad_id=tok.pad_token_id)
    return {
        "ltf": scores["ltf"],
        "delta": scores["delta"],
        "ppl": scores["ppl"],
        "repetition": repetition_rate(result.tokens, eos_token_id=tok.eos_token_id),
    }


def sample(model: Any, tok: Any, prompts: list[str], args: argparse.Namespace, alpha: float = 0.0) -> Any:
    from cblight.generate import Boosting, boosted_generate

    results = []
    for lo in range(0, len(prompts), args.gen_batch):
        results.append(
            boosted_generate(
                model,
                tok,
                prompts[lo : lo + args.gen_batch],
                boosting=Boosting(k=args.k, alpha=alpha),
                max_new_tokens=args.gen_tokens,
                do_sample=True,
                top_p=0.95,
                top_k=0,
                seed=args.seed + lo,
            )
        )
    return _concat(results)


def _concat(results: list[Any]) -> Any:
    """One object with the fields generation_metrics reads, over several batches."""
    from types import SimpleNamespace

    import torch

    width = max(r.prompts.input_ids.shape[1] for r in results)

    def pad(t: torch.Tensor, value: int) -> torch.Tensor:
        return torch.nn.functional.pad(t, (width - t.shape[1], 0), value=value)

    ids = torch.cat([pad(r.prompts.input_ids, 0) for r in results])
    mask = torch.cat([pad(r.prompts.attention_mask, 0) for r in results])
    tokens = [t for r in results for t in r.tokens]
    return SimpleNamespace(prompts=SimpleNamespace(input_ids=ids, attention_mask=mask), tokens=tokens)


def lambada_passages(data_dir: str, n: int, seed: int) -> list[str]:
    """``n`` LAMBADA test passages (seeded sample), rendered as ``cblight evaluate`` renders them."""
    import numpy as np

    from cblight.data.registry import RenderContext, get_task
    from cblight.data.sources import load_split_records

    spec = get_task("lambada")
    records = load_split_records("lambada", "test", spec.source, data_dir=data_dir)
    chosen = sorted(np.random.default_rng(seed).permutation(len(records))[:n].tolist())
    ctx = RenderContext(split="test")
    return [spec.render(records[i], i, ctx).text for i in chosen]


def lambada_accuracy(
    model: Any, tok: Any, passages: list[str], k: int, alphas: list[float]
) -> dict[float, float]:
    """Accuracy of predicting each passage's last token at every next-token-form alpha with the last-``k``
    expert: the functions ``cblight evaluate``'s next-token kind uses (``Scorer``, the alpha sweep)."""
    import torch

    from cblight.boosting import next_token_alpha_sweep
    from cblight.scoring import Scorer

    scorer = Scorer(model, tok)
    contexts, targets = [], []
    for text in passages:
        ids = scorer.encoder.context(text)
        contexts.append(ids[:-1])
        targets.append(ids[-1])
    full = scorer.next_token_log_probs(contexts)
    short = scorer.last_k_log_probs(contexts, k, full=full)
    tgt = torch.tensor(targets, device=full.device)
    correct = next_token_alpha_sweep(full, short, tgt, torch.tensor(alphas), "next_token")["correct"]
    return {a: float(c) for a, c in zip(alphas, correct.float().mean(0).tolist(), strict=True)}


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def evaluate_model(label: str, model: Any, ctx: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    from cblight.tune.validation import human_text_nll

    say(f"evaluating {label}")
    row: dict[str, Any] = {"model": label}
    if model is not None:
        row.update(agreement(model, ctx["base"], ctx["held_out"], ctx["prefix"], args))
    if not args.skip_generation:
        if model is not None:
            generated = sample(model, ctx["tok"], ctx["prompts"], args)
        else:  # boosted sampling from the base
            generated = sample(ctx["base"], ctx["tok"], ctx["prompts"], args, alpha=args.alpha)
        row.update(generation_metrics(ctx["base"], ctx["tok"], generated, ctx["prefix"]))
    if model is not None:
        nll, tokens = human_text_nll(model, ctx["tok"], ctx["documents"], max_tokens=args.doc_tokens)
        row["human_ppl"] = math.exp(nll / tokens)
    if ctx.get("lambada"):  # the row's model as the row uses it: boosted for the boosted base, else alpha 0
        alpha = 0.0 if model is not None else args.alpha / (1 - args.alpha)  # the teacher's, next-token form
        scored = ctx["base"] if model is None else model
        row["lambada_acc"] = lambada_accuracy(scored, ctx["tok"], ctx["lambada"], args.k, [alpha])[alpha]
    return row


def run(name: str, args: argparse.Namespace, save: Any = lambda result: None) -> dict[str, Any]:
    import torch

    from cblight.batching import left_pad
    from cblight.models import load_causal_lm, load_tokenizer
    from cblight.scoring import Encoder
    from cblight.tune.rollouts import sample_sequences

    train_prompts, _ = webtext("validation", None, args.webtext_dir)
    train_prompts = train_prompts[: args.train_prompts] if args.train_prompts else train_prompts
    prompts, documents = webtext("test", args.eval_prompts, args.webtext_dir, seed=args.seed)
    tok = load_tokenizer(name)
    base = load_causal_lm(name).to(args.device).eval()
    prefix = Encoder(tok).prefix
    ids, mask = left_pad([Encoder(tok).context(p) for p in prompts], tok.pad_token_id, args.device)
    torch.manual_seed(args.seed)
    held_out = sample_sequences(
        base, ids, mask, max_new_tokens=args.new, eos_token_id=None, pad_token_id=tok.pad_token_id
    )
    ctx = {
        "base": base,
        "tok": tok,
        "prefix": prefix,
        "held_out": held_out,
        "prompts": prompts,
        "documents": documents,
    }
    if args.lambada_dir:
        ctx["lambada"] = lambada_passages(args.lambada_dir, args.lambada_passages, args.seed)
    result: dict[str, Any] = {"model": name, "rows": [], "tuning_seconds": {}}
    rows, seconds = result["rows"], result["tuning_seconds"]
    if not args.skip_base:
        rows.append(evaluate_model("base, nucleus", base, ctx, args))
        if not args.skip_generation or args.lambada_dir:  # the boosted base: generation, LAMBADA
            rows.append(evaluate_model(f"base + boost (k={args.k}, alpha={args.alpha})", None, ctx, args))
        save(result)
    for teacher in args.teachers:
        say(f"tuning with the {teacher} teacher: {args.steps} steps of {args.batch} sequences")
        torch.manual_seed(args.seed)
        tuned, seconds[teacher] = tune(name, teacher, train_prompts, args)
        rows.append(evaluate_model(f"+ self-tune ({teacher} teacher), nucleus", tuned, ctx, args))
        save(result)
        del tuned
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return result


COLUMNS = [
    ("model", "model", "{}"),
    ("KL(boost0||f)", "kl_boosted_initial", "{:.4f}"),
    ("top1=boost0", "top1_boosted_initial", "{:.3f}"),
    ("LTF %", "ltf", "{:.2%}"),
    ("delta %", "delta", "{:.2%}"),
    ("ppl", "ppl", "{:.2f}"),
    ("rep %", "repetition", "{:.1%}"),
    ("human ppl", "human_ppl", "{:.2f}"),
    ("LAMBADA %", "lambada_acc", "{:.2%}"),
]


def table(result: dict[str, Any]) -> str:
    from cblight.results import format_table

    rows = [
        [fmt.format(row[key]).rstrip("%") if key in row else "-" for _, key, fmt in COLUMNS]
        for row in result["rows"]
    ]
    return format_table([title for title, _, _ in COLUMNS], rows)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    parser.add_argument("--gemma", action="store_true", help="also run Gemma-3-270m (262k vocabulary)")
    parser.add_argument("--model", default=None, help="another model (a local directory) instead of SmolLM2")
    parser.add_argument("--small", action="store_true", help="a few steps and prompts: an end-to-end check")
    parser.add_argument("--teachers", default="live,frozen,ema")
    parser.add_argument("--steps", type=int, default=32, help="tuning steps (the paper: 32)")
    parser.add_argument("--batch", type=int, default=32, help="sequences per step (the paper: 32)")
    parser.add_argument("--new", type=int, default=32, help="sampled tokens per sequence (the paper: 32)")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--alpha", type=float, default=-0.4)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--ema-decay", type=float, default=0.9)
    parser.add_argument("--last-m", type=int, default=None)
    parser.add_argument("--eval-prompts", type=int, default=256)
    parser.add_argument("--gen-tokens", type=int, default=128)
    parser.add_argument("--gen-batch", type=int, default=64)
    parser.add_argument("--doc-tokens", type=int, default=128)
    parser.add_argument("--train-prompts", type=int, default=0, help="0: every first sentence of the split")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=1, help="CPU threads (more spin-wait on a shared machine)"
    )
    parser.add_argument(
        "--skip-generation",
        action="store_true",
        help="no generation metrics: the KL, top-1, human ppl, LAMBADA",
    )
    parser.add_argument("--skip-base", action="store_true", help="no base rows (another run has them)")
    parser.add_argument(
        "--lambada-dir", default=None, help="folder with lambada_test.jsonl: LAMBADA accuracy of every model"
    )
    parser.add_argument("--lambada-passages", type=int, default=400, help="seeded sample of the test split")
    parser.add_argument(
        "--webtext-dir",
        required=True,
        help="folder with the GPT-2 output dataset's webtext.valid.jsonl (prompts) and webtext.test.jsonl",
    )
    parser.add_argument(
        "--out", default=None, help="JSON path (default outputs/evidence/tuning_<device>.json)"
    )
    args = parser.parse_args(argv)
    args.teachers = [t for t in args.teachers.split(",") if t]
    if args.small:
        args.steps, args.batch, args.eval_prompts, args.gen_tokens, args.gen_batch = 4, 4, 8, 32, 8
        args.train_prompts = args.train_prompts or 64
    import torch

    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    from cblight.results import atomic_write_json

    out = Path(
        args.out
        or ROOT / "outputs" / "evidence" / f"tuning_{args.device}{'_small' if args.small else ''}.json"
    )
    results: list[dict[str, Any]] = []
    names = [args.model or model_name()] + ([model_name(gemma=True)] if args.gemma else [])
    settings = {k: v for k, v in vars(args).items() if k not in ("out",)}
    for name in names:
        start = time.perf_counter()

        def save(partial: dict[str, Any]) -> None:
            atomic_write_json(out, [*results, {**partial, "settings": settings}])

        result = run(name, args, save)
        result["seconds"] = time.perf_counter() - start
        result["settings"] = settings
        results.append(result)
        print(
            f"\n{name}: k={args.k} alpha={args.alpha} lr={args.lr} steps={args.steps} batch={args.batch} "
            f"new={args.new} ema_decay={args.ema_decay}; {args.eval_prompts} held-out prompts; "
            f"{result['seconds']:.0f} s on {args.device}"
        )
        print(table(result))
    atomic_write_json(out, results)
    print(f"\nwrote {out}")
    return results


if __name__ == "__main__":
    main()
