"""Shared fixtures: tiny random models saved to a temp dir and loaded through ``from_pretrained``.

No test may reach the Hub: the offline switches are set before transformers/datasets are imported.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MPLBACKEND", "Agg")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist's workers share the machine's cores: one thread each (and their subprocesses), since
    # OpenMP threads spin-waiting on a busy core cost tiny models up to 10x
    os.environ.setdefault("OMP_NUM_THREADS", "1")

from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture(scope="session")
def tiny_gpt2_dir(tmp_path_factory) -> Path:
    from cblight.tiny import build_tiny_gpt2

    return build_tiny_gpt2(tmp_path_factory.mktemp("models") / "tiny-gpt2")


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    from tests.helpers import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def peaky_gpt2_dir(tmp_path_factory):
    """A tiny GPT-2 whose scaled embeddings make its predictions peaked and context-dependent, so that
    f_k and f_max differ measurably (a fresh random model is nearly uniform). Built once per session: the
    tests only read it."""
    import torch

    from cblight.models import load_causal_lm
    from cblight.tiny import build_tiny_gpt2

    path = build_tiny_gpt2(tmp_path_factory.mktemp("models") / "peaky-gpt2", seed=3)
    model = load_causal_lm(str(path))
    with torch.no_grad():
        model.transformer.wte.weight.mul_(5)
        model.transformer.wpe.weight.mul_(5)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session", params=["gpt2", "llama"])
def tiny_model_dir(request, tiny_gpt2_dir, tiny_llama_dir) -> Path:
    """Both architectures: absolute positions (GPT-2) and rotary positions with BOS (Llama)."""
    return tiny_gpt2_dir if request.param == "gpt2" else tiny_llama_dir


@pytest.fixture(scope="module")
def tiny_lm(tiny_model_dir):
    """``(model, tokenizer)`` of both tiny architectures, loaded through ``from_pretrained`` in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval(), AutoTokenizer.from_pretrained(
        tiny_model_dir
    )


@pytest.fixture(scope="module")
def one_thread():
    """For modules of many tiny forwards (``pytestmark = pytest.mark.usefixtures("one_thread")``): tiny
    models gain nothing from threads, and on a shared 2-core machine OpenMP spin-waits cost up to 10x."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def gpt2_tokenizer():
    from cblight.tiny import gpt2_tokenizer

    return gpt2_tokenizer()


@pytest.fixture
def fixture_hub(monkeypatch):
    """The Hub, offline: a task's Hub records are its fixture files (``tests/fixtures/<task>``), read by the
    task's own local readers; the ``(task, split)`` pairs asked of it are recorded in the returned list."""
    import cblight.data.sources as sources
    from cblight.data.registry import get_task

    fixtures = Path(__file__).resolve().parent / "fixtures"
    asked: list[tuple[str, str]] = []

    def hub_records(task, split, hub):
        asked.append((task, split))
        return sources.load_split_records(task, split, get_task(task).source, data_dir=fixtures / task)

    monkeypatch.setattr(sources, "_hub_records", hub_records)
    return asked


@pytest.fixture
def cli(capsys):
    """``cli(argv)``: ``cblight ARGV`` in this process, its (exit status, stderr lines, stdout);
    ``cli.one_line(argv)`` / ``cli.last_error(argv)``: the one line of a refusal (exit status 2);
    ``cli.refuses(argv, names=..., fix=...)``: that line's decisive parts (``tests.helpers.assert_refused``)."""
    from tests.helpers import Command

    return Command(capsys)


class Loaded(AssertionError):
    pass


@pytest.fixture
def no_loading(monkeypatch):
    """A parse error comes before any model or tokenizer is opened. Every module that binds the loaders at
    its import is imported first (so none keeps the stand-in after the test) and patched."""
    import cblight.contrast as contrast
    import cblight.evaluator as base
    import cblight.generate.generation_evaluator as generation
    import cblight.models as models
    import cblight.tune.coherence_tuning as tuning

    def load(*args, **kwargs):
        raise Loaded("a model or tokenizer was loaded before the bad input was refused")

    for module in (models, base, tuning, contrast, generation):
        for name in ("load_causal_lm", "load_tokenizer"):
            monkeypatch.setattr(module, name, load, raising=False)
