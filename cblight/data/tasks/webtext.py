"""WebText completions (paper §4.1, Table 2): continue a document from its first sentence.

"A selection of 5000 articles from WebText is taken as a reference corpus of human-written text. A language
model is prompted to generate text conditioned only on the first sentence of each of these articles, up to
a maximum of 200 tokens." Data: ``webtext.test.jsonl`` of the GPT-2 output dataset
(github.com/openai/gpt-2-output-dataset; 5000 ``{"text": ...}`` documents), read locally.

Each document is split by the offline sentence splitter (``cblight.data.sentences``): the prompt is its first
sentence, and the reference, which is also the "Human" row of Table 2, is the rest of the document
verbatim (``prompt + reference`` is the document without its leading whitespace). The short expert is the
last k tokens (no fixed short prefix).
"""

from __future__ import annotations

from cblight.data.examples import DataError, GenerationExample
from cblight.data.registry import RenderContext, TaskSpec, register
from cblight.data.sentences import split_first_sentence
from cblight.data.sources import DataSource, LocalFiles, SourceRecord, hub_layout

NAME = "webtext"


def render(record: SourceRecord, idx: int, ctx: RenderContext) -> GenerationExample:
    first, rest = split_first_sentence(record.get("text", NAME))
    if not first:
        raise DataError(f"{NAME}: document at {record.where} is empty")
    return GenerationExample(idx=idx, prompt=first, references=(rest,), where=record.where, human=rest)


SPEC = register(
    TaskSpec(
        name=NAME,
        kind="generation",
        title="WebText",
        prompt="the document's first sentence -> up to 200 new tokens",
        premise_free="the last k tokens",
        source=DataSource(
            local=LocalFiles(
                files={
                    "test": ("webtext.test.jsonl", *hub_layout("test")),
                    # the other splits of the GPT-2 output dataset: prompt sources for coherence tuning
                    "train": ("webtext.train.jsonl", *hub_layout("train")),
                    "validation": ("webtext.valid.jsonl", *hub_layout("validation")),
                },
                hint="Use webtext.test.jsonl of github.com/openai/gpt-2-output-dataset.",
            ),
            hub_refusal="WebText is read from a local file: pass data_dir=<folder with webtext.test.jsonl of the "
            "GPT-2 output dataset (github.com/openai/gpt-2-output-dataset)>.",
        ),
        report_split="test",
        selection_split=None,
        render=render,
        sizes={"test": 5000},
        max_new_tokens=200,
        reference="paper §4.1 (no task file in the reference repo)",
    )
)
