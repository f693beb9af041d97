"""The offline demo: boosted evaluation end to end with no downloads.

It builds a tiny random GPT-2 (2 layers, 32 wide, the real GPT-2 tokenizer bundled with cblight), evaluates
it on the bundled sample data (LAMBADA as in Table 1, COPA as in Table 4: alpha* chosen on the selection
split, then reported with the accuracy-vs-alpha sweep), and prints the Figure-1 contrast. The numbers come
from a random model and mean nothing; the pipeline, files and table are the real ones.

    python -m cblight.demo [--output_dir outputs/demo]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from cblight.tiny import build_tiny_gpt2

DEMO_DATA = Path(__file__).parent / "assets" / "demo_data"
FIGURE1_CONTEXT = ' Ballad metre is "less regular and more conversational" than common metre'


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--output_dir", default="outputs/demo", help="where the model and the results go")
    parser.add_argument(
        "--devices", type=int, default=1, help="CPU processes (2 runs Lightning DDP with gloo)"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

    from cblight.cli import evaluate_cli
    from cblight.contrast import contrast, format_contrast
    from cblight.models import load_causal_lm, load_tokenizer

    start = time.time()
    out = Path(args.output_dir)
    model_dir = out / "tiny-gpt2"
    if not (model_dir / "config.json").exists():
        build_tiny_gpt2(model_dir, n_positions=1024)
    print(f"[demo] tiny random GPT-2 at {model_dir} (no downloads; its numbers mean nothing)")

    lm = load_causal_lm(str(model_dir))
    tok = load_tokenizer(str(model_dir))
    print("\n[demo] Figure 1 contrast (k = 8, alpha = -0.5):\n")
    print(format_contrast(contrast(lm, tok, FIGURE1_CONTEXT, k=8, alpha=-0.5), 8, -0.5))

    print("\n[demo] boosted evaluation: LAMBADA (Table 1) and COPA (Table 4) on the bundled sample data\n")
    evaluate_cli(
        [
            "--model.model",
            str(model_dir),
            "--model.output_dir",
            str(out / "eval"),
            "--data.tasks",
            "[lambada, copa]",
            "--data.data_root",
            str(DEMO_DATA),
            "--trainer.accelerator",
            "cpu",
            "--trainer.devices",
            str(args.devices),
            *(["--trainer.strategy", "ddp"] if args.devices > 1 else []),
        ]
    )
    print(
        f"\n[demo] done in {time.time() - start:.0f} s. Files: {out / 'eval'}/results.json, predictions/, plots/.\n"
        "[demo] The same jobs on GPT-2 with Hub access:\n"
        "  python evaluate.py -c configs/lambada.yaml\n"
        "  python evaluate.py -c configs/multiple_choice.yaml --model.model gpt2 --data.tasks [copa]\n"
        f"  python -m cblight.contrast --model gpt2 --context '{FIGURE1_CONTEXT}'"
    )


if __name__ == "__main__":
    main()
