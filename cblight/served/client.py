"""HTTP to an OpenAI-compatible completions server: bounded retries with exponential backoff, bounded
concurrency, and an on-disk request cache so that an interrupted run resumes without asking twice.

Only the standard library (``urllib``, ``sqlite3``, ``concurrent.futures``): the requests are small JSON
posts and the server does the heavy work. What is retried: HTTP 408, 429 and 5xx answers and connection
failures of a server that is there but busy (reset, timed out), at most ``max_retries`` more times, waiting
``backoff · 2^attempt`` seconds (capped at ``max_backoff``, halved at random for jitter, a ``Retry-After``
header honoured up to the cap). Anything else fails at once: 401, 404, 400 ..., a refused connection and
an unknown host name, which no wait mends. A refused connection is told apart by what came before it: from
a server that has not answered this client, nothing listens there (not started, or the wrong port); from a
server that answered or held a connection earlier in the run, the server stopped (crashed or was killed). A request that still fails ends the whole run with
one line naming the server, the status and the number of attempts: a run never goes on with some answers
missing. Answers already received are in the cache, so the next run starts where this one stopped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import socket
import sqlite3
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from http.client import HTTPException
from pathlib import Path
from typing import Any

from cblight.errors import CblightError, ConfigError
from cblight.option_types import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, check_fields

log = logging.getLogger(__name__)


class ServedModelError(CblightError):
    """A served model that cannot be used: unreachable, refusing, misaligned or missing log-probs."""


@dataclass
class ServerOptions:
    """Where the served model is and how to talk to it (``--model.backend openai``).

    Args:
        base_url: the server's OpenAI API root, e.g. ``http://127.0.0.1:8000/v1`` (vLLM, llama-cpp-python).
        api_key_env: name of the environment variable holding the API key (sent as a Bearer token when set).
        concurrency: requests in flight at once.
        max_retries: retries of a request after a 408/429/5xx answer or a connection failure.
        backoff: seconds before the first retry; doubled each retry, up to ``max_backoff``.
        max_backoff: the longest wait between two attempts.
        timeout: seconds to wait for one answer.
        request_cache: sqlite file of answers keyed by request (default ``<output_dir>/requests.sqlite``).
        check_alignment: before scoring, check with a canary that the server's prompt log-probs sit at the
            right positions (``cblight.served.scorer``).
    """

    base_url: str = "http://127.0.0.1:8000/v1"
    api_key_env: str | None = "OPENAI_API_KEY"
    concurrency: PositiveInt = 8
    max_retries: NonNegativeInt = 5
    backoff: NonNegativeFloat = 1.0
    max_backoff: NonNegativeFloat = 30.0
    timeout: PositiveFloat = 120.0
    request_cache: str | None = None
    check_alignment: bool = True

    def __post_init__(self) -> None:
        check_fields(self, ConfigError)
        if not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"server.base_url must be an http(s) URL, got {self.base_url!r}")


class _Retryable(Exception):
    def __init__(self, what: str, retry_after: float | None = None):
        super().__init__(what)
        self.retry_after = retry_after


def _server_message(err: urllib.error.HTTPError) -> str:
    try:
        body = err.read().decode("utf-8", errors="replace")
        detail = json.loads(body)
    except (OSError, HTTPException):
        return ""
    except ValueError:  # not JSON: the body itself
        return body.strip()[:200]
    if isinstance(detail, dict):  # OpenAI's {"error": {"message": ...}}, FastAPI's {"detail": ...}
        detail = detail.get("error", detail.get("detail", detail))
    if isinstance(detail, dict):
        detail = detail.get("message", detail)
    return str(detail)[:200]


class RequestCache:
    """Answers by request digest in one sqlite file (the request kept beside its answer, for inspection);
    safe to share between the client's threads."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(str(self.path), check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, request TEXT NOT NULL, answer TEXT NOT NULL)"
            )
            self._db.commit()
        except sqlite3.DatabaseError as err:
            raise ServedModelError(f"request cache {self.path} is not a usable sqlite file ({err})") from None

    @staticmethod
    def key(body: dict[str, Any]) -> str:
        return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode()).hexdigest()

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        """One statement under the lock, committed (``with`` a connection commits)."""
        with self._lock, self._db:
            return self._db.execute(sql, args).fetchall()

    def get(self, body: dict[str, Any]) -> dict[str, Any] | None:
        rows = self._query("SELECT answer FROM answers WHERE key = ?", (self.key(body),))
        return json.loads(rows[0][0]) if rows else None

    def put(self, body: dict[str, Any], answer: dict[str, Any]) -> None:
        row = (self.key(body), json.dumps(body, sort_keys=True), json.dumps(answer))
        self._query("INSERT OR REPLACE INTO answers VALUES (?, ?, ?)", row)

    def items(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """Every cached ``(request, answer)``."""
        return [(json.loads(r), json.loads(a)) for r, a in self._query("SELECT request, answer FROM answers")]


class CompletionClient:
    """Posts completion requests to ``options.base_url`` (see the module docstring)."""

    def __init__(
        self, options: ServerOptions, cache: RequestCache | None = None, sleep: Callable = time.sleep
    ):
        self.options = options
        self.base_url = options.base_url.rstrip("/")
        self.cache = cache
        self._sleep = sleep
        self.requests_sent = 0
        self.cache_hits = 0  # requests answered from the request cache (a resumed run's)
        self.retries = 0
        self.reached = False  # a server listened at base_url earlier in this client's life
        self._count = threading.Lock()

    def _send(self, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        url = f"{self.base_url}{path}"
        env = self.options.api_key_env
        headers = {"Content-Type": "application/json"}
        if env and os.environ.get(env):
            headers["Authorization"] = f"Bearer {os.environ[env]}"
        data = None if body is None else json.dumps(body).encode("utf-8")
        request = urllib.request.Request(url, data=data, headers=headers)  # POST with data, else GET
        with self._count:
            self.requests_sent += 1
        try:
            with urllib.request.urlopen(request, timeout=self.options.timeout) as answer:
                raw = answer.read()
            self.reached = True
        except urllib.error.HTTPError as err:
            self.reached = True
            message = _server_message(err)
            status = f"HTTP {err.code} {err.reason}" + (f": {message}" if message else "")
            if err.code in (408, 429) or err.code >= 500:
                try:
                    retry_after = float(err.headers["Retry-After"])  # a missing header is None: a TypeError
                except (TypeError, ValueError):
                    retry_after = None
                raise _Retryable(status, retry_after) from None
            if err.code in (401, 403):
                hint = f"set ${env}" if env else "set server.api_key_env to the variable holding the key"
                raise ServedModelError(f"{url} refused the request ({status}); {hint}") from None
            raise ServedModelError(f"{url} answered {status}") from None
        except (urllib.error.URLError, ConnectionError, HTTPException, TimeoutError) as err:
            reason = getattr(err, "reason", err)
            parts = urllib.parse.urlsplit(url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
            if isinstance(reason, ConnectionRefusedError):
                why = (
                    f"the server on {parts.hostname} port {port} answered earlier in this run and has stopped "
                    "(crashed or killed: see its log); restart it and rerun the same command, which resumes "
                    "from the request cache"
                    if self.reached
                    else f"no server listens on {parts.hostname} port {port}; start it (e.g. vllm serve MODEL "
                    f"--port {port}) or set --model.server.base_url to where it listens"
                )
                raise ServedModelError(f"{url}: connection refused: {why}") from None
            if isinstance(reason, socket.gaierror) and reason.errno == socket.EAI_NONAME:  # EAI_AGAIN retries
                raise ServedModelError(
                    f"{url}: the host name {parts.hostname!r} is not known ({reason.strerror}); check "
                    "--model.server.base_url"
                ) from None
            if isinstance(reason, (ConnectionResetError, HTTPException)):
                self.reached = True  # a server accepted the connection, then closed it mid-request
            raise _Retryable(f"connection failed ({reason})") from None
        try:
            parsed = json.loads(raw)
        except ValueError:
            raise ServedModelError(f"{url} answered something that is not JSON: {raw[:80]!r}") from None
        if not isinstance(parsed, dict):
            raise ServedModelError(f"{url} answered {type(parsed).__name__} JSON, not an object")
        return parsed

    def request(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """One request with the retry policy of the module docstring (no cache)."""
        started = time.monotonic()
        attempts = self.options.max_retries + 1
        for attempt in range(attempts):
            try:
                return self._send(path, body)
            except _Retryable as err:
                last = err
                if attempt + 1 == attempts:
                    break
                wait = max(self.options.backoff * 2**attempt, err.retry_after or 0.0)  # Retry-After honoured
                delay = min(self.options.max_backoff, wait) * random.uniform(0.5, 1.0)
                with self._count:
                    self.retries += 1
                log.warning("%s%s: %s; retrying in %.1f s", self.base_url, path, err, delay)
                self._sleep(delay)
        elapsed = time.monotonic() - started
        raise ServedModelError(
            f"{self.base_url}{path}: {last}, {attempts} attempts over {elapsed:.0f} s "
            f"(server.max_retries={self.options.max_retries}); nothing was scored from the failed request"
        )

    def complete(self, body: dict[str, Any], use_cache: bool = True) -> dict[str, Any]:
        """``POST /completions``, answered from the request cache when it holds this exact request."""
        if use_cache and self.cache is not None:
            hit = self.cache.get(body)
            if hit is not None:
                with self._count:
                    self.cache_hits += 1
                return hit
        answer = self.request("/completions", body)
        if use_cache and self.cache is not None:
            self.cache.put(body, answer)
        return answer

    def complete_many(self, bodies: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Every request, ``options.concurrency`` at a time, answers in order; identical requests (e.g. a PMI
        premise equal to the premise-free context) are asked once. The first failure cancels what has not
        started and is raised; answers already received stay in the cache."""
        unique = {RequestCache.key(body): body for body in bodies}
        if not unique:
            return []
        with ThreadPoolExecutor(max_workers=min(self.options.concurrency, len(unique))) as pool:
            futures = {pool.submit(self.complete, body): key for key, body in unique.items()}
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = [f.exception() for f in done if f.exception() is not None]
            if failed:
                pool.shutdown(cancel_futures=True)  # those already running finish (and are cached) first
                raise failed[0]
        answers = {futures[f]: f.result() for f in done}
        return [answers[RequestCache.key(body)] for body in bodies]

    def model_ids(self) -> list[str] | None:
        """The model names ``GET /models`` lists; ``None`` when the server has no such endpoint."""
        try:
            answer = self.request("/models")
        except ServedModelError as err:
            if "HTTP 404" in str(err):
                return None
            raise
        data = answer.get("data")
        return [str(m.get("id")) for m in data if isinstance(m, dict)] if isinstance(data, list) else None
