"""``cblight data list`` and ``peek``."""

from __future__ import annotations

import subprocess
import sys

from cblight.data.__main__ import main
from tests.helpers import ROOT

FIXTURES = ROOT / "tests" / "fixtures"


def test_list_shows_every_task_with_sizes_and_prompts(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ("storycloze", "lama", "lambada", "webtext", "dstc7", "cnn_dailymail", "xsum", "trec"):
        assert f"\n{name} " in out
    assert "test (1871)" in out and "validation (1871)" in out  # StoryCloze
    assert "train sample of 500" in out  # TREC: alpha* on a train sample as large as test
    assert "prompt: {detokenised question} The answer to this question will be" in out
    assert "short context: ' the answer is:'" in out
    assert main(["list", "--kind", "generation"]) == 0
    assert "storycloze" not in capsys.readouterr().out


def test_list_names_the_local_files_of_every_task(capsys):
    """Each task's block names, per split, the files it reads locally: a file named there and put in
    ``data_root/<task>/`` is what evaluate.py reads (the bundled fixtures follow those names)."""
    from cblight.data.registry import all_tasks

    assert main(["list"]) == 0
    blocks: dict[str, str] = {}
    for line in capsys.readouterr().out.splitlines()[1:]:
        if not line.startswith(" "):
            current = line.split()[0]
            blocks[current] = ""
        blocks[current] += line + "\n"
    assert set(blocks) == set(all_tasks())
    for name, spec in all_tasks().items():
        block = blocks[name]
        assert f"local files in data_root/{name}/" in block, name
        for split, patterns in spec.source.local.files.items():
            assert f"{split}:" in block and patterns[0] in block, (name, split)
    assert "train:      train.jsonl" in blocks["copa"] and "validation: val.jsonl" in blocks["copa"]
    assert "train.csv" in blocks["agnews"] and "test.csv" in blocks["agnews"]


def test_peek_prints_the_rendered_example(capsys):
    assert main(["peek", "sst2", "--data_root", str(FIXTURES), "--index", "3"]) == 0
    out = capsys.readouterr().out
    assert "full context:  'a masterpiece four years in the making . This quote has a tone that is'" in out
    assert "premise-free:  ' This quote has a tone that is'" in out
    assert "[1] ' positive\\n'   <- label" in out
    assert (
        main(["peek", "storycloze", "--data_dir", str(FIXTURES / "storycloze"), "--split", "validation"]) == 0
    )
    assert "premise-free:  ''  (BOS/EOS alone)" in capsys.readouterr().out
    assert main(["peek", "dstc7", "--data_dir", str(FIXTURES / "dstc7")]) == 0
    out = capsys.readouterr().out
    assert "human:         'pineapple is a crime'" in out and "short context: '<|endoftext|>'" in out


def test_peek_bad_input_is_one_line(capsys):
    assert main(["peek", "storycloze"]) == 2
    assert capsys.readouterr().err.startswith("error: storycloze: StoryCloze is not on the Hub")
    assert main(["peek", "copa", "--data_dir", str(FIXTURES / "copa"), "--index", "9"]) == 2
    assert "--index 9 is outside the 3 examples of copa/validation" in capsys.readouterr().err


def test_module_entry_point():
    done = subprocess.run(
        [sys.executable, "-m", "cblight", "data", "list", "--kind", "next_token"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "lama" in done.stdout and "lambada" in done.stdout and "copa" not in done.stdout
