"""The demo: the paper's whole loop on a real pretrained model, offline, in a few minutes on a CPU.

    cblight demo                      # SmolLM2-135M (Apache-2.0), about 5 minutes on 2 CPU cores
    cblight demo --model gemma3-270m  # Gemma-3-270m (Gemma terms of use)
    cblight demo --quick              # fewer examples, about 2 minutes
    cblight demo --model tiny         # a 2-layer random GPT-2: the plumbing in seconds, numbers mean nothing

Steps, each through cblight's real entry points (the same code as ``cblight evaluate`` / ``cblight tune``):

1. the model: ``offline:<name>``, converted once from the GGUF of its PyPI wheel (``cblight.zoo``);
2. Figure 1: next-token tops under the full context, the last-8-token context and the boosted mix;
3. Table 1: LAMBADA last-token accuracy, base vs boosted, ``(k*, alpha*)`` chosen on development passages;
4. Table 4: multiple choice (CommonsenseQA, PIQA), ``alpha*`` chosen on a disjoint selection set;
5. coherence tuning: a short run of the appendix's procedure, exported with ``save_pretrained``;
6. Table 2: WebText continuations from base and tuned model, plain and boosted nucleus sampling, with
   perplexity, LTF, delta and the text statistics under the base model.

Data: real benchmark samples shipped in ``cblight/assets/realdata`` (sources and licences in its README).
Every step writes its results, predictions and plots under ``--output_dir``; a summary closes the run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cblight.option_types import PositiveInt

REALDATA = Path(__file__).parent / "assets" / "realdata"
FIGURE1_CONTEXT = ' Ballad metre is "less regular and more conversational" than common metre'


@dataclass(frozen=True)
class Sizes:
    """How many examples each step uses (the shipped files hold 200 per split, 64 WebText prompts)."""

    lambada: int
    choice: int
    prompts: int
    new_tokens: int
    tune_steps: int
    tune_batch: int


# sized for about 5 minutes (2 minutes with --quick) of SmolLM2 on 2 CPU cores: a LAMBADA passage costs
# one full pass plus one k-token pass per k, about 0.6 CPU-seconds with the grid below
FULL = Sizes(lambada=100, choice=60, prompts=8, new_tokens=32, tune_steps=6, tune_batch=4)
QUICK = Sizes(lambada=40, choice=30, prompts=4, new_tokens=32, tune_steps=4, tune_batch=4)

# Table 1's grid, coarsened: the paper's k* for GPT-2 small is 10 (k in 1..20)
LAMBADA_KS = [4, 8, 12, 16]
# boosting strength of the generation rows and of coherence tuning: the settings under which tuning moved
# SmolLM2 toward its boosted self in benchmarks/tuning_evidence.py (docs/tuning.md); the frozen teacher is
# train.py's default
GEN_K, GEN_ALPHA = 8, -0.4
TUNE_K, TUNE_ALPHA, TUNE_LR = 8, -0.4, 3e-5


@contextlib.contextmanager
def _step(index: int, title: str) -> Iterator[None]:
    """Prints ``[demo i/6] title`` and, when the step succeeds, its wall time."""
    start = time.time()
    print(f"\n[demo {index}/6] {title}", flush=True)
    yield
    print(f"[demo {index}/6] done in {time.time() - start:.0f} s", flush=True)


def _trainer_args(devices: int) -> list[str]:
    args = ["--trainer.accelerator", "cpu", "--trainer.devices", str(devices)]
    return args + (["--trainer.strategy", "ddp"] if devices > 1 else [])


def prepare_model(choice: str, out: Path) -> str:
    """The model path or ``offline:`` name; ``tiny`` builds a random GPT-2 into ``out``."""
    if choice == "tiny":
        from cblight.tiny import build_tiny_gpt2

        model_dir = out / "tiny-gpt2"
        if not (model_dir / "config.json").exists():
            build_tiny_gpt2(model_dir, n_positions=1024)
        print(f"  tiny random GPT-2 at {model_dir}: its numbers mean nothing")
        return str(model_dir)
    from cblight import zoo

    name = f"offline:{choice}"
    path = zoo.resolve(name)  # converts on first use, with progress; verified afterwards
    entry = zoo.lookup(name)
    print(f"  {name}: {entry.title}\n  weights: {entry.quantisation}, dequantised to float32 ({path})")
    return name


def _evaluate(model: str, out: Path, limit: int, devices: int, *options: str) -> dict[str, Any]:
    """``cblight evaluate`` on the shipped samples, writing under ``out``."""
    from cblight.cli import evaluate_cli

    return evaluate_cli(
        [
            *options,
            "--model.model", model,
            "--model.output_dir", str(out),
            "--data.data_root", str(REALDATA),
            "--data.limit", str(limit),
            *_trainer_args(devices),
        ]
    )  # fmt: skip


def tune(model: str, out: Path, sizes: Sizes, devices: int) -> Path:
    from cblight.cli import train_cli

    export = out / "tuning" / "hf"
    train_cli(
        [
            "fit",
            "--model.model", model,
            "--model.boosting.k", str(TUNE_K),
            "--model.boosting.alpha", str(TUNE_ALPHA),
            "--model.max_new_tokens", str(sizes.new_tokens),
            "--model.optimizer", "torch.optim.AdamW",
            "--model.optimizer.lr", str(TUNE_LR),
            "--model.export.dir", str(export),
            "--model.export.overwrite", "true",  # a rerun of the demo redoes its tuning
            "--data.task", "webtext",
            "--data.data_dir", str(REALDATA / "webtext"),
            "--data.split", "validation",
            "--data.batch_size", str(sizes.tune_batch),
            "--data.val_size", str(sizes.tune_batch),
            "--trainer.max_steps", str(sizes.tune_steps),
            "--trainer.val_check_interval", str(sizes.tune_steps),
            "--trainer.check_val_every_n_epoch", "null",
            "--trainer.num_sanity_val_steps", "0",
            "--trainer.enable_checkpointing", "false",
            "--trainer.enable_model_summary", "false",
            "--trainer.logger", "lightning.pytorch.loggers.CSVLogger",
            "--trainer.logger.save_dir", str(out / "tuning"),
            "--trainer.logger.name", "logs",
            *_trainer_args(devices),
        ]
    )  # fmt: skip
    return export


def _pct(x: Any) -> str:
    return "-" if x is None else f"{100 * float(x):.1f}"


def summary(ranks: dict[str, int], lam: dict[str, Any], mc: dict[str, Any], gen: dict[str, Any]) -> str:
    from cblight.results import format_table

    lines = [f"Figure 1: rank of ' metre' under full / short / boosted: {ranks['full']} / {ranks['short']} / "
             f"{ranks['boosted']}"]  # fmt: skip
    reports = {task: result["report"] for task, result in {**lam, **mc}.items()}
    rows = [
        [
            task,
            rep["n"],
            f"{_pct(rep['acc_base'])} ± {_pct(rep['acc_base_stderr'])}",
            f"{_pct(rep.get('acc'))} ± {_pct(rep.get('acc_stderr'))}",
            rep.get("alpha_star"),
            rep.get("k_star", "-"),
        ]
        for task, rep in reports.items()
    ]
    lines.append(format_table(["task", "n", "acc base %", "acc boosted %", "alpha*", "k*"], rows))
    cols = ("ppl", "ltf", "delta", "rep", "lr_50")
    body = [[f"{row['checkpoint']}: {row['decoding']}", *(row.get(c) for c in cols)] for row in gen["rows"]]
    lines.append(format_table(["WebText row", *cols], body))
    return "\n\n".join(lines)


def _not_a_startup_note(record: logging.LogRecord) -> bool:
    """Drops the Trainer's notes that ``quiet_library_notices`` leaves to every other run (its callbacks,
    why fitting stopped); keeps everything else Lightning logs at INFO, such as each run's results table
    (``cblight.runs`` prints it through Lightning's rank-zero logger)."""
    notes = ("The following callbacks returned", "`Trainer.fit` stopped")
    return not str(record.getMessage()).lstrip().startswith(notes)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Keep the demo's output to its steps, tables and progress bars: Lightning's start-up notes (devices,
    seeds, tips, callbacks, stops), transformers' weight-loading bars and the warning about calling the CLIs
    from Python go. Everything is put back afterwards (the tests run the demo inside their own process)."""
    # Lightning adds its handlers when first imported: import it, then filter what they print
    import lightning.pytorch  # noqa: F401
    from transformers.utils import logging as hf_logging

    from cblight.cli import quiet_library_notices

    handlers = [
        h for name in ("lightning.pytorch", "lightning.fabric") for h in logging.getLogger(name).handlers
    ]
    bars = hf_logging.is_progress_bar_enabled()
    for handler in handlers:
        handler.addFilter(_not_a_startup_note)
    hf_logging.disable_progress_bar()  # the per-load "Loading weights" bar (a fraction of a second here)
    try:
        with warnings.catch_warnings():  # the warnings filters go afterwards; the tips' filter is harmless
            quiet_library_notices()
            yield
    finally:
        for handler in handlers:
            handler.removeFilter(_not_a_startup_note)
        if bars:
            hf_logging.enable_progress_bar()


DemoModel = Literal["smollm2-135m", "gemma3-270m", "tiny"]


def demo(
    model: DemoModel = "smollm2-135m",
    quick: bool = False,
    output_dir: str | None = None,
    devices: PositiveInt = 1,
) -> None:
    """The paper's whole loop on a real pretrained model, offline: Figure 1, Tables 1, 4, tuning, Table 2.

    Args:
        model: which model to run (``tiny``: a random GPT-2, the plumbing only).
        quick: fewer examples and steps (about 2 minutes).
        output_dir: where every step writes (default ``outputs/demo/<model>``).
        devices: CPU processes (2 runs Lightning DDP with gloo).
    """
    from cblight.contrast import contrast, format_contrast
    from cblight.models import load_causal_lm, load_tokenizer
    from cblight.runs import check_output_dir

    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.setdefault(var, "1")
    out = Path(output_dir or f"outputs/demo/{model}")
    check_output_dir(out, "output_dir")  # before the model: every step writes there
    sizes, start = QUICK if quick else FULL, time.time()
    with _quiet():
        with _step(1, "the model"):
            name = prepare_model(model, out)
        with _step(
            2, "Figure 1: the full context, its last 8 tokens, and the boosted mix (k = 8, alpha = -0.5)"
        ):
            figure1 = contrast(load_causal_lm(name), load_tokenizer(name), FIGURE1_CONTEXT, k=8, alpha=-0.5)
            print(format_contrast(figure1, 8, -0.5))
        with _step(
            3, f"Table 1: LAMBADA, {sizes.lambada} test passages; k* and alpha* chosen on {sizes.lambada} dev"
        ):
            lam = _evaluate(
                name, out / "lambada", sizes.lambada, devices,
                "--model.ks", str(LAMBADA_KS),
                "--model.next_token_alphas", "{start: 0.0, stop: -1.0, step: 0.1}",
                "--data.tasks", "[lambada]",
            )  # fmt: skip
        with _step(
            4, f"Table 4: CommonsenseQA and PIQA, {sizes.choice} questions each, alpha* chosen on others"
        ):
            piqa = REALDATA / "piqa"
            mc = _evaluate(
                name, out / "multiple_choice", sizes.choice, devices,
                "--data.tasks", "[csqa, piqa]",
                # PIQA's training file is not shipped: alpha* is chosen on 200 other validation questions
                "--data.data_files",
                f"{{piqa: {{train: {piqa / 'heldout-valid.jsonl'}, validation: {piqa / 'valid.jsonl'}}}}}",
            )  # fmt: skip
        with _step(
            5, f"coherence tuning: {sizes.tune_steps} steps of {sizes.tune_batch} self-generated sequences"
        ):
            tuned = tune(name, out, sizes, devices)
        with _step(
            6, f"Table 2: WebText continuations of {sizes.prompts} prompts, base vs tuned, plain vs boosted"
        ):
            nucleus = "sampling: {do_sample: true, top_p: 0.95}"
            decodings = (
                f"[{{name: nucleus, {nucleus}}}, {{name: boost k={GEN_K} alpha={GEN_ALPHA}, "
                f"boosting: {{mode: last_k, k: {GEN_K}, alpha: {GEN_ALPHA}}}, {nucleus}}}]"
            )
            gen = _evaluate(
                name, out / "generation", sizes.prompts, devices,
                "--model", "cblight.generate.generation_evaluator.BoostedGenerationEvaluator",
                "--model.decodings", decodings,
                "--model.max_new_tokens", str(sizes.new_tokens),
                "--model.self_bleu_samples", "1000",
                "--model.seed", "1234",
                "--data.tasks", "[webtext]",
                "--data.batch_size", str(sizes.prompts),
                "--compare", f"{{base: {name}, tuned: {tuned}}}",
            )  # fmt: skip
        print("\n[demo] summary" + (" (random model: the numbers mean nothing)" if model == "tiny" else ""))
        print(summary(figure1.target_rank, lam, mc, gen))
        print(
            f"\n[demo] done in {time.time() - start:.0f} s. Results, predictions and plots under {out}/\n"
            "[demo] the same jobs at full size (Hub access or local benchmark files):\n"
            "  cblight evaluate -c configs/lambada.yaml --model.model offline:smollm2-135m\n"
            "  cblight evaluate -c configs/multiple_choice.yaml --model.model offline:smollm2-135m\n"
            f"  cblight contrast --model offline:smollm2-135m --context '{FIGURE1_CONTEXT}'"
        )


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    """``cblight demo [--model M] [--quick] ...`` (the arguments come from ``sys.argv`` unless given)."""
    from jsonargparse import ActionYesNo

    from cblight.parse_errors import Parser
    from cblight.runs import exit_on_bad_input

    parser = Parser(prog=prog, description=demo.__doc__.split("\n")[0])
    parser.add_function_arguments(demo, as_group=False, skip={"quick"})
    parser.add_argument("--quick", action=ActionYesNo, default=False, help="fewer examples and steps (2 min)")
    args = parser.parse_args(argv)
    exit_on_bad_input(lambda: demo(**args.as_dict()))


if __name__ == "__main__":
    main(prog="python -m cblight.demo")
