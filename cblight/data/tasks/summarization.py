"""CNN/DailyMail and XSum zero-shot summaries (paper appendix "GPT-2 summarization experiments").

"We append the tokens TL;DR: at the end of each article ... let it continue generating 100 tokens with
greedy decoding. We take the first three sentences for CNN/DM articles and the first two sentences for XSum
articles as their summaries." The prompt is ``"{article} TL;DR:"`` (the article stripped); an article too
long for the window loses its *end*, the `` TL;DR:`` marker is kept (``GenerationExample.keep_suffix``
and ``cut_from="end"``, applied by ``cblight.truncation.fit_prompt``). The short context of boosting is
`` TL;DR:`` plus the summary so far (``short_prefix``). ``TaskSpec.output_sentences`` (3 / 2) says how
many sentences of the generated text form the summary (``cblight.data.sentences.first_sentences``).

Data: hub ``abisee/cnn_dailymail`` (3.0.0: ``article``, ``highlights``) and ``EdinburghNLP/xsum``
(``document``, ``summary``), test splits, or local copies in those schemas; also the preprocessed jsonl of
Zhong et al. (2020), which the paper used (``text`` and ``summary`` as lists of sentences: the article's
are joined by spaces, the summary's by newlines).
"""

from __future__ import annotations

from cblight.data.examples import DataError, GenerationExample
from cblight.data.registry import RenderContext, TaskSpec, register
from cblight.data.sources import DataSource, HubSplit, LocalFiles, SourceRecord, hub_layout

MARKER = " TL;DR:"


def _text(record: SourceRecord, names: tuple[str, ...], task: str, joiner: str) -> str:
    for name in names:
        if name in record.fields:
            value = record.get(name, task, str | list)
            if isinstance(value, list):
                if not all(isinstance(v, str) for v in value):
                    raise DataError(
                        f"{task}: field {name!r} at {record.where} should be text or a list of texts"
                    )
                value = joiner.join(value)
            return value
    raise DataError(f"{task}: record at {record.where} has none of the fields {list(names)}")


def _render(task: str, article_fields: tuple[str, ...], summary_fields: tuple[str, ...]):
    def render(record: SourceRecord, idx: int, ctx: RenderContext) -> GenerationExample:
        article = _text(record, article_fields, task, " ").strip()
        summary = _text(record, summary_fields, task, "\n").strip()
        if not article:
            raise DataError(f"{task}: empty article at {record.where}")
        return GenerationExample(
            idx=idx,
            prompt=article + MARKER,
            references=(summary,),
            where=record.where,
            human=None,
            keep_suffix=MARKER,
            cut_from="end",
            short_prefix=MARKER,
        )

    return render


def _spec(
    name: str, title: str, hub: HubSplit, fields: tuple[tuple[str, ...], tuple[str, ...]], **kw
) -> TaskSpec:
    return register(
        TaskSpec(
            name=name,
            kind="generation",
            title=title,
            prompt="{article} TL;DR: -> 100 greedy tokens",
            premise_free="' TL;DR:' + the summary so far",
            source=DataSource(
                hub={"test": hub},
                local=LocalFiles(
                    files={"test": ("test.jsonl", *hub_layout("test"))},
                    hint=f"Use a jsonl/parquet copy of {hub.path} (fields {fields[0][0]!r}, {fields[1][0]!r}).",
                ),
            ),
            report_split="test",
            selection_split=None,
            render=_render(name, *fields),
            max_new_tokens=100,
            reference="paper appendix 'GPT-2 summarization experiments' (no task file in the reference repo)",
            **kw,
        )
    )


CNN_DAILYMAIL = _spec(
    "cnn_dailymail",
    "CNN/DailyMail",
    HubSplit("abisee/cnn_dailymail", "3.0.0", "test"),
    (("article", "text"), ("highlights", "summary")),
    sizes={"test": 11490},
    output_sentences=3,
    aliases=("cnndm",),
)
XSUM = _spec(
    "xsum",
    "XSum",
    HubSplit("EdinburghNLP/xsum", None, "test"),
    (("document", "text"), ("summary",)),
    sizes={"test": 11334},
    output_sentences=2,
)
