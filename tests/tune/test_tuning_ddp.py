"""2-process CPU DDP (gloo) through train.py's CLI with the shipped config against one process on the same
pre-sampled global batch: the averaged gradient and the weights after one step agree, although the two
halves hold different numbers of positions (the KL is normalised by the global count).

It is also the regression test of the step-0 hang: with sample logging on (the config's default, every 8
steps, so at step 0) only rank 0 used to read ``trainer.log_dir``, a collective broadcast that rank 1
never joined. The workers run under a timeout, so a hang fails the test instead of freezing the suite.
"""

import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from cblight.batching import left_pad
from cblight.models import load_causal_lm, load_tokenizer
from cblight.scoring import Encoder
from cblight.tune.loss import sampled_token_mask
from cblight.tune.rollouts import RNG_KEY, RolloutSampler, sample_sequences
from tests.helpers import ROOT

WORKER_TIMEOUT_S = 240  # a healthy run takes ~20 s here; the old code hung forever at step 0


pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.distributed]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_with_the_shipped_config_matches_one_process(tiny_gpt2_dir, tmp_path, monkeypatch):
    from tests.tune.tuning_ddp_worker import run

    model_dir = tmp_path / "model"
    model, tok = load_causal_lm(str(tiny_gpt2_dir)), load_tokenizer(str(tiny_gpt2_dir))
    with torch.no_grad():  # peaked predictions: gradients well above float noise
        model.transformer.wte.weight.mul_(5)
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)

    enc = Encoder(tok)
    prompts = [
        "The quick brown fox jumps over",
        "Hello there",
        "A journey of a thousand",
        "She opened the door",
    ]
    prompts_file = tmp_path / "prompts.txt"
    prompts_file.write_text("\n".join(prompts + ["One more prompt for validation", "And another one"]))
    ids, mask = left_pad([enc.context(p) for p in prompts], tok.pad_token_id, "cpu")
    torch.manual_seed(0)
    sampled = sample_sequences(
        model, ids, mask, max_new_tokens=6, eos_token_id=None, pad_token_id=tok.eos_token_id
    )
    seqs = sampled.sequences.clone()
    seqs[0, sampled.prompt_width + 1] = tok.eos_token_id  # rank 0 holds fewer positions than rank 1
    valid = sampled_token_mask(seqs, sampled.prompt_width, tok.eos_token_id)
    assert valid[:2].sum() < valid[2:].sum()
    batch_file = tmp_path / "batch.pt"
    torch.save(
        {
            "sequences": seqs,
            "attention_mask": sampled.attention_mask,
            "prompt_width": sampled.prompt_width,
            "sampled": valid,
        },
        batch_file,
    )

    port = str(_free_port())
    procs = []
    for rank in range(2):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "WORLD_SIZE": "2",
            "NODE_RANK": "0",
            "LOCAL_RANK": str(rank),
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(ROOT),
        }
        cmd = [sys.executable, str(ROOT / "tests" / "tune" / "tuning_ddp_worker.py")]
        cmd += [str(model_dir), str(batch_file), str(prompts_file), str(tmp_path)]
        procs.append(
            subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        )

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(RolloutSampler, "sample", RolloutSampler.sample)  # run() patches the class
    run(str(model_dir), str(batch_file), str(prompts_file), str(tmp_path), devices=1)
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=WORKER_TIMEOUT_S)
            assert proc.returncode == 0, out.decode()[-3000:]
    finally:
        for proc in procs:
            proc.kill()

    single = torch.load(tmp_path / "world1-rank0.pt")
    ranks = [torch.load(tmp_path / f"world2-rank{r}.pt") for r in range(2)]
    for name, grad in single["grads"].items():
        for r in ranks:
            # DDP averages two half-batch gradients by all-reduce, one process sums the whole batch: float32
            # reduction order differs (~1e-7 relative on gradients ~1e-4..1e-2); one AdamW step then moves
            # weights by amounts whose float32 rounding is ~1e-7 absolute
            assert torch.allclose(r["grads"][name], grad, atol=1e-7, rtol=1e-4), name
            assert torch.allclose(r["weights"][name], single["weights"][name], atol=1e-7, rtol=1e-5), name
    assert max(g.abs().max().item() for g in single["grads"].values()) > 1e-4

    # The checkpoint holds each process's own sampling state (seeded seed + rank, so they differ).
    rng = torch.load(tmp_path / "world2.ckpt", weights_only=True)[RNG_KEY]
    assert rng["world_size"] == 2 and len(rng["cpu"]) == 2
    assert not torch.equal(rng["cpu"][0], rng["cpu"][1])

    # Sample logging ran at step 0 (rank 0 writes), the export landed under default_root_dir, and
    # nothing was written to the working directory's outputs/.
    (samples,) = (tmp_path / "world2").glob("**/samples.jsonl")
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    assert rows and {r["step"] for r in rows} == {0}
    assert (tmp_path / "world2" / "outputs" / "tuning" / "gpt2-large" / "hf" / "config.json").exists()
    assert not (tmp_path / "outputs").exists()
