"""Every experiment config in ``configs/`` parses and builds, and matches its paper table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.helpers import ROOT

CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def entry_point(path: Path) -> str | None:
    """The ``cblight`` subcommand the config's opening comment runs it with."""
    match = re.search(r"cblight (evaluate|generate|tune) -c configs/", path.read_text())
    return match.group(1) if match else None


def test_there_are_configs_for_the_evaluation_tables():
    names = {p.name for p in CONFIGS}
    assert {"lambada.yaml", "multiple_choice.yaml", "lama.yaml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_opens_with_its_table_and_command(path):
    text = path.read_text()
    assert text.startswith("# "), "a config opens with a comment naming its paper table"
    # an overlay (added after a paper experiment's config, e.g. the FSDP2 strategy) is no experiment of its
    # own: it opens by saying what it overlays instead of a table
    overlay = re.match(r"# [\w ]+ overlay: ", text)
    assert overlay or re.match(r"# (Table|Figure|Tables|Figures) ([A-Z]\.)?\d", text), text.splitlines()[0]
    assert entry_point(path) is not None, "the opening comment shows the command that runs it"
    assert isinstance(yaml.safe_load(text), dict)


@pytest.mark.parametrize(
    "path", [p for p in CONFIGS if entry_point(p) in ("evaluate", "generate")], ids=lambda p: p.name
)
def test_evaluation_config_builds(path, tmp_path):
    from cblight.cli import build_evaluate_cli
    from cblight.data.registry import get_task

    cli = build_evaluate_cli(["-c", str(path), "--model.output_dir", str(tmp_path / "out")])
    data, model = cli.datamodule, cli.model
    assert data.tokenizer == model.tokenizer_name  # linked from the model
    if path.name == "webtext_generation.yaml":  # Table 2 / Figure 3
        names = [d.name for d in model.decodings]
        assert names[:3] == ["sampling", "sampling T=0.9", "nucleus p=0.95"] and len(names) == 3 + 4 * 5
        assert {d.boosting.k for d in model.decodings[3:]} == {8, 16, 32, 64}
        assert all(d.sampling.top_p == 0.95 and d.sampling.do_sample for d in model.decodings[2:])
        assert model.hparams.max_new_tokens == 200 and data.task_names == ["webtext"]
        return
    if path.name == "dstc7_dialog.yaml":  # Table 3
        assert [d.sampling.num_beams for d in model.decodings[:2]] == [10, None] and len(
            model.decodings
        ) == 2 + 8
        assert {d.boosting.mode for d in model.decodings[2:]} == {"response"}
        return
    if path.name == "compare_tuned_webtext.yaml":  # Table 2's nucleus, boost and self-tune rows
        assert set(cli.config["compare"]) == {"base", "tuned"}
        assert [(d.describe()["mode"], d.describe()["alpha"], d.sampling.top_p) for d in model.decodings] == [
            ("plain", 0.0, 0.95),
            ("last_k", -0.05, 0.95),
        ]
        return
    if path.name == "summarization.yaml":  # summarisation table
        assert [d.describe()["alpha"] for d in model.decodings] == [
            0.0,
            -0.1,
            -0.2,
            -0.3,
            -0.4,
            -0.5,
            -0.6,
            -0.7,
            -0.8,
            -0.9,
        ]
        assert data.task_names == ["cnn_dailymail", "xsum"] and model.hparams.max_new_tokens == 100
        return
    assert data.max_k == max(model.ks)  # linked from model.ks
    if path.name == "multiple_choice.yaml":  # Table 4: the 13 tasks the Hub serves (docs/data.md)
        from cblight.data.registry import all_tasks

        local_only = {"storycloze", "agnews"}
        table4 = {n for n, spec in all_tasks().items() if spec.kind == "multiple_choice"}
        assert set(data.task_names) == table4 - local_only and len(table4) == 15
        assert all(not get_task(n).source.hub_refusal and get_task(n).source.hub for n in data.task_names)
        assert all(get_task(n).source.hub_refusal for n in local_only)
        assert data.data_root is None  # a root the checkout lacks would be refused: the Hub is the default
        assert (
            model.choice_alphas[0] == 2.0
            and model.choice_alphas[-1] == -5.0
            and len(model.choice_alphas) == 701
        )
        assert -4.19 in model.choice_alphas and -1.0 in model.choice_alphas and 0.0 in model.choice_alphas
    if path.name == "lama.yaml":  # Table 5
        assert data.task_names == ["lama"] and model.ks == [1, 2, 3, 4, 5]
        assert {-0.5, -0.4, 0.0} <= set(model.next_token_alphas)
    if path.name == "lambada.yaml":  # Table 1
        assert data.task_names == ["lambada"] and model.ks == list(range(1, 21))
        assert {-0.6, -0.5, -0.3, -0.2, 0.0} <= set(model.next_token_alphas)
    assert not (tmp_path / "out").exists()
