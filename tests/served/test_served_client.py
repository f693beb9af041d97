"""The served backend's error handling, retries, concurrency, request cache and echo parsing.

A small local HTTP stub answers with canned statuses (429, 500, 401, ...) and counts what it was sent: it
tests the client's handling of those answers, not scoring. Scoring against a real server (llama-cpp-python
serving the Gemma GGUF) is ``tests/realmodel/test_served.py``. The echoed answers parsed below have the
shapes a real llama-cpp-python 0.3.36 server and vLLM send (vLLM counts its BOS text in the offsets).
"""

from __future__ import annotations

import socket
import sys
import threading
from pathlib import Path

import pytest

from cblight.served import CompletionClient, RequestCache, ServedModelError, ServedScorer, ServerOptions
from cblight.served.scorer import echoed_continuation
from tests.helpers import ROOT
from tests.served.http_stub import Stub, echo_answer
from tests.server_process import ServerProcess, free_port

FIXTURES = ROOT / "tests" / "fixtures"


@pytest.fixture
def stub():
    made: list[Stub] = []

    def make(reply, delay: float = 0.0) -> Stub:
        made.append(Stub(reply, delay))
        return made[-1]

    yield make
    for s in made:
        s.close()


def options(url: str, **kw) -> ServerOptions:
    return ServerOptions(base_url=url, **{"max_retries": 3, "backoff": 0.0, "max_backoff": 0.0, **kw})


# ---------------------------------------------------------------------------------------------------------
# Retries, backoff, bounded storms


def test_429_and_500_are_retried_with_exponential_backoff(stub):
    answers = iter([(500, {"error": "busy"}, {}), (429, {}, {"Retry-After": "0"}), (200, {"ok": 1}, {})])
    server = stub(lambda path, body: next(answers))
    slept: list[float] = []
    client = CompletionClient(options(server.url, backoff=1.0, max_backoff=30.0), sleep=slept.append)
    assert client.request("/completions", {"prompt": "x"}) == {"ok": 1}
    assert len(server.requests) == 3 and client.retries == 2
    # backoff * 2^attempt, jittered into [half, whole]
    assert 0.5 <= slept[0] <= 1.0 and 1.0 <= slept[1] <= 2.0


def test_a_429_storm_ends_in_one_error_after_bounded_attempts(stub):
    server = stub(lambda path, body: (429, {"error": {"message": "rate limited"}}, {"Retry-After": "100"}))
    slept: list[float] = []
    client = CompletionClient(
        options(server.url, max_retries=4, backoff=0.5, max_backoff=2.0), sleep=slept.append
    )
    with pytest.raises(ServedModelError) as err:
        client.request("/completions", {"prompt": "x"})
    message = str(err.value)
    assert "HTTP 429" in message and "rate limited" in message and "5 attempts" in message
    assert len(server.requests) == 5
    assert all(s <= 2.0 for s in slept) and len(slept) == 4  # Retry-After honoured only up to max_backoff


def test_a_500_storm_through_evaluate_is_one_line_and_writes_nothing(stub, tmp_path, capsys):
    from cblight.cli import evaluate_cli

    server = stub(lambda path, body: (503, {"detail": "overloaded"}, {}))
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        evaluate_cli(served_args(server.url, out))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: ") and "HTTP 503" in err and "3 attempts" in err
    assert not (out / "results.json").exists()


def test_an_unreachable_server_is_one_error_at_once(tmp_path, capsys):
    """A refused connection is not retried (nothing listens there; no wait mends it)."""
    from cblight.cli import evaluate_cli

    port = free_port()
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        evaluate_cli(served_args(f"http://127.0.0.1:{port}/v1", out, "--model.server.backoff", "30"))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        f"error: http://127.0.0.1:{port}/v1/models: connection refused: no server listens on 127.0.0.1 port "
        f"{port}; start it (e.g. vllm serve MODEL --port {port}) or set --model.server.base_url to where it "
        "listens"
    )
    assert not (out / "results.json").exists()


def test_refused_fails_at_once_but_resets_and_timeouts_are_retried(stub):
    slept: list[float] = []
    refused = CompletionClient(options(f"http://127.0.0.1:{free_port()}/v1", backoff=1.0), sleep=slept.append)
    with pytest.raises(ServedModelError, match="connection refused"):
        refused.request("/models")
    assert slept == [] and refused.requests_sent == 1

    # a server that accepts and hangs up at once (a restarting worker): retried, then one error
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]

        def hang_up():
            for _ in range(4):
                conn, _ = listener.accept()
                conn.recv(65536)
                conn.close()

        threading.Thread(target=hang_up, daemon=True).start()
        reset = CompletionClient(options(f"http://127.0.0.1:{port}/v1", backoff=1.0), sleep=slept.append)
        with pytest.raises(ServedModelError, match=r"connection failed .*4 attempts"):
            reset.request("/completions", {"prompt": "x"})
    assert len(slept) == 3 and reset.retries == 3

    slow = stub(lambda path, body: (200, {"ok": 1}, {}), delay=1.0)  # answers after the client's timeout
    timed = CompletionClient(options(slow.url, max_retries=1, timeout=0.2), sleep=slept.append)
    with pytest.raises(ServedModelError, match=r"timed out.*2 attempts"):
        timed.request("/completions", {"prompt": "x"})
    assert timed.retries == 1


# A server that answers the model list and dies of a segmentation fault on its first completion request,
# as llama.cpp's natively built CPU kernels did on Intel Xeons with AMX (no core file).
CRASHING_SERVER = """
import json, os, resource, signal, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        data = json.dumps({"data": [{"id": "served-model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_POST(self):
        print("POST", self.path, flush=True)
        os.kill(os.getpid(), signal.SIGSEGV)
HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def test_a_server_that_dies_mid_request_is_reported_as_stopped_not_absent(tmp_path):
    """The client says the server stopped (not "start it"); the test fixture says how it died."""
    port = free_port()
    log = tmp_path / "server.log"
    server = ServerProcess("stub server", [sys.executable, "-c", CRASHING_SERVER, str(port)], port, log)
    with server.running(wait=60):
        client = CompletionClient(options(server.url, max_retries=2, backoff=0.0))
        assert client.model_ids() == ["served-model"]
        with pytest.raises(pytest.fail.Exception) as dead, server.watch():
            client.complete({"prompt": "x"})
        first, *log_tail = str(dead.value).splitlines()
        assert first == f"the stub server exited with signal 11 (SIGSEGV) (log: {log})"
        assert log_tail[-1] == "POST /v1/completions"  # the log's last lines follow
        cause = dead.value.__context__
        assert isinstance(cause, ServedModelError)
        assert str(cause) == (
            f"{server.url}/completions: connection refused: the server on 127.0.0.1 port {port} answered "
            "earlier in this run and has stopped (crashed or killed: see its log); restart it and rerun the same "
            "command, which resumes from the request cache"
        )
        with pytest.raises(pytest.fail.Exception, match=r"^the stub server exited with signal 11"):
            server.alive()


def served_args(url: str, out: Path, *extra: str) -> list[str]:
    return [
        "--model.model", "served-model",
        "--model.backend", "openai",
        "--model.server.base_url", url,
        "--model.server.max_retries", "2",
        "--model.server.backoff", "0",
        "--data.data_root", str(FIXTURES),
        "--data.tasks", "[csqa]",
        "--data.selection", "false",
        "--model.output_dir", str(out),
        "--trainer.accelerator", "cpu",
        "--trainer.enable_progress_bar", "false",
        *extra,
    ]  # fmt: skip


def test_client_errors_fail_at_once_with_the_cause(stub, monkeypatch):
    server = stub(lambda path, body: (401, {"error": "invalid api key"}, {}))
    monkeypatch.setenv("MY_KEY", "sk-test")
    client = CompletionClient(options(server.url, api_key_env="MY_KEY"))
    with pytest.raises(
        ServedModelError, match=r"refused the request \(HTTP 401.*invalid api key.*set \$MY_KEY"
    ):
        client.request("/completions", {"prompt": "x"})
    assert len(server.requests) == 1
    bad = stub(
        lambda path, body: (400, {"error": {"message": "prompt is longer than the context window"}}, {})
    )
    with pytest.raises(ServedModelError, match=r"HTTP 400 .*longer than the context window"):
        CompletionClient(options(bad.url)).request("/completions", {"prompt": "x"})
    assert len(bad.requests) == 1


def test_api_key_comes_from_the_named_variable(stub, monkeypatch):
    seen: list[str | None] = []
    server = stub(lambda path, body: (200, {"data": [{"id": "m"}]}, {}))
    import urllib.request

    original = urllib.request.urlopen

    def spy(request, timeout):
        seen.append(request.get_header("Authorization"))
        return original(request, timeout=timeout)

    monkeypatch.setattr(urllib.request, "urlopen", spy)
    monkeypatch.setenv("SERVED_KEY", "abc")
    assert CompletionClient(options(server.url, api_key_env="SERVED_KEY")).model_ids() == ["m"]
    monkeypatch.delenv("SERVED_KEY")
    CompletionClient(options(server.url, api_key_env="SERVED_KEY")).model_ids()
    assert seen == ["Bearer abc", None]


# ---------------------------------------------------------------------------------------------------------
# Concurrency and the request cache


def test_concurrency_is_bounded(stub):
    server = stub(lambda path, body: (200, {"n": body["prompt"]}, {}), delay=0.05)
    client = CompletionClient(options(server.url, concurrency=3))
    answers = client.complete_many([{"prompt": i} for i in range(12)])
    assert [a["n"] for a in answers] == list(range(12))  # in request order
    assert 1 < server.max_in_flight <= 3
    sent = server.completions()
    twice = client.complete_many([{"prompt": "same"}, {"prompt": 99}, {"prompt": "same"}])
    assert twice[0] == twice[2] == {"n": "same"} and server.completions() - sent == 2  # sent once


def test_an_interrupted_run_resumes_from_the_request_cache(stub, tmp_path):
    fail = {"on": 5}

    def reply(path, body):
        if body["prompt"] == fail["on"]:
            return 400, {"error": "bad prompt"}, {}
        return 200, {"n": body["prompt"]}, {}

    server = stub(reply)
    cache = RequestCache(tmp_path / "requests.sqlite")
    client = CompletionClient(options(server.url, concurrency=1), cache)
    bodies = [{"prompt": i} for i in range(8)]
    with pytest.raises(ServedModelError, match="HTTP 400"):
        client.complete_many(bodies)
    cached = len(cache.items())  # prompts 0-4, and 6 if the worker took it before the failure was seen
    assert cached in (5, 6)
    sent = server.completions()
    fail["on"] = None
    again = CompletionClient(options(server.url, concurrency=2), RequestCache(tmp_path / "requests.sqlite"))
    assert [a["n"] for a in again.complete_many(bodies)] == list(range(8))
    assert server.completions() - sent == 8 - cached  # only those never answered
    assert len(RequestCache(tmp_path / "requests.sqlite").items()) == 8


def test_a_corrupt_request_cache_is_one_error(tmp_path):
    bad = tmp_path / "requests.sqlite"
    bad.write_text("not a database" * 100)
    with pytest.raises(ServedModelError, match=r"request cache .* is not a usable sqlite file"):
        RequestCache(bad)


# ---------------------------------------------------------------------------------------------------------
# Echoed prompt log-probs -> continuation scores


def test_llama_cpp_and_vllm_echo_shapes_give_the_same_continuation():
    prompt = "Where is milk? the answer is: fridge"
    pieces = ["Where", " is", " milk", "?", " the", " answer", " is", ":", " fridge"]
    lps = [None, -3.0, -4.0, -1.0, -2.0, -0.5, -0.1, -0.2, -7.5]  # llama-cpp-python: the first gets none
    llama = echoed_continuation(echo_answer(prompt, lps, pieces), " fridge", "q")
    vllm = echoed_continuation(echo_answer(prompt, [-9.0, *lps[1:]], pieces, bos="<bos>"), " fridge", "q")
    assert llama.tokens == vllm.tokens == (" fridge",)
    assert llama.log_probs == vllm.log_probs == (-7.5,)
    assert not llama.straddles and llama.greedy
    two = echoed_continuation(echo_answer(prompt, lps, pieces), ": fridge", "q")
    assert two.log_probs == (-0.2, -7.5)


def test_generated_tokens_left_out_of_the_echo_are_recognised():
    """llama-cpp-python's echo for a model without BOS lists the prompt tokens only, though usage counts
    one generated token: the generated text (the answer's text minus the prompt) tells."""
    prompt = "The capital of France is Paris"
    pieces = ["The", " capital", " of", " France", " is", " Paris"]
    answer = echo_answer(prompt, [None, -9.6, -10.5, -11.2, -11.8, -8.45], pieces)
    lp = answer["choices"][0]["logprobs"]
    for key in ("tokens", "text_offset", "token_logprobs", "top_logprobs"):
        lp[key] = lp[key][:-1]  # the generated "." is counted in usage but not listed
    assert echoed_continuation(answer, " Paris", "q", prompt).log_probs == (-8.45,)
    whole = echo_answer(prompt, [None, -9.6, -10.5, -11.2, -11.8, -8.45], pieces)
    assert echoed_continuation(whole, " Paris", "q", prompt).log_probs == (-8.45,)


def test_a_token_straddling_the_boundary_is_left_out_and_flagged():
    prompt = "is: yes"
    got = echoed_continuation(echo_answer(prompt, [None, -1.0, -2.0], ["is", ": ", "yes"]), " yes", "q")
    assert got.tokens == ("yes",) and got.log_probs == (-2.0,) and got.straddles


def test_missing_prompt_log_probs_are_errors_not_numbers():
    prompt = "the answer is: yes"
    pieces = ["the", " answer", " is", ":", " yes"]
    empty_context = echo_answer("yes", [None], ["yes"])  # the token right after BOS gets no log-prob
    with pytest.raises(ServedModelError, match=r"no log-prob for a continuation token.*empty context"):
        echoed_continuation(empty_context, "yes", "q")
    no_echo = {  # a server that ignores echo: log-probs of the generated token only
        "choices": [
            {"text": ".", "logprobs": {"tokens": ["."], "text_offset": [0], "token_logprobs": [-0.5]}}
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1},
    }
    with pytest.raises(ServedModelError, match="generated tokens only, none for the prompt"):
        echoed_continuation(no_echo, " yes", "q")
    without_logprobs = {"choices": [{"text": prompt, "logprobs": None}], "usage": {"completion_tokens": 1}}
    with pytest.raises(ServedModelError, match="no prompt log-probs"):
        echoed_continuation(without_logprobs, " yes", "q")
    no_usage = echo_answer(prompt, [None, -1.0, -1.0, -1.0, -1.0], pieces)
    del no_usage["usage"]
    with pytest.raises(ServedModelError, match=r"usage.completion_tokens"):
        echoed_continuation(no_usage, " yes", "q")


def test_the_canary_refuses_a_misaligned_server(stub):
    """A server whose echoed log-prob of a token differs from its generation log-prob (llama-cpp-python's
    off-by-one for models without BOS) is refused before anything is scored."""

    def reply(path, body):
        if not body.get("echo"):
            return (
                200,
                {
                    "choices": [
                        {"text": " Paris", "logprobs": {"tokens": [" Paris"], "token_logprobs": [-0.4]}}
                    ],
                    "usage": {"completion_tokens": 1},
                },
                {},
            )
        pieces = ["The", " capital", " of", " France", " is", " Paris"]
        return 200, echo_answer(body["prompt"], [None, -9.0, -10.5, -3.0, -2.0, -11.0], pieces), {}

    scorer = ServedScorer(CompletionClient(options(stub(reply).url)), "m")
    with pytest.raises(
        ServedModelError, match=r"misaligned prompt log-probs: ' Paris' .* -11\.000 .* -0\.400"
    ):
        scorer.check_alignment()


def test_next_token_tasks_and_unspelled_special_tokens_are_refused(tmp_path, capsys):
    from cblight.cli import evaluate_cli

    for extra, message in (
        (["--data.tasks", "[lambada]"], "lambada: next-token prediction needs the model's whole next-token"),
        (["--data.tasks", "[sst5]"], "sst5: its prompts contain the tokenizer's EOS token"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            evaluate_cli(served_args("http://127.0.0.1:9/v1", tmp_path / "out", *extra))
        assert exit_info.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].startswith(f"error: {message}")


def test_server_options_are_checked(tmp_path, capsys):
    from cblight.cli import evaluate_cli

    for extra, message in (
        (["--model.server.base_url", "127.0.0.1:8000"], "server.base_url must be an http(s) URL"),
        (["--model.server.concurrency", "0"], "server.concurrency must be an integer >= 1"),
    ):
        with pytest.raises(SystemExit):
            evaluate_cli([*served_args("http://127.0.0.1:9/v1", tmp_path / "out"), *extra])
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        evaluate_cli(
            ["--model.model", "gpt2", "--model.server.base_url", "http://x/v1", "--data.tasks", "[copa]"]
        )
    assert "server options are for backend: openai" in capsys.readouterr().err
