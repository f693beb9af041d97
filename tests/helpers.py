"""Shared by the tests (a module of helpers, not of tests): the checkout's paths, the argument lists of
small runs that several test modules type, and the tiny random Llama of the ``tiny_llama_dir`` fixture."""

import json
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
DEMO = ROOT / "cblight" / "assets" / "demo_data"
README = ROOT / "README.md"
# evaluate.py options of every in-process test run: CPU, no progress bar in the test log
EVAL_QUIET_CPU = ["--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false"]


def copa_args(tiny: Path, out: Path, *extra: str) -> list[str]:
    """``cblight evaluate`` of two COPA demo questions on the model ``tiny`` into ``out``, then ``extra``."""
    return [
        "evaluate",
        "--model.model", str(tiny),
        "--model.choice_alphas", "[0.0, -1.0]",
        "--model.plots", "false",
        "--model.output_dir", str(out),
        "--data.tasks", "[copa]",
        "--data.data_root", str(DEMO),
        "--data.limit", "2",
        *EVAL_QUIET_CPU,
        *extra,
    ]  # fmt: skip


WEBTEXT = str(FIXTURES / "webtext")


def generate_args(model: Path, out: Path, *extra: str) -> list[str]:
    """``cblight generate`` with the WebText config on two fixture documents, 4 new tokens, into ``out``."""
    return [
        "generate", "-c", str(ROOT / "configs" / "webtext_generation.yaml"), "--model.model", str(model),
        "--data.data_dirs", json.dumps({"webtext": WEBTEXT}), "--data.limit", "2",
        "--model.max_new_tokens", "4", "--model.output_dir", str(out),
        "--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false", *extra,
    ]  # fmt: skip


_LLAMA_CORPUS = (
    "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step. "
    "Question: what is the capital of France? Answer: Paris. The answer is: yes. This quote has a tone that is "
    "positive. Title: Markets rally. Summary: Stocks rose on Monday. Topic: Business. TL;DR: it was fine. "
    "She opened the door because the bell rang, so he went home. Ballad metre is less regular than common metre."
)


def build_tiny_llama(
    out_dir: str | Path, *, hidden_size: int = 32, num_layers: int = 2, seed: int = 0
) -> Path:
    """A random Llama (rotary positions, grouped-query attention) with a byte-level BPE tokenizer trained
    on a short corpus, which starts every encoding with ``<s>`` as Llama's does (the tiny GPT-2 is
    ``cblight.tiny``'s, which the demo uses too). Nothing is downloaded; it is written with
    ``save_pretrained``, so the tests load it through ``from_pretrained``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    core.train_from_iterator([_LLAMA_CORPUS] * 4, trainer=trainer)
    core.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", core.token_to_id("<s>"))]
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="</s>"
    )
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    tok.model_max_length = 256
    LlamaForCausalLM(config).save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return Path(out_dir)


def assert_refused(
    status: int | str | None,
    lines: Sequence[str],
    *,
    names: str | Sequence[str] = (),
    fix: str | Sequence[str] = (),
    alone: bool = False,
) -> str:
    """A refusal's decisive parts, not its whole sentence: exit status 2, one line of ``lines`` (stderr)
    starting ``error: ``, the last (no traceback after it; ``alone``: the only line), which names each of
    ``names`` as printed (the option, file, field or value) and gives each ``fix`` fragment (e.g. ``did you
    mean --model.choice_alphas?``), each a whole run of words there: ``--model.choice_alpha`` is not found in
    ``--model.choice_alphas``, nor ``model.x`` in ``--model.x``. Returns the line.

    A line that docs/errors.md quotes is compared whole instead (tests/commands/test_errors_doc.py)."""
    lines = list(lines)
    shown = "\n".join(lines[-30:])
    assert status == 2, f"exit status {status!r}, not 2:\n{shown}"
    errors = [line for line in lines if line.startswith("error: ")]
    assert errors and errors == lines[-1:], f"not one error: line, the last:\n{shown}"
    assert not alone or len(lines) == 1, f"more than the one line:\n{shown}"
    line = errors[0]
    for kind, parts in (("name", names), ("give the fix", fix)):
        for part in (parts,) if isinstance(parts, str) else parts:
            found = re.search(rf"(?<![\w./-]){re.escape(part)}(?![\w/-]|\.\w)", line)
            assert found, f"the line does not {kind} {part!r}:\n{line}"
    return line


class Outcome(NamedTuple):
    """What one ``cblight`` command did: its exit status, its stderr lines and its stdout."""

    status: int | str | None
    err: list[str]
    out: str


class Command:
    """``cblight ARGV`` typed in this process, as the console script runs it (``cblight.__main__.main``),
    its output read from pytest's ``capsys`` (the ``cli`` fixture of tests/conftest.py)."""

    def __init__(self, capsys):
        self.capsys = capsys

    def __call__(self, argv: list[str]) -> Outcome:
        from cblight.__main__ import main

        saved = list(sys.argv)
        try:
            status = main(argv)
        except SystemExit as exc:
            status = exc.code
        finally:
            sys.argv[:] = saved
        captured = self.capsys.readouterr()
        return Outcome(status, captured.err.strip().splitlines(), captured.out)

    def one_line(self, argv: list[str]) -> str:
        """The command must exit 2 with exactly one line on stderr, and that line is returned."""
        status, err, _ = self(argv)
        assert status == 2, err
        assert len(err) == 1, "\n".join(err)
        return err[0]

    def refuses(self, argv: list[str], *, names: str | Sequence[str], fix: str | Sequence[str]) -> str:
        """The command must exit 2 with exactly one line on stderr (as :meth:`one_line`), which names
        ``names`` and gives ``fix`` (:func:`assert_refused`); that line."""
        status, err, _ = self(argv)
        return assert_refused(status, err, names=names, fix=fix, alone=True)

    def last_error(self, argv: list[str]) -> str:
        """A refusal found while running (after Lightning's start-up notes): exit 2, one ``error:`` line,
        last; that line."""
        status, err, _ = self(argv)
        assert status == 2, err
        assert [line for line in err if line.startswith("error:")] == err[-1:], "\n".join(err)
        return err[-1]


def python_blocks(path: Path, every: bool) -> list[tuple[str, list[str]]]:
    """The ```python blocks of ``path`` that a ```text block follows, each with that block's lines (what the
    code prints). Each is a program of its own: its imports, its model, its output directory. ``every``: each
    python block must be followed by one (the README)."""
    text = path.read_text(encoding="utf-8")
    pairs = re.findall(r"```python\n(.*?)```\n+```text\n(.*?)```", text, re.S)
    if every:
        assert len(pairs) == text.count("```python\n"), f"a python block of {path.name} shows no output"
    return [(code, printed.splitlines()) for code, printed in pairs]


# The README's python blocks (each one shows what it prints), then the tutorials' that show their output
PYTHON_BLOCKS = [
    (f"{path.relative_to(ROOT)}:{i + 1}", code, printed)
    for path, every in [
        (README, True),
        *((p, False) for p in sorted((ROOT / "docs" / "tutorials").glob("*.md"))),
    ]
    for i, (code, printed) in enumerate(python_blocks(path, every))
]


# The README, then the pages its former sections moved to (in the order a later command may read what an
# earlier one wrote: the tuning tutorial's resume command reads the checkpoint its first command saved).
SOURCES = [
    README,
    *(
        ROOT / "docs" / page
        for page in (
            "getting-started.md",
            "evaluate.md",
            "tutorials/reproduce-tables.md",
            "tutorials/generate.md",
            "tutorials/tune.md",
            "tutorials/lmeval.md",
            "results.md",
            "development.md",
        )
    ),
]
# the documentation's commands that convert a real model: the real-model tier runs them as written (it
# converts the same models), the tiny suite's tests/commands/test_readme_commands.py skips them
REAL_MODEL_TIER = (("cblight", "zoo", "convert"), ("cblight", "zoo", "path"))


def readme_commands(sources: list[Path] = SOURCES) -> list[list[str]]:
    """The runnable commands of ``sources`` as argument lists, comments dropped, in order, each once."""
    found: list[list[str]] = []
    for source in sources:
        for block in re.findall(r"```bash\n(.*?)```", source.read_text(encoding="utf-8"), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                tokens = shlex.split(line, comments=True)
                if _runnable(tokens) and tokens not in found:
                    found.append(tokens)
    return found


def _runnable(tokens: list[str]) -> bool:
    if len(tokens) < 2:
        return False
    if tokens[0] == "cblight":
        return True
    if tokens[0] == "python":
        return tokens[1] in ("evaluate.py", "train.py") or (
            tokens[1] == "-m" and len(tokens) > 2 and tokens[2].split(".")[0] == "cblight"
        )
    return tokens[0] == "bash" and tokens[1].startswith("scripts/")
