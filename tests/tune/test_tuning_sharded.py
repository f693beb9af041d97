"""Sharded coherence tuning (FSDP2 through Lightning's ModelParallelStrategy, ``-c configs/fsdp.yaml``) on 2
CPU processes (gloo), against one process and DDP: the same losses, gradient norms and exports on one
pre-sampled global batch, each process holding half of the student and of the teacher; a plain rerun of an
interrupted sharded run resumes from its distributed checkpoint; the 2-node torchrun launch finishes with
the same export; ``cblight evaluate`` and ``cblight generate`` under the overlay write one process's results.

The ``distributed`` tier (``bash scripts/test.sh`` runs it after the tiny suite): every process runs under a
timeout, so a hang (the processes making different collective calls) fails instead of freezing the suite.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cblight.batching import left_pad
from cblight.models import load_causal_lm, load_tokenizer
from cblight.scoring import Encoder
from cblight.tune.loss import sampled_token_mask
from cblight.tune.rollouts import sample_sequences
from tests.helpers import ROOT

TIMEOUT_S = 300  # a healthy 2-process run takes 20-40 s on 2 idle cores; a hang never ends
PROMPTS = [
    "The quick brown fox jumps over the lazy dog",
    "A journey of a thousand miles begins with a single",
    "Question: what is the capital of France? Answer:",
    "She opened the door because the bell rang and",
    "Title: Markets rally. Summary: Stocks rose on",
    "This quote has a tone that is very much",
]

pytestmark = [pytest.mark.distributed, pytest.mark.usefixtures("one_thread")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **extra}


def _ranks(cmd: list[str], cwd: Path, world: int = 2) -> list[subprocess.Popen]:
    """``world`` processes of one command, started as a launcher would (Lightning reads the variables)."""
    port = str(_free_port())
    return [
        subprocess.Popen(
            cmd,
            env=_env(
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
                WORLD_SIZE=str(world),
                NODE_RANK="0",
                LOCAL_RANK=str(rank),
            ),
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for rank in range(world)
    ]


def _wait(procs: list[subprocess.Popen], timeout: float = TIMEOUT_S) -> list[str]:
    outs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=timeout)
            outs.append(out.decode(errors="replace"))
            assert proc.returncode == 0, outs[-1][-4000:]
    finally:
        for proc in procs:
            proc.kill()
    return outs


@pytest.fixture(scope="module")
def peaky_model(tmp_path_factory, tiny_gpt2_dir) -> Path:
    """The tiny GPT-2 with peaked predictions (gradients well above float noise)."""
    out = tmp_path_factory.mktemp("models") / "peaky"
    model, tok = load_causal_lm(str(tiny_gpt2_dir)), load_tokenizer(str(tiny_gpt2_dir))
    with torch.no_grad():
        model.transformer.wte.weight.mul_(5)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _presample(model_dir: Path, out: Path) -> Path:
    """A global batch of 4 samples in which rank 0's half holds fewer positions than rank 1's (an early EOS),
    so the processes' chunks and windows differ in number."""
    model, tok = load_causal_lm(str(model_dir)), load_tokenizer(str(model_dir))
    ids, mask = left_pad([Encoder(tok).context(p) for p in PROMPTS[:4]], tok.pad_token_id, "cpu")
    torch.manual_seed(0)
    sampled = sample_sequences(
        model, ids, mask, max_new_tokens=6, eos_token_id=None, pad_token_id=tok.eos_token_id
    )
    seqs = sampled.sequences.clone()
    seqs[0, sampled.prompt_width + 1] = tok.eos_token_id
    valid = sampled_token_mask(seqs, sampled.prompt_width, tok.eos_token_id)
    assert valid[:2].sum() < valid[2:].sum()
    path = out / "batch.pt"
    batch = {
        "sequences": seqs,
        "attention_mask": sampled.attention_mask,
        "prompt_width": sampled.prompt_width,
    }
    torch.save({**batch, "sampled": valid}, path)
    return path


def _adam_atol(lr: float, steps: int = 3) -> float:
    """How far apart two runs' weights may be after ``steps`` Adam steps at rate ``lr`` whose gradients
    differ only by float32 summation order (~1e-6 relative): Adam moves each weight by about ``lr`` a step,
    ``lr * g / (|g| + eps)`` per component, which amplifies the reordering where ``|g|`` is near ``eps``
    (measured: 2.4e-6 after 3 steps at 1e-2 on the tiny Llama, 8e-5 of one step). A thousandth of a step
    per step, far below what one step moves."""
    return steps * lr * 1e-3


def _export(run: Path) -> dict[str, torch.Tensor]:
    (weights,) = run.glob("**/export/model.safetensors")
    return load_file(weights)


def _runs(
    model_dir: Path, tmp_path: Path, monkeypatch, *extra: str, strategies: tuple[str, ...] = ("ddp", "fsdp2")
) -> dict[str, list[dict]]:
    """One process (here) and 2-process ``strategies`` (subprocesses, at the same time) on the same batch."""
    from tests.tune.sharded_tuning_worker import run
    from tests.tune.tuning_ddp_worker import RolloutSampler

    batch = _presample(model_dir, tmp_path)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    worker = [sys.executable, str(ROOT / "tests" / "tune" / "sharded_tuning_worker.py")]
    common = [str(model_dir), str(batch), str(prompts), str(tmp_path), *extra]
    procs = {s: _ranks([*worker, s, *common], tmp_path) for s in strategies}
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(RolloutSampler, "sample", RolloutSampler.sample)  # run() patches the class
    run("one", *common)
    for group in procs.values():
        _wait(group)
    return {
        s: [torch.load(tmp_path / f"{s}-rank{r}.pt") for r in range(1 if s == "one" else 2)]
        for s in ("one", *strategies)
    }


def test_fsdp2_ddp_and_one_process_agree(peaky_model, tmp_path, monkeypatch):
    """The shipped config (frozen teacher, collapse guard, gradient clipping, AdamW) for 3 steps, clipping
    active (``gradient_clip_val`` below the norm, so the clipped update depends on the norm over every shard)
    and loss chunks of 4 positions and 2 windows per pass (the processes' numbers of teacher calls differ)."""
    extra = ["--trainer.gradient_clip_val", "0.01", "--model.loss.chunk_size", "4"]
    extra += ["--model.loss.window_chunk_size", "2", "--model.optimizer.lr", "1e-3"]
    runs = _runs(peaky_model, tmp_path, monkeypatch, *extra)
    one = runs["one"][0]
    assert min(one["grad_norm"]) > 0.01  # clipping acted at every step
    assert len(one["loss"]) == 3 and len(set(one["loss"])) == 3  # the steps moved the model
    for strategy in ("ddp", "fsdp2"):
        for rank in runs[strategy]:
            # every process logs the global objective: sums over all positions in one float64 all-reduce;
            # the processes' float32 forwards run on 2 rows instead of 4 (other matmul blockings): ~1e-7
            # relative per step, compounded by 3 steps of Adam at lr 1e-3 on weights of ~0.1: below 1e-4
            assert rank["loss"] == pytest.approx(one["loss"], rel=1e-4), strategy
            assert rank["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4), strategy
    # each FSDP2 process holds half of the student and of the frozen teacher (rows of dim 0, rounded up)
    shards = runs["fsdp2"]
    for key in ("student", "teacher"):
        total = shards[0][f"{key}_total"]
        assert total > 0 and shards[0][f"{key}_local"] + shards[1][f"{key}_local"] == total, key
        assert all(0.45 < r[f"{key}_local"] / total < 0.55 for r in shards), key
    assert runs["ddp"][0]["student_local"] == runs["ddp"][0]["student_total"]  # DDP: whole on each
    exports = {s: _export(tmp_path / s) for s in ("one", "ddp", "fsdp2")}
    assert set(exports["fsdp2"]) == set(exports["one"])  # the same tensors (a tied one written once)
    for name, weight in exports["one"].items():
        for strategy in ("ddp", "fsdp2"):
            assert torch.allclose(exports[strategy][name], weight, atol=_adam_atol(1e-3), rtol=0), (
                strategy,
                name,
            )
    assert any(
        not torch.equal(exports["one"][n], w) for n, w in load_file(peaky_model / "model.safetensors").items()
    )


def test_fsdp2_ema_teacher_and_trust_region_on_llama(tiny_llama_dir, tmp_path, monkeypatch):
    """Rotary positions (computed buffers), BOS, untied output layer; the EMA teacher (sharded, updated on
    each process's shards) with a trust region to the initial model (a third sharded model): one process
    and FSDP2 agree step by step, and on the export."""
    extra = ["--model.teacher.kind", "ema", "--model.teacher.ema_decay", "0.5"]
    extra += ["--model.teacher.trust_region", "0.5", "--model.loss.chunk_size", "4"]
    extra += ["--model.loss.window_chunk_size", "2", "--model.optimizer.lr", "1e-2"]
    runs = _runs(tiny_llama_dir, tmp_path, monkeypatch, *extra, strategies=("fsdp2",))
    one = runs["one"][0]
    assert len(set(one["loss"])) == 3
    for rank in runs["fsdp2"]:
        # as in test_fsdp2_ddp_and_one_process_agree, at a 10x larger rate
        assert rank["loss"] == pytest.approx(one["loss"], rel=1e-4)
        assert rank["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)
        # the EMA and the initial model, each half on each process
        assert rank["teacher_total"] == 2 * rank["student_total"]
        assert 0.45 < rank["teacher_local"] / rank["teacher_total"] < 0.55
    exports = {s: _export(tmp_path / s) for s in ("one", "fsdp2")}
    for name, weight in exports["one"].items():
        assert torch.allclose(exports["fsdp2"][name], weight, atol=_adam_atol(1e-2), rtol=0), name


# ---------------------------------------------------------------------------------------------------------
# Whole runs through the command, sampling included (transformers' generate with synced steps)

CONFIG = str(ROOT / "configs" / "coherence_tuning.yaml")
FSDP = str(ROOT / "configs" / "fsdp.yaml")


def _tune(model_dir: Path, prompts: Path, *extra: str) -> list[str]:
    """The shipped config under the FSDP2 overlay on the tiny model with the EMA teacher (its shards travel in
    the checkpoints), 6 steps of 2 sequences per process, a checkpoint every 2 steps, validation (and the
    collapse guard) at step 4."""
    return [
        "tune", "-c", CONFIG, "-c", FSDP, "--trainer.accelerator", "cpu",
        "--model.model", str(model_dir), "--model.boosting.k", "3", "--model.boosting.alpha", "-0.5",
        "--model.max_new_tokens", "6", "--model.export.dir", "export",
        "--model.validation.log_samples_every_n_steps", "1", "--model.teacher.kind", "ema",
        "--data.task", "null", "--data.prompts_file", str(prompts), "--data.batch_size", "2",
        "--data.val_size", "2", "--trainer.max_steps", "6", "--trainer.val_check_interval", "4",
        "--trainer.callbacks.every_n_train_steps", "2", "--trainer.enable_progress_bar", "false",
        *extra,
    ]  # fmt: skip


def _steps_logged(root: Path) -> set[int]:
    return {
        json.loads(line)["step"] for f in root.glob("**/samples.jsonl") for line in f.read_text().splitlines()
    }


def test_interrupted_fsdp2_run_resumes_and_the_two_node_launch_matches(peaky_model, tmp_path):
    """A run on 2 processes of one node, stopped by Ctrl-C at step 2 or later: its checkpoint is a directory
    of shards; the same command typed again resumes from it and exports. The same run launched as 2 nodes of
    1 process by torchrun (one launch per node, as on a cluster) finishes in one go: the two exports are the
    same weights (the same global ranks draw the same samples), and load with from_pretrained."""
    from transformers import AutoModelForCausalLM

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS * 2) + "\n")
    one_node, two_nodes = tmp_path / "one_node", tmp_path / "two_nodes"
    one_node.mkdir(), two_nodes.mkdir()
    cmd = [sys.executable, "-m", "cblight", *_tune(peaky_model, prompts, "--trainer.devices", "2")]

    # the 2-node launch runs beside the first run: two torchrun agents, node ranks 0 and 1, on one machine
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1"]
    torchrun += ["--master_addr", "127.0.0.1", "--master_port", str(_free_port())]
    per_node = _tune(peaky_model, prompts, "--trainer.num_nodes", "2", "--trainer.devices", "1")
    agents = [
        subprocess.Popen(
            [*torchrun, "--node_rank", str(node), "-m", "cblight", *per_node],
            env=_env(),
            cwd=two_nodes,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for node in (0, 1)
    ]
    first = subprocess.Popen(cmd, env=_env(), cwd=one_node, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not {0, 1} <= _steps_logged(one_node):
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()[0][-4000:]
            time.sleep(0.2)
        first.send_signal(signal.SIGINT)
        out = first.communicate(timeout=TIMEOUT_S)[0].decode(errors="replace")
    finally:
        first.kill()
    assert first.returncode == 130, out[-4000:]
    (ckpt,) = one_node.glob("**/version_0/checkpoints/last.ckpt")
    assert ckpt.is_dir() and len(list(ckpt.glob("*.distcp"))) == 2 and (ckpt / "meta.pt").is_file()
    stopped = torch.load(ckpt / "meta.pt", weights_only=True)["global_step"]
    assert 2 <= stopped < 6 and not (one_node / "export").exists()

    again = subprocess.run(cmd, env=_env(), cwd=one_node, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert again.returncode == 0, again.stderr[-4000:]
    assert f"resuming this command's interrupted run from step {stopped}" in again.stderr
    assert min(_steps_logged(one_node / "outputs" / "coherence_tuning" / "version_1")) == stopped

    _wait(agents)
    resumed, launched = _export(one_node), _export(two_nodes)
    assert set(resumed) == set(launched)
    for name, weight in launched.items():
        # the same float32 computations in the same order on the same global ranks: identical weights
        assert torch.equal(resumed[name], weight), name
    base = load_file(peaky_model / "model.safetensors")
    assert any(not torch.equal(base[n], w) for n, w in launched.items())  # it did train
    model = AutoModelForCausalLM.from_pretrained(one_node / "export")
    assert sum(p.numel() for p in model.parameters()) == sum(w.numel() for w in base.values())

    # the finished run's last checkpoint, consolidated into one file, loads in one process (EMA included)
    from cblight.sharding import consolidate_checkpoint
    from cblight.tune.coherence_tuning import CoherenceTuning

    (final,) = one_node.glob("**/version_1/checkpoints/last.ckpt")
    module = CoherenceTuning.load_from_checkpoint(consolidate_checkpoint(final))
    ema = dict(module.teacher.model.named_parameters())
    student = dict(module.model.named_parameters())
    assert any(not torch.equal(ema[n], w) for n, w in student.items())  # the EMA lags the student
    assert any(not torch.equal(ema[n], base[n]) for n in base)  # and has left the initial weights
    module.export_pretrained(tmp_path / "consolidated")
    again = load_file(tmp_path / "consolidated" / "model.safetensors")
    assert set(again) == set(resumed) and all(torch.equal(again[n], w) for n, w in resumed.items())


# ---------------------------------------------------------------------------------------------------------
# Evaluation and generation with the model sharded over the processes

DEMO = ROOT / "cblight" / "assets" / "demo_data"
FIXTURES = ROOT / "tests" / "fixtures"


def _results(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())["tasks"]


def _evaluate_one_and_sharded(args: list[str], tmp_path: Path) -> tuple[Path, Path]:
    """``evaluate.py ARGS`` in one process and under ``-c configs/fsdp.yaml`` on 2 processes, at once."""
    one, sharded = tmp_path / "one", tmp_path / "sharded"
    base = [sys.executable, "evaluate.py", *args, "--trainer.accelerator", "cpu"]
    base += ["--trainer.enable_progress_bar", "false"]
    procs = [
        subprocess.Popen([*base, "--model.output_dir", str(one)], env=_env(), cwd=ROOT),
        subprocess.Popen(
            [*base, "-c", FSDP, "--trainer.devices", "2", "--model.output_dir", str(sharded)],
            env=_env(),
            cwd=ROOT,
        ),
    ]
    for proc in procs:
        try:
            assert proc.wait(timeout=TIMEOUT_S) == 0
        finally:
            proc.kill()
    return one, sharded


def test_sharded_evaluate_writes_one_process_results(tiny_llama_dir, tmp_path):
    """Multiple choice (a shared context's KV cache, two passes per question) and next-token prediction
    (a full pass and k-token windows), the processes holding different numbers of uncached examples."""
    args = [
        "--model.model",
        str(tiny_llama_dir),
        "--data.tasks",
        "[copa, lambada]",
        "--data.data_root",
        str(DEMO),
    ]
    args += ["--data.limit", "5", "--model.ks", "[1, 2, 3]", "--model.choice_alphas", "[0.0, -0.5, -1.0]"]
    args += ["--model.plots", "false", "--model.batch_size", "2"]
    one, sharded = _evaluate_one_and_sharded(args, tmp_path)
    got, want = _results(sharded), _results(one)
    assert set(got) == set(want) == {"copa", "lambada"}
    for task in want:
        for part in ("selection", "report"):
            for key, value in want[task][part].items():
                if isinstance(value, float):
                    # the sharded forward is the whole model's, gathered; float32 sums of another blocking:
                    # log-likelihoods agree to ~1e-6, the accuracies and the chosen alpha/k exactly
                    assert got[task][part][key] == pytest.approx(value, rel=1e-5, abs=1e-6), (task, part, key)
                else:
                    assert got[task][part][key] == value, (task, part, key)
    assert len(list((sharded / "cache" / "copa").glob("*/rank*.jsonl"))) == 4  # both processes scored


def test_sharded_boosted_generation_matches_one_process(tiny_gpt2_dir, tmp_path):
    """Greedy, nucleus and boosted (last-k, dialog response) decoding, one prompt per process per batch: the
    processes stop at different steps (EOS) and pad with 1-token forwards until the longest is done."""
    dirs = {t: str(FIXTURES / t) for t in ("webtext", "dstc7")}
    decodings = [{"name": "greedy"}, {"name": "nucleus", "sampling": {"do_sample": True, "top_p": 0.9}}]
    args = ["--model", "BoostedGenerationEvaluator", "--model.model", str(tiny_gpt2_dir)]
    args += ["--model.max_new_tokens", "10", "--model.self_bleu_samples", "null"]
    args += [
        "--model.decodings",
        json.dumps(decodings),
        "--model.grid.ks",
        "[3]",
        "--model.grid.alphas",
        "[-0.5]",
    ]
    args += [
        "--data.tasks",
        "[webtext, dstc7]",
        "--data.data_dirs",
        json.dumps(dirs),
        "--data.batch_size",
        "1",
    ]
    one, sharded = _evaluate_one_and_sharded(args, tmp_path)
    got, want = _results(sharded), _results(one)
    for task in ("webtext", "dstc7"):
        slugs = sorted(p.stem for p in (one / "generations" / task).glob("*.jsonl"))
        assert len(slugs) >= 3
        for slug in slugs:
            texts = {
                json.loads(x)["id"]: json.loads(x)["text"]
                for x in (one / "generations" / task / f"{slug}.jsonl").read_text().splitlines()
            }
            mine = {
                json.loads(x)["id"]: json.loads(x)["text"]
                for x in (sharded / "generations" / task / f"{slug}.jsonl").read_text().splitlines()
            }
            assert mine == texts, (task, slug)
        # the same generations scored by the same model: metric sums in another order, ~1e-7 relative
        for row, values in want[task]["rows"].items():
            assert got[task]["rows"][row] == pytest.approx(values, rel=1e-5), (task, row)
