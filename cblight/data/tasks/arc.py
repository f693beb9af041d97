"""ARC-Easy and ARC-Challenge (paper §5, Table 4): grade-school science questions.

As the reference (authors' repo, ``tasks/arc.py``, ``ARCEasy.standardize`` and ``get_contrast_ctx``):
``"Question: {question}\\nAnswer:"``, each choice scored as ``" " + choice``, the premise-free context
`` Answer:``. The reference maps numeric answer keys ``1``-``5`` to ``A``-``E`` and takes the key's
position in ``ABCDE``; here the label is the key's position among the question's own choice labels (the
same index, since ARC lists its choices in label order; it also holds for the rare 3- and 5-choice
questions). Test is reported and alpha* chosen on validation. Data: hub ``allenai/ai2_arc``
(``ARC-Easy``/``ARC-Challenge``) or the original ``ARC-*-{Train,Dev,Test}.jsonl``.
"""

from __future__ import annotations

from cblight.data.examples import ChoiceExample
from cblight.data.registry import RenderContext, TaskSpec, register
from cblight.data.sources import DataSource, HubSplit, LocalFiles, SourceRecord, hub_layout

NUMBER_TO_LETTER = {"1": "A", "2": "B", "3": "C", "4": "D", "5": "E"}


def _letter(key: str) -> str:
    return NUMBER_TO_LETTER.get(key, key)


def _render(task: str):
    def render(record: SourceRecord, idx: int, ctx: RenderContext) -> ChoiceExample:
        question, texts, labels = record.qa_fields(task, "question")
        return ChoiceExample.build(
            task,
            idx,
            record.where,
            context=f"Question: {question}\nAnswer:",
            premise_free=" Answer:",
            answers=texts,
            label=record.key_index("answerKey", task, [_letter(lab) for lab in labels], _letter),
        )

    return render


def _spec(name: str, config: str, sizes: dict[str, int], aliases: tuple[str, ...]) -> TaskSpec:
    return register(
        TaskSpec(
            name=name,
            kind="multiple_choice",
            title=config,
            prompt="Question: {question}\\nAnswer: -> ' ' + choice",
            premise_free="' Answer:'",
            source=DataSource(
                hub={s: HubSplit("allenai/ai2_arc", config, s) for s in ("train", "validation", "test")},
                local=LocalFiles(
                    files={
                        "train": (f"{config}-Train.jsonl", *hub_layout("train")),
                        "validation": (f"{config}-Dev.jsonl", *hub_layout("validation")),
                        "test": (f"{config}-Test.jsonl", *hub_layout("test")),
                    },
                    hint=f"Use the original {config}-{{Train,Dev,Test}}.jsonl or the hub schema.",
                ),
            ),
            report_split="test",
            selection_split="validation",
            render=_render(name),
            sizes=sizes,
            aliases=aliases,
            reference="tasks/arc.py (ARCEasy.standardize, get_contrast_ctx; ARCChallenge)",
        )
    )


EASY = _spec("arc_easy", "ARC-Easy", {"test": 2376, "validation": 570, "train": 2251}, ("arc-e",))
CHALLENGE = _spec(
    "arc_challenge", "ARC-Challenge", {"test": 1172, "validation": 299, "train": 1119}, ("arc-c",)
)
