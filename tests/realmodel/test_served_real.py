"""The served backend against a real server process: llama-cpp-python's OpenAI-compatible server, started
here on 127.0.0.1 (a free port) and stopped here, serving the Gemma-3-270m GGUF that ``offline:gemma3-270m``
dequantises for transformers, so both sides run the same weights.

* per-token prompt log-probs of every request against the local model on the same tokens, within
  ``TOKEN_TOL``; the continuation sums within ``TOKEN_TOL`` per token; identical predictions wherever the
  local margin exceeds the possible error;
* the Table 11 config end to end (``cblight evaluate --model.backend openai``), resumed from the request cache
  without asking the server again;
* the bad inputs of the issue on a real server: a model name it does not serve, an empty context after BOS
  (no log-prob), a server started without prompt log-probs (``logits_all`` off), and llama-cpp-python's
  misaligned echo with a model without BOS (SmolLM2), which the canary refuses.

llama-cpp-python computes every top-logprob list by sorting the whole vocabulary in Python (262144 entries
for Gemma), about half a second per prompt token on a loaded 2-core machine, so the runs here are a few
short CommonsenseQA questions. Real-model tier: ``pytest -m realmodel tests/realmodel``.
"""

from __future__ import annotations

import contextlib
import json
import platform
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.realmodel
pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: pip install 'cblight[serve]'")

import torch  # noqa: E402

from cblight.cli import evaluate_cli  # noqa: E402
from cblight.scoring import Encoder  # noqa: E402
from cblight.served import CompletionClient, RequestCache, ServedModelError, ServedScorer, ServerOptions  # noqa: E402
from tests.server_process import ServerProcess, free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
REALDATA = ROOT / "cblight" / "assets" / "realdata"
QUIET = ["--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false", "--model.plots", "false"]
# Per-token log-prob difference between llama.cpp (Q4_K_M weights times 8-bit quantised activations) and
# transformers (the same weights dequantised to float32, float32 activations). Measured on the shipped
# CommonsenseQA prompts (3 questions, 30 requests, 342 tokens): max 0.54, mean 0.11, 95th percentile 0.30
# nats, signed mean -0.01 (noise, no bias; tokens above log-prob -1 agree to 0.015). A misread row or a
# wrong boundary moves most log-probs by nats, which both bounds below catch; the max bound leaves ~2x room
# for other CPUs' llama.cpp kernels.
TOKEN_TOL = 1.0
MEAN_TOL = 0.25
LIMIT = 2  # CommonsenseQA questions (5 answers each, full and premise-free contexts: 20 requests)


def host_specific_kernels() -> list[str]:
    """What the installed llama.cpp CPU backend holds beyond the portable x86-64 AVX2 build that
    ``scripts/setup.sh`` makes (docs/served.md): the AVX-512 and AMX features its banner reports, and
    AVX-512 (``zmm``) or AMX (``tileloadd``, ``tdpb*``) instructions in ``libggml-cpu`` when ``objdump``
    is there to read it. Empty for a portable build."""
    import llama_cpp

    banner = llama_cpp.llama_print_system_info().decode()
    found = [f for f in re.findall(r"(\w+) = 1", banner) if f.startswith(("AVX512", "AMX"))]
    if platform.machine() == "x86_64" and "AVX2" not in re.findall(r"(\w+) = 1", banner):
        found.append("no AVX2 (not the build scripts/setup.sh makes)")
    objdump = shutil.which("objdump")
    for lib in (Path(llama_cpp.__file__).parent / "lib").glob("libggml-cpu*.so*"):
        if objdump and platform.machine() == "x86_64":
            code = subprocess.run(
                [objdump, "-d", "--no-show-raw-insn", str(lib)], capture_output=True, text=True
            )
            if "%zmm" in code.stdout:
                found.append(f"AVX-512 instructions in {lib.name}")
            if re.search(r"\s(tileloadd|tdpb\w+)\s", code.stdout):
                found.append(f"AMX instructions in {lib.name}")
    return found


def test_the_llama_cpp_build_runs_on_every_ci_machine():
    """Natively built llama.cpp died on Intel Xeons with AMX (general protection fault in libggml-cpu.so);
    the test server must be the portable build, whatever CPU built it."""
    assert host_specific_kernels() == []


@contextlib.contextmanager
def llama_server(gguf: Path, alias: str, log: Path, *extra: str) -> Iterator[ServerProcess]:
    """``python -m llama_cpp.server`` on a free local port (its URL: ``.url``), stopped afterwards."""
    if found := host_specific_kernels():
        pytest.fail(
            f"llama-cpp-python is a host-specific build ({', '.join(found)}): run bash scripts/setup.sh"
        )
    port = free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", alias]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--n_ctx", "512", "--n_threads", "2", *extra]
    with ServerProcess("llama.cpp server", cmd, port, log).running() as server:
        yield server


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory) -> dict[str, Path]:
    from cblight.zoo import gguf_file

    work = tmp_path_factory.mktemp("gguf")
    return {name: gguf_file(name, work) for name in ("gemma3-270m", "smollm2-135m")}


@pytest.fixture(scope="module")
def gemma_process(ggufs, tmp_path_factory) -> Iterator[ServerProcess]:
    with llama_server(
        ggufs["gemma3-270m"], "gemma3-270m", tmp_path_factory.mktemp("logs") / "gemma.log"
    ) as server:
        yield server


@pytest.fixture
def gemma_server(gemma_process) -> Iterator[str]:
    """The server's URL for one test; a server that died before or during the test is reported as such."""
    gemma_process.alive()
    with gemma_process.watch():
        yield gemma_process.url


def readme_served_command() -> list[str]:
    """docs/evaluate.md's ``cblight evaluate`` command for a served model (its vLLM example)."""
    text = (ROOT / "docs" / "evaluate.md").read_text()  # holds the README's former served-model section
    lines = [
        x for x in text.splitlines() if x.startswith("cblight evaluate") and "--model.server.base_url" in x
    ]
    assert len(lines) == 1, lines
    return shlex.split(lines[0])[2:]


def served_args(url: str, out: Path, *extra: str) -> list[str]:
    """docs/evaluate.md's served command with the local server, its model name and no Hub tokenizer, on
    ``LIMIT`` shipped CommonsenseQA questions."""
    args = readme_served_command()
    for option, value in (
        ("--model.model", "gemma3-270m"),
        ("--model.tokenizer", "null"),
        ("--model.server.base_url", url),
    ):
        args[args.index(option) + 1] = value
    return [
        *args,
        "--model.server.concurrency", "1",  # llama-cpp-python answers one request at a time
        "--model.server.timeout", "900",  # a queued request waits for those before it on a loaded machine
        "--data.tasks", "[csqa]",
        "--data.data_dirs", json.dumps({"csqa": str(REALDATA / "csqa")}),
        "--data.limit", str(LIMIT),
        "--data.selection", "false",
        "--model.choice_alphas", "[0.0, -0.5, -1.0]",
        "--model.output_dir", str(out),
        *QUIET,
        *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def served_run(gemma_process, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("served")
    gemma_process.alive()
    with gemma_process.watch():
        evaluate_cli(served_args(gemma_process.url, out))
    return out


@pytest.fixture(scope="module")
def local_gemma():
    from cblight.models import load_causal_lm, load_tokenizer

    return load_causal_lm("offline:gemma3-270m").eval(), load_tokenizer("offline:gemma3-270m")


def predictions(out: Path) -> dict[int, dict]:
    lines = (out / "predictions" / "csqa.validation.jsonl").read_text().splitlines()
    return {r["id"]: r for r in map(json.loads, lines)}


def test_served_log_probs_match_the_local_model(served_run, local_gemma, tmp_path, capsys):
    model, tok = local_gemma
    diffs: list[float] = []
    echoed = [
        (req, ans) for req, ans in RequestCache(served_run / "requests.sqlite").items() if req.get("echo")
    ]
    assert len(echoed) == LIMIT * 5 * 2  # every answer after the full and the premise-free context
    for request, answer in echoed:
        lp = answer["choices"][0]["logprobs"]
        n_prompt = len(lp["tokens"]) - answer["usage"]["completion_tokens"]
        ids = tok(request["prompt"], add_special_tokens=True)["input_ids"]
        assert ids[0] == tok.bos_token_id
        # the server tokenised the prompt as the local tokenizer does (its echo skips BOS)
        assert lp["tokens"][:n_prompt] == [tok.decode([i]) for i in ids[1:]], request["prompt"]
        with torch.no_grad():
            local = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
        assert lp["token_logprobs"][0] is None  # llama-cpp-python: none for the token after BOS
        for j in range(1, n_prompt):  # server token j is ids[j + 1], predicted from row j
            diffs.append(abs(lp["token_logprobs"][j] - float(local[j, ids[j + 1]])))
    with capsys.disabled():
        print(
            f"\nserved vs local per-token log-probs: {len(diffs)} tokens, max |diff| {max(diffs):.4f}, mean {sum(diffs) / len(diffs):.4f}"
        )
    assert max(diffs) < TOKEN_TOL and sum(diffs) / len(diffs) < MEAN_TOL

    # the same questions through the local backend: sums per answer, and the predictions
    local_out = tmp_path / "local"
    evaluate_cli(
        [
            *served_args("http://unused/v1", local_out),
            "--model.model", "offline:gemma3-270m",
            "--model.backend", "local",
            "--model.server", "null",
        ]
    )  # fmt: skip
    served, local_rows = predictions(served_run), predictions(local_out)
    assert served.keys() == local_rows.keys() and len(served) == LIMIT
    enc = Encoder(tok)
    worst = 0.0  # the largest served-vs-local difference of one answer's log-likelihood
    for idx, row in local_rows.items():
        contexts = {"ll_full": row["context"], "ll_short": row["premise_free"]}
        for key, context in contexts.items():
            for j, choice in enumerate(row["choices"]):
                diff = abs(served[idx][key][j] - row[key][j])
                assert diff < TOKEN_TOL * len(enc.pair(context, choice)[1]), (idx, key, j)
                worst = max(worst, diff)
    # A prediction must agree wherever the local margin exceeds what the measured differences can close:
    # 2 x worst for a sum (two answers move), 4 x worst for PMI (a difference of two sums per answer).
    agree = compared = same = total = 0
    for idx, row in local_rows.items():
        full, short = row["ll_full"], row["ll_short"]
        for method, scores, slack in (
            ("base", full, 2 * worst),
            ("pmi", [f - s for f, s in zip(full, short)], 4 * worst),
            ("pmi_dc", row["score_pmi_dc"], 4 * worst),
        ):
            total += 1
            same += served[idx][f"pred_{method}"] == row[f"pred_{method}"]
            ranked = sorted(scores, reverse=True)
            if ranked[0] - ranked[1] > slack:
                compared += 1
                agree += served[idx][f"pred_{method}"] == row[f"pred_{method}"]
    assert agree == compared
    with capsys.disabled():
        print(
            f"answer log-likelihoods: max |served - local| {worst:.4f}; predictions identical {same}/{total} "
            f"({compared} with a margin above the noise, all identical)"
        )
    results = json.loads((served_run / "results.json").read_text())
    assert results["backend"] == "openai" and results["served"]["boundary_straddles"] == 0
    assert results["served"]["alignment_canary"]["generated"] == pytest.approx(
        results["served"]["alignment_canary"]["echoed"], abs=0.05
    )


def test_rerun_resumes_from_the_request_cache(served_run, gemma_server, tmp_path):
    """A new output directory pointed at the first run's request cache asks the server nothing but the
    model list and the two canary requests (the canary is never cached)."""
    out = tmp_path / "again"
    evaluate_cli(
        served_args(gemma_server, out, "--model.server.request_cache", str(served_run / "requests.sqlite"))
    )
    first = json.loads((served_run / "results.json").read_text())
    again = json.loads((out / "results.json").read_text())
    assert again["served"]["requests_sent"] == 3
    assert again["tasks"]["csqa"]["report"] == first["tasks"]["csqa"]["report"]
    assert again["comparison"]["rows"] == first["comparison"]["rows"]


def test_a_model_name_the_server_does_not_have(gemma_server, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        evaluate_cli([*served_args(gemma_server, tmp_path / "x"), "--model.model", "gpt-3.5-turbo-instruct"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert (
        err
        == f"error: model 'gpt-3.5-turbo-instruct' is not served at {gemma_server} (it serves: gemma3-270m)"
    )


def test_an_empty_context_gets_no_log_prob_and_is_refused(gemma_server):
    scorer = ServedScorer(CompletionClient(ServerOptions(base_url=gemma_server)), "gemma3-270m")
    with pytest.raises(ServedModelError, match=r"no log-prob for a continuation token .*empty context"):
        scorer.score_text([("", [" yes"])], ["pmi_empty on csqa"])


def test_a_server_without_prompt_log_probs_is_refused(ggufs, tmp_path):
    log = tmp_path / "no-logits.log"
    with llama_server(ggufs["gemma3-270m"], "gemma3-270m", log, "--logits_all", "false") as server:
        options = ServerOptions(base_url=server.url, max_retries=1, backoff=0.0)
        with pytest.raises(ServedModelError, match=r"HTTP 500 .*logprobs is not supported.*2 attempts"):
            ServedScorer.connect(options, "gemma3-270m", tmp_path / "requests.sqlite")


def test_llama_cpp_misaligned_echo_is_caught_by_the_canary(ggufs, tmp_path, capsys):
    """SmolLM2 adds no BOS: llama-cpp-python's echoed log-probs are one row late, and the canary says so."""
    with llama_server(ggufs["smollm2-135m"], "smollm2-135m", tmp_path / "smollm2.log") as server:
        options = ServerOptions(base_url=server.url, max_retries=1, backoff=0.0)
        with pytest.raises(ServedModelError, match="serves misaligned prompt log-probs") as err:
            ServedScorer.connect(options, "smollm2-135m", tmp_path / "requests.sqlite")
    with capsys.disabled():
        print(f"\n{err.value}")
