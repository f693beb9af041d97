"""Runs lm-evaluation-harness's Hugging Face backend (HFLM) on a request file; used by
bench_scoring_vs_lmeval.py, in a process of its own (so its memory is its own, and so that it can run with
the Python of another environment that has ``lm-eval``).

    python lmeval_runner.py --model-dir DIR --requests REQ.json --out OUT.json \
        [--batch-size 16] [--repeats 3] [--threads 2] [--device cpu] [--memory-only]

Writes the best wall time over the repeats (after a warm-up call), every time and the log-likelihoods;
with ``--memory-only``, the peak memory of one ``loglikelihood`` call instead, as ``benchmarks/common.py``
measures it (on CPU run it with ``memory.child_env()``).
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common, memory  # stdlib-only at import: run in any environment with torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--requests", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--memory-only", action="store_true", help="measure one call's peak memory only")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    pairs = json.loads(Path(args.requests).read_text())
    lm = HFLM(pretrained=args.model_dir, batch_size=args.batch_size, device=args.device, dtype="float32")
    requests = [
        Instance(request_type="loglikelihood", doc={}, arguments=(c, x), idx=i)
        for i, (c, x) in enumerate(pairs)
    ]

    def run():
        return lm.loglikelihood(requests, disable_tqdm=True)

    if args.memory_only:  # a process of its own on CPU, started with memory.child_env()
        common.write_json(args.out, {"peak_bytes": memory.peak_here(run, args.device)})
        return
    common.timed(run, args.device)  # warm-up
    times, out = [], None
    for _ in range(args.repeats):
        seconds, out = common.timed(run, args.device)
        times.append(seconds)
    result = {
        "seconds": min(times),
        "all_seconds": times,
        "loglikelihoods": [float(o[0]) for o in out],
        "lm_eval": __import__("lm_eval").__version__,
    }
    common.write_json(args.out, result)


if __name__ == "__main__":
    main()
