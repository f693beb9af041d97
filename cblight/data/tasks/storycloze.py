"""StoryCloze 2016 (paper §5, Table 4): choose the right ending of a four-sentence story.

As the reference (authors' repo, ``tasks/storycloze.py``, ``StoryCloze.standardize`` and
``get_contrast_ctx``): the context is the four sentences joined by single spaces, each ending is scored as
``" " + ending``, and the premise-free context is ``<|endoftext|>`` alone (here: the tokenizer's BOS/EOS,
written ``""``). ``AnswerRightEnding`` is 1-based. Test (1871) is reported and alpha* is chosen on the
validation file (1871), as the reference's ``main.py`` does for a task with both splits.

Data: the original CSVs (``cloze_test_val__spring2016 - cloze_test_ALL_val.csv`` and
``cloze_test_test__spring2016 - cloze_test_ALL_test.csv``, distributed on request by the StoryCloze
authors) or a local copy in the ``LSDSem/story_cloze`` hub schema. The hub id itself cannot load:
it needs a loading script and a manual ``data_dir``, which datasets 5 refuses.
"""

from __future__ import annotations

from pathlib import Path

from cblight.data.examples import ChoiceExample
from cblight.data.registry import RenderContext, TaskSpec, register
from cblight.data.sources import DataSource, LocalFiles, SourceRecord, hub_layout, read_csv, read_records

NAME = "storycloze"
ORIGINAL = ("InputSentence1", "InputSentence2", "InputSentence3", "InputSentence4")
ORIGINAL_ENDINGS = ("RandomFifthSentenceQuiz1", "RandomFifthSentenceQuiz2")
HUB = ("input_sentence_1", "input_sentence_2", "input_sentence_3", "input_sentence_4")
HUB_ENDINGS = ("sentence_quiz1", "sentence_quiz2")


COLUMNS = ("InputStoryid", *ORIGINAL, *ORIGINAL_ENDINGS, "AnswerRightEnding")


def read_storycloze(path: Path) -> list[SourceRecord]:
    """The original CSVs (their header checked), or a copy in the hub schema (jsonl/parquet)."""
    return read_csv(path, required_columns=COLUMNS) if path.suffix == ".csv" else read_records(path)


def render(record: SourceRecord, idx: int, ctx: RenderContext) -> ChoiceExample:
    if "InputSentence1" in record.fields:
        sentences, endings, answer = ORIGINAL, ORIGINAL_ENDINGS, "AnswerRightEnding"
    else:
        sentences, endings, answer = HUB, HUB_ENDINGS, "answer_right_ending"
    return ChoiceExample.build(
        NAME,
        idx,
        record.where,
        context=" ".join(record.get(name, NAME) for name in sentences),
        premise_free="",
        answers=[record.get(name, NAME) for name in endings],
        label=record.integer(answer, NAME) - 1,
    )


SPEC = register(
    TaskSpec(
        name=NAME,
        kind="multiple_choice",
        title="StoryCloze",
        prompt="{sentence1} {sentence2} {sentence3} {sentence4} -> ' ' + ending",
        premise_free="BOS/EOS alone (the reference's <|endoftext|>)",
        source=DataSource(
            local=LocalFiles(
                files={
                    "validation": (
                        "cloze_test_val__spring2016*.csv",
                        "*spring2016*val*.csv",
                        "*ALL_val*.csv",
                        "validation.csv",
                        "val.csv",
                        *hub_layout("validation"),
                    ),
                    "test": (
                        "cloze_test_test__spring2016*.csv",
                        "*spring2016*test.csv",
                        "*ALL_test*.csv",
                        "test.csv",
                        *hub_layout("test"),
                    ),
                },
                reader=read_storycloze,
                hint="Put the StoryCloze 2016 CSVs there: 'cloze_test_val__spring2016 - cloze_test_ALL_val.csv' "
                "and 'cloze_test_test__spring2016 - cloze_test_ALL_test.csv'.",
            ),
            hub_refusal="StoryCloze is not on the Hub in a loadable form (LSDSem/story_cloze needs a loading "
            "script and a manual data_dir, which datasets refuses). Pass data_dir=<folder with the StoryCloze "
            "2016 CSVs 'cloze_test_val__spring2016 - cloze_test_ALL_val.csv' and "
            "'cloze_test_test__spring2016 - cloze_test_ALL_test.csv'> (e.g. --data.data_dirs "
            "'{storycloze: /data/storycloze}' or --data.data_root with a storycloze/ sub-folder).",
        ),
        report_split="test",
        selection_split="validation",
        render=render,
        sizes={"test": 1871, "validation": 1871},
        reference="tasks/storycloze.py (StoryCloze.standardize, get_contrast_ctx)",
    )
)
