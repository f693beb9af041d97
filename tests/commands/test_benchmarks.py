"""The speed benchmarks (README "Speed") end to end on tiny local models, their JSON, their peak-memory
measurement against known allocation sizes, and their bad-input errors. Timings of tiny models mean
nothing: only the numbers the scripts compute and check are asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

BENCH = ROOT / "benchmarks"


pytestmark = pytest.mark.usefixtures("one_thread")  # the scripts set torch's threads: restored after


def run_script(name: str, *args: str, expect: int = 0) -> subprocess.CompletedProcess:
    """The documented command, as a fresh process (what the peak-memory runs need)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(BENCH / name), *args], capture_output=True, text=True, env=env, cwd=ROOT
    )
    assert proc.returncode == expect, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def run_main(module: str, *args: str, monkeypatch) -> None:
    """The script's entry point in this process (saves a Python start-up per test)."""
    import importlib

    from benchmarks import common

    script = importlib.import_module(f"benchmarks.{module}")
    monkeypatch.setattr(sys, "argv", [str(BENCH / f"{module}.py"), *args])
    common.run_main(script.main)


def check_machine(payload: dict) -> None:
    machine = payload["machine"]
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        name = next(line for line in cpuinfo.read_text().splitlines() if line.startswith("model name"))
        assert machine["cpu"] == name.split(":", 1)[1].strip()
    assert machine["torch_threads"] == 1 and machine["device"] == "cpu"


def test_ltf_delta_script(tiny_gpt2_dir, tmp_path):
    out = tmp_path / "ltf.json"
    docs, tokens = 1, 6
    proc = run_script(
        "bench_ltf_delta.py",
        *("--model", str(tiny_gpt2_dir), "--docs", str(docs), "--tokens", str(tokens)),
        *("--repeats", "1", "--threads", "1", "--json", str(out)),
    )
    assert proc.stdout.startswith("machine: CPU ")
    payload = json.loads(out.read_text())
    check_machine(payload)
    assert payload["model"]["vocab"] == 50257 and payload["settings"]["chunk_size"] == 32
    # the two sides compute the same float32 log-softmax of the same logits, with different batch shapes
    # (so GEMM blocking may differ): last-digit differences on log-probs of size ~10
    assert payload["agreement"]["max_abs_log_prob_diff"] < 1e-4
    assert set(payload["seconds"]) == {"ours", "authors", "ours_2x"}
    assert payload["ratios"]["speedup_vs_authors"] > 0
    # independent reference for the memory measurement: the authors' loop holds a document's window
    # logits [tokens, 20, V] and their log-softmax (as large) at once, float32; RSS pages and the
    # allocator add a little, hence the 0.95 and 1.5 bounds
    window_logits = tokens * 20 * 50257 * 4
    peak = payload["peak_bytes"]
    assert 0.95 * 2 * window_logits < peak["authors"] < 1.5 * 2 * window_logits + 2**25
    assert peak["ours"] < peak["authors"] / 4
    assert payload["ratios"]["peak_memory_authors_vs_ours"] == pytest.approx(peak["authors"] / peak["ours"])


def test_sweep_script(tiny_llama_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "sweep.json"
    run_main(
        "bench_sweep",
        *("--model", str(tiny_llama_dir), "--questions", "6", "--passages", "4", "--ks", "2", "4"),
        *("--threads", "1", "--skip-memory", "--json", str(out)),
        monkeypatch=monkeypatch,
    )
    assert capsys.readouterr().out.startswith("machine: CPU ")
    payload = json.loads(out.read_text())
    check_machine(payload)
    calls = payload["model_calls"]
    assert calls["mc_one"] == calls["mc_grid"] > 0 and calls["nt_one"] == calls["nt_grid"] > 0
    assert payload["settings"]["mc_alphas"] == 701 and payload["peak_bytes"] is None
    assert set(payload["ratios"]) == {"mc_grid_vs_one", "nt_grid_vs_one"}


def test_scoring_script_agrees_with_lmeval(tiny_llama_dir, tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    out = tmp_path / "scoring.json"
    # two questions: the HellaSwag- and COPA-like shapes, which fit the tiny model's 256-token window (the
    # BoolQ-like passage would be cut, and lm-eval and cblight cut differently: lm-eval drops the BOS)
    run_main(
        "bench_scoring_vs_lmeval",
        *("--model", str(tiny_llama_dir), "--questions", "2", "--repeats", "1", "--threads", "1"),
        *("--skip-memory", "--json", str(out)),
        monkeypatch=monkeypatch,
    )
    payload = json.loads(out.read_text())
    # same model, same requests (with BOS: a Llama tokenizer): float32 sums of 5 to 40 per-token log-probs
    # (sums up to ~300 in size) reduced in different batch layouts differ by up to ~4e-5 here
    assert max(payload["agreement"].values()) < 2e-4
    assert payload["settings"]["requests"] == 12 and payload["peak_bytes"] is None


def test_generation_script(tiny_gpt2_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "generation.json"
    run_main(
        "bench_generation",
        *("--model", str(tiny_gpt2_dir), "--new-tokens", "4", "--prompt-len", "8", "--k", "4"),
        *("--batch", "2", "--repeats", "1", "--threads", "1", "--skip-memory", "--json", str(out)),
        monkeypatch=monkeypatch,
    )
    assert "the authors' wrapper" in capsys.readouterr().out
    (run,) = json.loads(out.read_text())["runs"]
    assert set(run["median_seconds"]) == {
        "last_k",
        "plain",
        "windows",
        "authors",
        "response",
        "cfg",
        "plain_dialog",
    }
    assert set(run["ratios"]) >= {
        "last_k_vs_floor",
        "last_k_speedup_vs_authors",
        "response_throughput_vs_cfg",
    }


def test_generation_script_runs_with_its_default_prompt_and_window(tiny_gpt2_dir, tmp_path, monkeypatch):
    """The README's command leaves --prompt-len and --k at their defaults (32 and 32): they must pass the
    script's own argument checks (a stricter check once refused them)."""
    out = tmp_path / "generation.json"
    run_main(
        "bench_generation",
        *("--model", str(tiny_gpt2_dir), "--new-tokens", "2", "--cases", "last_k"),
        *("--batch", "1", "--repeats", "1", "--threads", "1", "--skip-memory", "--json", str(out)),
        monkeypatch=monkeypatch,
    )
    (run,) = json.loads(out.read_text())["runs"]
    assert run["ratios"]["last_k_vs_floor"] > 0


def test_peak_memory_of_a_known_allocation():
    """A side that fills a 64 MiB buffer peaks at 64 MiB. Linux counts RSS per thread and folds the counts
    in lazily (up to 64 pages a thread), and torch's one-time set-up is done before the reading (it added
    8 MiB in one environment and nothing in another): the bounds allow half a MiB below and 4 MiB above."""
    code = (
        "import torch; from benchmarks import memory;"
        "print(memory.peak_here(lambda: torch.ones(16 * 2**20).sum(), 'cpu'))"
    )
    from benchmarks import memory

    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=memory.child_env()
    )
    assert proc.returncode == 0, proc.stderr
    assert 63.5 * 2**20 <= int(proc.stdout) < 68 * 2**20


def test_bad_input(monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_:
        run_main("bench_sweep", "--model", "nope", monkeypatch=monkeypatch)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "unknown model 'nope'" in err and "gpt2-random, smollm2, gemma or a local model directory" in err
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(SystemExit) as exit_:
            run_main("bench_ltf_delta", "--device", "cuda", monkeypatch=monkeypatch)
        assert exit_.value.code == 2
        assert capsys.readouterr().err == (
            "error: --device cuda, but torch.cuda.is_available() is False on this machine\n"
        )


def test_tuning_script(tiny_gpt2_dir, tmp_path):
    """Part 1 (a tuning step against a plain step, split into sampling, teacher and student) and its peak
    memory, the frozen teacher's included: the stale loss attribute it once read would stop it at its first
    step."""
    out = tmp_path / "tuning.json"
    run_script(
        "bench_tuning.py",
        *("--model", str(tiny_gpt2_dir), "--skip-ddp", "--teacher", "frozen", "--batch", "2"),
        *("--prompt", "8", "--new", "6", "--k", "3", "--last-m", "2", "--repeats", "1", "--json", str(out)),
    )
    payload = json.loads(out.read_text())
    for clock in ("wall", "cpu"):
        assert payload["steps"][clock]["ratio_last_m"] > 0 and payload["steps"][clock]["ratio_all"] > 0
    assert set(payload["peak_bytes"]) == {"plain", "last", "all"}


@pytest.mark.distributed
def test_tuning_script_strategies_and_lora(tiny_gpt2_dir, tmp_path):
    """Parts 2 to 4 on 2 processes: DDP and FSDP2 per-process model states (FSDP2's shards are half of
    DDP's whole tensors, rows rounded up: exactly countable), and the LoRA runs' peak RSS."""
    out = tmp_path / "strategies.json"
    run_script(
        "bench_tuning.py",
        *("--model", str(tiny_gpt2_dir), "--skip-steps", "--skip-memory", "--skip-ceiling"),
        *("--strategy", "ddp", "fsdp2", "--lora-rank", "4", "--batch", "2", "--new", "6", "--k", "3"),
        *("--last-m", "2", "--ddp-steps", "1", "--json", str(out)),
    )
    payload = json.loads(out.read_text())
    ddp, fsdp2 = payload["ddp"]["two"]["ranks"], payload["fsdp2"]["ranks"]
    whole = ddp[0]["model_states"]
    assert whole["teacher"] == whole["parameters"] > 0  # the frozen teacher: a whole copy on each process
    for part in ("parameters", "gradients", "optimizer", "teacher"):
        shards = [r["model_states"][part] for r in fsdp2]
        # AdamW's step count, one 4-byte scalar per parameter tensor, is kept whole on every process
        extra = 4 * 64 if part == "optimizer" else 0
        assert whole[part] <= sum(shards) <= whole[part] + extra, part
        assert all(0.45 < s / whole[part] < 0.55 for s in shards), part
    assert 0.45 < payload["sharding"]["model_states_ratio"] < 0.55
    assert payload["lora"]["peak_ratio"] > 0


FIXTURES = ROOT / "tests" / "fixtures"


def test_adaptive_choice_script(tiny_gpt2_dir, tmp_path):
    """Every label-free multiple-choice rule beside base, PMI and alpha*, on the fixtures' questions."""
    out = tmp_path / "choice.json"
    data = [f"{t}={FIXTURES / t}" for t in ("csqa", "sst2")]
    run_script(
        "adaptive_choice.py",
        *("--model", str(tiny_gpt2_dir), "--limit", "2", "--out", str(tmp_path / "runs")),
        *("--data", *data, "--json", str(out)),
    )
    rows = json.loads(out.read_text())["rows"]
    assert {r["task"] for r in rows} == {"csqa", "sst2"} and len(rows) > 4


def test_adaptive_generation_script(tiny_gpt2_dir, tmp_path):
    """Nucleus, fixed boosts and the per-token rules on the fixtures' WebText prompts."""
    out = tmp_path / "generation.json"
    run_script(
        "adaptive_generation.py",
        *("--model", str(tiny_gpt2_dir), "--webtext", str(FIXTURES / "webtext"), "--limit", "2"),
        *("--new", "4", "--k", "2", "--alphas", "-0.1", "--rules", "jsd", "--batch-size", "2"),
        *("--out", str(tmp_path / "runs"), "--json", str(out)),
    )
    assert json.loads(out.read_text())["rows"]


def test_adaptive_next_token_script(tiny_gpt2_dir, tmp_path):
    """The next-token rules on LAMBADA passages: k* and alpha* from the dev passages, reported on test."""
    out = tmp_path / "next_token.json"
    passages = FIXTURES / "lambada" / "test.jsonl"
    run_script(
        "adaptive_next_token.py",
        *("--model", str(tiny_gpt2_dir), "--test", str(passages), "--dev", str(passages), "--limit", "2"),
        *("--ks", "1", "2", "--chunk", "2", "--out", str(tmp_path / "cache"), "--json", str(out)),
    )
    payload = json.loads(out.read_text())
    assert payload["n_test"] == payload["n_dev"] == 2 and payload["rows"]
