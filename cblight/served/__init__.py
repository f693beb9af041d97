"""Scoring through an OpenAI-compatible completions server (vLLM, llama-cpp-python): the paper's GPT-3 rows.

``client`` holds the HTTP side (retries, concurrency, the request cache), ``scorer`` the log-prob side
(echoed prompt log-probs to continuation scores, the boundary rule, the alignment canary).
"""

from cblight.served.client import CompletionClient, RequestCache, ServedModelError, ServerOptions
from cblight.served.scorer import ServedScorer

__all__ = ["CompletionClient", "RequestCache", "ServedModelError", "ServedScorer", "ServerOptions"]
