"""Every benchmark through ``evaluate.py``'s ``evaluate_cli`` on a tiny random model, on the fixture files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from cblight.cli import evaluate_cli
from cblight.data.registry import all_tasks
from tests.helpers import ROOT

FIXTURES = ROOT / "tests" / "fixtures"
MULTIPLE_CHOICE = [n for n, spec in all_tasks().items() if spec.kind == "multiple_choice"]
QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.accelerator", "cpu", "--model.plots", "false"]


def test_all_fifteen_multiple_choice_tasks_in_one_run(tiny_gpt2_dir, tmp_path, fixture_hub):
    """The README's Table 4 command for all 15 tasks: the config's 13 from the Hub (its fixture stand-in),
    StoryCloze and AG News, which have no loadable Hub copy, from their files."""
    out = tmp_path / "out"
    config = yaml.safe_load((ROOT / "configs/multiple_choice.yaml").read_text())
    table4 = ["storycloze", *config["data"]["tasks"][:9], "agnews", *config["data"]["tasks"][9:]]
    local = {"storycloze": str(FIXTURES / "storycloze"), "agnews": str(FIXTURES / "agnews")}
    results = evaluate_cli(
        [
            "-c", str(ROOT / "configs/multiple_choice.yaml"),
            "--data.tasks", json.dumps(table4),
            "--data.data_dirs", json.dumps(local),
            "--model.model", str(tiny_gpt2_dir),
            "--model.output_dir", str(out),
            "--model.choice_alphas", "[1.0, 0.0, -0.5, -1.0, -2.0]",
            "--model.batch_size", "8",
            "--data.limit", "2",
            *QUIET,
        ]
    )  # fmt: skip
    assert {task for task, _ in fixture_hub} == set(table4) - set(local)  # the others came from the Hub
    saved = json.loads((out / "results.json").read_text())
    assert sorted(table4) == MULTIPLE_CHOICE and len(table4) == 15
    assert list(saved["tasks"]) == table4 == list(results)
    for name, result in saved["tasks"].items():
        report, selection = result["report"], result["selection"]
        assert report["n"] == 2, name
        assert selection is not None and selection["n"] == 2, name
        assert report["alpha_star"] in (1.0, 0.0, -0.5, -1.0, -2.0)
        assert 0.0 <= report["acc_base"] <= 1.0 and 0.0 <= report["acc_pmi"] <= 1.0
        sampled = name in ("hellaswag", "copa", "csqa", "piqa", "agnews", "trec", "boolq", "rte", "cb")
        assert ("indices" in selection) == sampled, name
        assert (out / "predictions" / f"{name}.{report['split']}.jsonl").is_file()
    assert saved["tasks"]["sst2"]["selection"]["split"] == "validation"
    assert saved["tasks"]["trec"]["selection"]["split"].startswith("train sample of 2")


def _lama_tree(root: Path) -> Path:
    from cblight.data.tasks.lama import RELATIONS

    sample = (FIXTURES / "lama/P19/test.jsonl").read_text()
    extra = json.dumps({"sub_label": "Ann", "obj_label": "Paris", "predicate_id": "P19"}) + "\n"
    for rel in RELATIONS:
        for name in ("train.jsonl", "dev.jsonl", "test.jsonl"):
            path = root / rel / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(sample + extra if rel == "P19" else "")
    return root


def test_lama_filter_follows_the_k_grid_of_the_model(tiny_gpt2_dir, tmp_path):
    lama = _lama_tree(tmp_path / "lama")
    common = [
        "-c", str(ROOT / "configs/lama.yaml"),
        "--model.model", str(tiny_gpt2_dir),
        "--data.data_dirs", json.dumps({"lama": str(lama)}),
        "--model.next_token_alphas", "[0.0, -0.5]",
        *QUIET,
    ]  # fmt: skip
    # "Ann was born in" is 4 GPT-2 tokens: kept when the largest k is 3, dropped with configs/lama.yaml's 5
    # (tests/data/test_data_sources.py checks the filter itself; here: model.ks reaches the data module)
    result = evaluate_cli([*common, "--model.ks", "[1, 2, 3]", "--model.output_dir", str(tmp_path / "b")])[
        "lama"
    ]
    assert result["report"]["n"] == 3 and result["selection"]["n"] == 3
    assert result["sweep"]["ks"] == [1, 2, 3] and result["report"]["k_star"] in (1, 2, 3)


@pytest.mark.parametrize("args,message", [
    (["--data.tasks", "[storycloze]"], "storycloze: StoryCloze is not on the Hub in a loadable form"),
    (["--data.tasks", "[agnews]"], "agnews: the hub copy fancyzhx/ag_news joins title and description"),
    (["--data.tasks", "[copa]", "--data.data_dirs", "{copa: BAD}"], "has no field 'question'"),
    (["--data.tasks", "[copa]", "--data.data_dirs", "{copa: MISSING}"], "no file for split 'train'"),
])  # fmt: skip
def test_bad_input_is_one_clear_line_and_nothing_is_written(tiny_gpt2_dir, tmp_path, capsys, args, message):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "val.jsonl").write_text('{"premise": "A.", "choice1": "b", "choice2": "c", "label": 0}\n')
    (bad / "train.jsonl").write_text('{"premise": "A.", "choice1": "b", "choice2": "c", "label": 0}\n')
    missing = tmp_path / "missing"
    missing.mkdir()
    shutil.copy(FIXTURES / "copa/val.jsonl", missing / "val.jsonl")
    args = [a.replace("BAD", str(bad)).replace("MISSING", str(missing)) for a in args]
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        evaluate_cli(
            ["-c", str(ROOT / "configs/multiple_choice.yaml"), "--model.model", str(tiny_gpt2_dir),
             "--model.output_dir", str(out), *args, *QUIET]
        )  # fmt: skip
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and message in err[-1]
    assert not out.exists()
