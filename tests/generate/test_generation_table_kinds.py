"""The generation table kinds (``cblight.generate.rows``): which task fills which table, the short
context of a row's ``auto`` boosting, and that each kind's records update its suite to the numbers of the
table's one-call functional form (``cblight.metrics.tables``) on the same inputs, computed independently."""

from pathlib import Path

import pytest
import torch

from cblight.data.datamodule import EvalDataModule
from cblight.generate.rows import DIALOG, SUMMARY, TEXT, Decoding, kind_of
from cblight.metrics.tables import DialogSuite, SummarySuite, TextSuite, dialog_table, summary_table
from cblight.options import Boosting

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def split_of(task: str):
    dm = EvalDataModule(tasks=[task], data_dirs={task: str(FIXTURES / task)})
    dm.setup()
    return dm.loader_splits("report")[0]


@pytest.mark.parametrize(
    ("task", "kind", "mode"),
    [("webtext", TEXT, "last_k"), ("dstc7", DIALOG, "response"), ("xsum", SUMMARY, "marker")],
)
def test_each_task_fills_its_table_and_auto_is_its_short_context(task, kind, mode):
    assert kind_of(split_of(task)) is kind
    auto = Decoding(name="b", boosting=Boosting(mode="auto", k=4, alpha=-0.2))
    assert auto.boosting_for(kind) == Boosting(mode=mode, k=4, alpha=-0.2)
    given = Decoding(name="b", boosting=Boosting(mode="last_k", k=4, alpha=-0.2))
    assert given.boosting_for(kind).mode == "last_k"  # a mode given by name is kept
    assert Decoding(name="g").boosting_for(kind) is None  # plain decoding


def test_text_records_update_table2_without_the_empty_generations():
    """A record with no tokens (EOS at once) is neither scored under the base LM nor in Table 2."""
    records = [
        {
            "id": 0,
            "tokens": [5, 6, 7, 5, 6],
            "lp_full": [-1.0, -0.5, -2.0, -0.1, -0.3],
            "lp_short": [-2.0] * 5,
        },
        {"id": 1, "tokens": [], "text": ""},
        {"id": 2, "tokens": [9, 9, 8], "lp_full": [-0.2, -0.4, -3.0], "lp_short": [-0.1, -5.0, -3.5]},
    ]
    assert TEXT.to_score(records) == [records[0], records[2]]
    assert TEXT.record_extras("some text.", None) == {}
    suite = TEXT.new_suite(eos_token_id=50256, self_bleu_samples=None, meteor="nltk")
    TEXT.update(suite, records, [None] * 3)
    kept = [records[0], records[2]]
    expected = TextSuite(eos_token_id=50256, self_bleu_samples=None).score(
        [r["tokens"] for r in kept],
        [torch.tensor(r["lp_full"]) for r in kept],
        [torch.tensor(r["lp_short"]) for r in kept],
        [0, 2],
    )
    assert suite.compute() == expected
    assert TEXT.titles == {}


def test_dialog_records_update_table3_with_stripped_responses():
    split = split_of("dstc7")
    examples = split.examples[:2]
    records = [
        {"id": ex.idx, "text": f"  {text} "}
        for ex, text in zip(examples, ("no way , pepperoni", "how cold ?"))
    ]
    assert DIALOG.to_score(records) == [] and DIALOG.record_extras("a", split) == {}
    suite = DIALOG.new_suite(eos_token_id=None, self_bleu_samples=None, meteor="nltk")
    assert isinstance(suite, DialogSuite) and "meteor_nltk" in suite.columns
    DIALOG.update(suite, records, examples)
    expected = dialog_table(
        ["no way , pepperoni", "how cold ?"], [list(ex.references) for ex in examples], meteor="nltk"
    )
    assert suite.compute() == expected
    assert [DIALOG.titles[c] for c in ("nist2", "bleu4", "avg_len")] == ["N-2", "B-4", "avg len"]


def test_summary_records_keep_their_first_sentences_and_update_rouge():
    """The summary is the first ``output_sentences`` of the generation: 2 for XSum, 3 for CNN/DailyMail."""
    text = "The plan was approved. It starts next year. Nobody objected. The end."
    for task, summary in (
        ("xsum", "The plan was approved. It starts next year."),
        ("cnn_dailymail", "The plan was approved. It starts next year. Nobody objected."),
    ):
        split = split_of(task)
        extras = SUMMARY.record_extras(text, split)
        assert extras == {"summary": summary}
        records = [{"id": ex.idx, "text": text, **extras} for ex in split.examples]
        suite = SUMMARY.new_suite(eos_token_id=None, self_bleu_samples=None, meteor="nltk")
        assert isinstance(suite, SummarySuite) and SUMMARY.to_score(records) == []
        SUMMARY.update(suite, records, split.examples)
        expected = summary_table([summary] * len(records), [list(ex.references) for ex in split.examples])
        assert suite.compute() == expected
