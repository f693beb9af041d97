"""Runs lm-evaluation-harness's Hugging Face backend on a request file; used by bench_scoring_vs_lmeval.py.

Executed with the Python of a separate environment that has ``lm-eval`` installed:
    python lmeval_runner.py MODEL_DIR REQUESTS.json OUT.json BATCH_SIZE REPEATS THREADS
"""

import json
import sys
import time
from pathlib import Path


def main() -> None:
    model_dir, req_path, out_path, batch_size, repeats, threads = sys.argv[1:7]
    import torch

    torch.set_num_threads(int(threads))
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    pairs = json.loads(Path(req_path).read_text())
    lm = HFLM(pretrained=model_dir, batch_size=int(batch_size), device="cpu", dtype="float32")
    requests = [
        Instance(request_type="loglikelihood", doc={}, arguments=(c, x), idx=i)
        for i, (c, x) in enumerate(pairs)
    ]
    times = []
    for _ in range(int(repeats)):
        start = time.perf_counter()
        out = lm.loglikelihood(requests, disable_tqdm=True)
        times.append(time.perf_counter() - start)
    result = {"seconds": min(times), "all_seconds": times, "loglikelihoods": [float(o[0]) for o in out]}
    Path(out_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
