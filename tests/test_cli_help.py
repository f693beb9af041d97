"""``evaluate.py --help`` shows the evaluator's options in its first lines (issue 14: they hid behind
``--model.help BoostedEvaluator``)."""

from __future__ import annotations

import inspect

import pytest

from cblight.cli import evaluate_cli
from cblight.evaluate.boosted_evaluator import BoostedEvaluator


def test_help_lists_every_evaluator_option_first(capsys):
    with pytest.raises(SystemExit) as exc:
        evaluate_cli(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    head = out.split("\noptions:", 1)[0]  # before the generic option list
    assert head.startswith("usage: ") and len(head.splitlines()[0]) < 120
    for name in inspect.signature(BoostedEvaluator.__init__).parameters:
        if name != "self":
            assert f"--model.{name} (default: " in head, name
    assert "--model.help BoostedGenerationEvaluator" in head
    assert "--model.choice_alphas (default: None)\n      multiple-choice grid (paper eq. 2)" in head
