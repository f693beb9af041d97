"""What happens to a run's files when something goes wrong.

* a cache row edited by hand or torn is detected (checksum, schema and count), reported by file and line,
  and its example recomputed; a cache from before checksums is refused;
* a full disk (``OSError(ENOSPC)`` from the writer) stops the run with one line, and leaves nothing a rerun
  would misread: the rerun gives the clean run's numbers;
* SIGTERM and SIGINT stop a run within seconds, mid-batch, exit non-zero, and leave a consistent cache;
* a second run on the same output directory is refused, naming the first; a stale lock is taken over.

Results are compared to a clean run of the same command: every reported number must be identical, since
the same examples go through the same model on the same CPU.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import cblight.cache as cache_module
import cblight.results as results_module
from cblight.cache import RecordCache
from cblight.cli import evaluate_cli
from tests.helpers import ROOT

DEMO = ROOT / "cblight" / "assets" / "demo_data"
ARGS = [
    "--data.tasks",
    "[copa, lambada]",
    "--data.data_root",
    str(DEMO),
    "--data.batch_size",
    "2",
    "--model.ks",
    "[1, 2]",
    "--model.next_token_alphas",
    "[0.0, -1.0]",
    "--model.plots",
    "false",
    "--trainer.enable_progress_bar",
    "false",
]


def evaluate(model: Path, out: Path, *extra: str) -> dict:
    return evaluate_cli(["--model.model", str(model), "--model.output_dir", str(out), *ARGS, *extra])


def numbers(results: dict) -> dict:
    return {task: (r["report"], r["sweep"]) for task, r in results.items()}


def shards(out: Path) -> list[Path]:
    return sorted((out / "cache").rglob("rank*.jsonl"))


def assert_cache_consistent(out: Path) -> int:
    """Every row of every shard is whole and passes its checksum; returns the row count."""
    rows = 0
    for meta in (out / "cache").rglob("meta.json"):
        cache = RecordCache(meta.parent, json.loads(meta.read_text()))
        cache.signature = json.loads(meta.read_text())
        rows += len(cache.load())
        assert cache.problems == [], cache.problems
    return rows


@pytest.fixture(scope="module")
def clean(tiny_gpt2_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("clean")
    return out, evaluate(tiny_gpt2_dir, out)


# -- case 4: corrupt cache rows ------------------------------------------------------------------------------
def test_edited_and_garbage_cache_rows_are_detected_and_recomputed(clean, tiny_gpt2_dir, tmp_path, caplog):
    out, expected = clean
    again = tmp_path / "again"
    shutil.copytree(out / "cache", again / "cache")
    copa = next(p for p in shards(again) if "copa" in str(p) and "sample" not in str(p))
    lines = copa.read_text().splitlines(keepends=True)
    edited = json.loads(lines[0])
    edited["ll_full"][0] += 5.0  # would flip the prediction, and no one would know
    lines[0] = json.dumps(edited) + "\n"
    copa.write_text("".join(lines))
    lambada = next(p for p in shards(again) if "lambada" in str(p) and "test" in str(p))
    with open(lambada, "a") as fh:
        fh.write('{"id": 3, "garbage\n')
    with caplog.at_level(logging.WARNING, logger="cblight.cache"):
        got = evaluate(tiny_gpt2_dir, again)
    warnings = [r.getMessage() for r in caplog.records if r.name == "cblight.cache"]
    assert any(str(copa) in w and "line 1: checksum mismatch" in w and "recomputed" in w for w in warnings), (
        warnings
    )
    assert any(str(lambada) in w and "not a JSON row" in w for w in warnings), warnings
    assert numbers(got) == numbers(expected)
    assert assert_cache_consistent(again) > 0  # the bad rows are gone, their examples recomputed
    fixed = json.loads(copa.read_text().splitlines()[-1])
    assert fixed["id"] == edited["id"] and fixed["ll_full"][0] == pytest.approx(edited["ll_full"][0] - 5.0)


def test_row_of_the_wrong_shape_is_recomputed(clean, tiny_gpt2_dir, tmp_path):
    """A row whose checksum is right but whose length does not fit the example (a cache copied from a
    run with other data) is never read."""
    out, expected = clean
    again = tmp_path / "again"
    shutil.copytree(out / "cache", again / "cache")
    copa = next(p for p in shards(again) if "copa" in str(p) and "sample" not in str(p))
    row = json.loads(copa.read_text().splitlines()[0])
    for key in ("ll_full", "ll_short", "char_lengths", "n_tokens", "greedy_full"):
        row[key] = row[key][:1]
    row.pop("checksum")
    copa.unlink()
    RecordCache(copa.parent, json.loads((copa.parent / "meta.json").read_text())).append([row])
    assert numbers(evaluate(tiny_gpt2_dir, again)) == numbers(expected)


def test_cache_from_before_checksums_is_refused(clean, tiny_gpt2_dir, tmp_path, capsys):
    out, _ = clean
    old = tmp_path / "old"
    shutil.copytree(out / "cache", old / "cache")
    for meta in (old / "cache").rglob("meta.json"):
        signature = json.loads(meta.read_text())
        signature.pop("cache_format")
        meta.write_text(json.dumps(signature))
    with pytest.raises(SystemExit) as exc:
        evaluate(tiny_gpt2_dir, old)
    assert exc.value.code == 2
    assert "written by an older cblight, without per-row checksums" in capsys.readouterr().err


# -- case 7: disk full ---------------------------------------------------------------------------------------
def _full_disk(monkeypatch, when):
    """Make the writer fail like a full disk: half the bytes written, then ``OSError(ENOSPC)``."""
    real = results_module.write_all
    calls = {"n": 0}

    def write_all(fd: int, data: bytes) -> None:
        calls["n"] += 1
        if when(calls["n"], data):
            os.write(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd, data)

    monkeypatch.setattr(results_module, "write_all", write_all)  # final files
    monkeypatch.setattr(cache_module, "write_all", write_all)  # cache rows


@pytest.mark.parametrize("where", ["cache", "results"])
def test_disk_full_says_so_and_a_rerun_recovers(where, clean, tiny_gpt2_dir, tmp_path, monkeypatch, capsys):
    _, expected = clean
    run = tmp_path / "run"
    if where == "cache":  # the third cache append fails half-way
        _full_disk(monkeypatch, lambda n, data: n == 3 and b'"checksum"' in data)
    else:  # results.json fails
        _full_disk(monkeypatch, lambda n, data: data.startswith(b'{\n  "cblight_version"'))
    with pytest.raises(SystemExit) as exc:
        evaluate(tiny_gpt2_dir, run)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    line = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(line) == 1 and "no space left on device while writing" in line[0], err
    assert not (run / "results.json").exists()
    assert not list(run.rglob("*.tmp")), "a temporary file was left behind"
    assert_cache_consistent(run)  # nothing half-written: every row whole
    monkeypatch.undo()
    assert numbers(evaluate(tiny_gpt2_dir, run)) == numbers(expected)


def test_final_files_are_readable_by_others(tmp_path):
    """A results file gets the mode any new file gets (0644 under umask 022), not mkstemp's private 0600."""
    from cblight.results import atomic_write_json

    old = os.umask(0o022)
    try:
        path = atomic_write_json(tmp_path / "results.json", {"a": 1})
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644


# -- case 11: one run per output directory --------------------------------------------------------------------
def test_second_run_on_the_same_output_dir_is_refused(clean, tiny_gpt2_dir, tmp_path, capsys):
    run = tmp_path / "busy"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from cblight.runs import OutputLock; "
            f"OutputLock({str(run)!r}).acquire(); print('locked', flush=True); time.sleep(120)",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(SystemExit) as exc:
            evaluate(tiny_gpt2_dir, run)
        err = capsys.readouterr().err
        assert exc.value.code == 2
        assert f"is in use by another run (pid {holder.pid} on host" in err, err
        assert not (run / "cache").exists()
    finally:
        holder.kill()  # SIGKILL: its lock stays behind, stale
        holder.wait()
    assert (run / ".cblight.lock").exists()
    _, expected = clean
    assert numbers(evaluate(tiny_gpt2_dir, run)) == numbers(expected)  # the stale lock is taken over
    assert not (run / ".cblight.lock").exists()  # and released at the end


# -- case 10: SIGTERM and SIGINT -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def long_lambada(tmp_path_factory):
    """600 LAMBADA-style passages: long enough that a run is still busy when it is signalled."""
    folder = tmp_path_factory.mktemp("long")
    texts = [json.loads(line)["text"] for line in (DEMO / "lambada" / "test.jsonl").read_text().splitlines()]
    with open(folder / "test.jsonl", "w") as fh:
        for i in range(600):
            fh.write(json.dumps({"text": f"Passage {i}. {texts[i % len(texts)]}"}) + "\n")
    shutil.copy(DEMO / "lambada" / "validation.jsonl", folder / "validation.jsonl")
    return folder


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_stops_the_run_promptly(signum, code, long_lambada, tiny_gpt2_dir, tmp_path):
    out = tmp_path / "sig"
    proc = subprocess.Popen(
        [
            sys.executable,
            "evaluate.py",
            "--model.model",
            str(tiny_gpt2_dir),
            "--model.output_dir",
            str(out),
            "--data.tasks",
            "[lambada]",
            "--data.data_dirs",
            json.dumps({"lambada": str(long_lambada)}),
            "--data.batch_size",
            "8",
            "--trainer.enable_progress_bar",
            "false",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    test_shard = out / "cache" / "lambada" / "test" / "rank0.jsonl"
    try:
        deadline = time.monotonic() + 240
        while not (test_shard.exists() and test_shard.stat().st_size) and proc.poll() is None:
            assert time.monotonic() < deadline, "the run never reached its test loop"
            time.sleep(0.05)
        assert proc.poll() is None, "the run finished before it could be signalled"
        proc.send_signal(signum)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err[-3000:]
    # a batch of 8 passages x 21 forward passes takes well under a second here; 10 s leaves room for a
    # loaded machine and Lightning's teardown
    assert took < 10, took
    name = signal.Signals(signum).name
    assert f"error: stopped by {name}: finished work is kept (an evaluation's cache" in err
    assert "Traceback" not in err
    assert not (out / "results.json").exists()
    rows = assert_cache_consistent(out)
    assert 0 < rows < 600 + 6
    assert not (out / ".cblight.lock").exists()
