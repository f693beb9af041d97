"""AG News (paper §5, Table 4): topic of a news article.

As the reference (authors' repo, ``tasks/agn.py``, ``AGNews.standardize`` and ``get_contrast_ctx``):
``"Title: {Title}\\nSummary: {Description}\\nTopic:"``, answers `` World``, `` Sports``, `` Business``,
`` Science`` for the 1-based ``Class Index`` 1-4, premise-free context `` Topic:``. Title and description
are used verbatim (the files' ``\\`` line-break escapes and ``#36;``-style entities included, as pandas
reads them).

AG News has no validation split: test (7600) is reported and alpha* is chosen on a fixed-seed sample of
the training split as large as the test split, which is what the reference's ``main.py`` does for a task
with a test but no validation split (its "pseudo-validation").

Data: the original CSVs only (``train.csv``, ``test.csv``), with the ``Class Index,Title,Description``
header row (the common copy, as the reference's ``pd.read_csv`` expects) or without one (Zhang et al.'s
``ag_news_csv``). Hub ``fancyzhx/ag_news`` stores title and description joined into one ``text`` field,
so the prompt cannot be rebuilt from it; it is refused with a pointer to the CSVs.
"""

from __future__ import annotations

from pathlib import Path

from cblight.data.examples import ChoiceExample
from cblight.data.registry import RenderContext, TaskSpec, register
from cblight.data.sources import DataSource, LocalFiles, SourceRecord, read_csv

NAME = "agnews"
COLUMNS = ("Class Index", "Title", "Description")
TOPICS = ("World", "Sports", "Business", "Science")


def read_agnews(path: Path) -> list[SourceRecord]:
    return read_csv(path, required_columns=COLUMNS, headerless=COLUMNS)


def render(record: SourceRecord, idx: int, ctx: RenderContext) -> ChoiceExample:
    title = record.get("Title", NAME)
    description = record.get("Description", NAME)
    return ChoiceExample.build(
        NAME,
        idx,
        record.where,
        context=f"Title: {title}\nSummary: {description}\nTopic:",
        premise_free=" Topic:",
        answers=TOPICS,
        label=record.integer("Class Index", NAME) - 1,
    )


SPEC = register(
    TaskSpec(
        name=NAME,
        kind="multiple_choice",
        title="AGNews",
        prompt="Title: {title}\\nSummary: {description}\\nTopic: -> ' World' | ' Sports' | ' Business' | ' Science'",
        premise_free="' Topic:'",
        source=DataSource(
            local=LocalFiles(
                files={"train": ("train.csv", "*train*.csv"), "test": ("test.csv", "*test*.csv")},
                reader=read_agnews,
                hint="Use the original AG News CSVs train.csv and test.csv (Class Index,Title,Description).",
            ),
            hub_refusal="the hub copy fancyzhx/ag_news joins title and description into one field, so the "
            "paper's 'Title: ...\\nSummary: ...' prompt cannot be rebuilt from it. Pass data_dir=<folder with "
            "the original AG News train.csv and test.csv (Class Index,Title,Description)>, e.g. --data.data_dirs "
            "'{agnews: /data/ag_news_csv}'.",
        ),
        report_split="test",
        selection_split="train",
        sample_selection=True,
        render=render,
        sizes={"test": 7600, "train": 120000},
        aliases=("agn", "ag_news"),
        reference="tasks/agn.py (AGNews.standardize, get_contrast_ctx); main.py pseudo-validation",
    )
)
