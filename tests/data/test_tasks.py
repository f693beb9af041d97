"""Rendered prompts of every benchmark, checked against the authors' own prompt code and by hand.

``fixtures/reference_renders.json`` holds what the authors' ``standardize``/``get_contrast_ctx`` produce
on our fixture records (``scripts/reference_renders.py`` regenerates it from their repo), so a change to
any prompt, premise-free context, answer string or label mapping fails here. A few cases are also spelled
out literally, for readability and for the details the reference gets wrong on purpose (BoolQ's ``??``).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from cblight.data.examples import ChoiceExample, GenerationExample, NextTokenExample
from cblight.data.registry import RenderContext, all_tasks, get_task
from cblight.data.sources import HubSplit, load_split_records

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GOLDEN = json.loads((FIXTURES / "reference_renders.json").read_text(encoding="utf-8"))
MULTIPLE_CHOICE = [
    "storycloze", "hellaswag", "copa", "csqa", "openbookqa", "arc_easy", "arc_challenge", "piqa",
    "sst2", "sst5", "agnews", "trec", "boolq", "rte", "cb",
]  # fmt: skip


def render_file(task: str, split: str, path: Path, ctx: RenderContext | None = None) -> list:
    spec = get_task(task)
    ctx = ctx or RenderContext(split=split)
    return [
        spec.render(r, i, ctx)
        for i, r in enumerate(load_split_records(task, split, spec.source, data_file=path))
    ]


def as_tuple(ex: ChoiceExample) -> dict:
    return {
        "context": ex.context,
        "premise_free": ex.premise_free,
        "choices": list(ex.choices),
        "label": ex.label,
    }


def test_the_paper_has_fifteen_multiple_choice_tasks_and_the_golden_file_covers_them():
    registered = {n for n, s in all_tasks().items() if s.kind == "multiple_choice"}
    assert registered == set(MULTIPLE_CHOICE)
    assert {case["task"] for case in GOLDEN} == set(MULTIPLE_CHOICE)


@pytest.mark.parametrize("case", GOLDEN, ids=lambda c: f"{c['task']}:{c['file']}")
def test_rendering_matches_the_reference_code(case):
    examples = render_file(case["task"], case["split"], FIXTURES / case["file"])
    assert [as_tuple(ex) for ex in examples] == case["examples"]


# -- literal spot checks (real records from the samples where one exists) ---------------------------------


def test_storycloze_real_record():
    ex = render_file(
        "storycloze", "test", FIXTURES / "storycloze/cloze_test_test__spring2016 - cloze_test_ALL_test.csv"
    )[0]
    assert ex.context == (
        "My friends all love to go to the club to dance. They think it's a lot of fun and always invite. "
        "I finally decided to tag along last Saturday. I danced terribly and broke a friend's toe."
    )
    assert ex.premise_free == ""  # BOS/EOS alone
    assert ex.choices == (
        " My friends decided to keep inviting me out as I am so much fun.",
        " The next weekend, I was asked to please stay home.",
    )
    assert ex.label == 1


def test_hellaswag_premise_free_cases():
    examples = render_file("hellaswag", "validation", FIXTURES / "hellaswag/hellaswag_val.jsonl")
    roof, wikihow, no_period = examples
    assert roof.context == "Roof shingle removal: A man is sitting on a roof. He"
    assert roof.premise_free == " He"
    assert roof.choices[3] == " starts pulling up roofing on a roof." and roof.label == 3
    assert wikihow.context == "Home and Garden: How to clean a fridge Take everything out."
    assert wikihow.premise_free == ""  # the context ends in '.': EOS alone
    # the reference strips before removing tags, so a tag-led ending keeps a space: scored as "  Throw..."
    assert wikihow.choices[:2] == ("  Throw away food that has gone bad.", "  Paint the fridge red.")
    assert (
        no_period.context == "Playing harmonica: A boy holds a harmonica Then he plays it loudly"
    )  # capitalize()
    assert no_period.premise_free == no_period.context  # no '.': the whole context


def test_copa_and_csqa_and_obqa_and_arc_real_records():
    copa = render_file("copa", "validation", FIXTURES / "copa/val.jsonl")[0]
    assert (copa.context, copa.premise_free, copa.choices, copa.label) == (
        "My body cast a shadow over the grass because",
        " because",
        (" the sun was rising.", " the grass was cut."),
        0,
    )
    csqa = render_file("csqa", "validation", FIXTURES / "csqa/dev_rand_split.jsonl")[0]
    assert csqa.context == (
        "A revolving door is convenient for two direction travel, but it also serves as a security "
        "measure at a what? the answer is:"
    )
    assert csqa.premise_free == " the answer is:"
    assert (
        csqa.choices == (" bank", " library", " department store", " mall", " new york") and csqa.label == 0
    )
    obqa = render_file("openbookqa", "test", FIXTURES / "openbookqa/test.jsonl")[0]
    assert obqa.context.endswith("they decide the best way to save money is to the answer is:")
    assert obqa.premise_free == " the answer is:" and obqa.label == 1
    arc = render_file("arc_challenge", "test", FIXTURES / "arc_challenge/ARC-Challenge-Test.jsonl")
    assert arc[0].context.startswith("Question: An astronomer observes") and arc[0].context.endswith(
        "?\nAnswer:"
    )
    assert arc[0].premise_free == " Answer:" and arc[0].label == 2
    assert arc[1].label == 2 and arc[1].choices[2] == " a copper wire"  # numeric keys 1-4


def test_piqa_labels_come_from_the_lst_file_and_solutions_stay_verbatim():
    examples = render_file("piqa", "validation", FIXTURES / "piqa/valid.jsonl")
    assert examples[1].context == "Question: dresser\nAnswer:"
    assert examples[1].premise_free == " Answer:"
    assert examples[1].choices == (" replace drawer with bobby pin ", " finish, woodgrain with  bobby pin ")
    assert [ex.label for ex in examples] == [0, 1]


def test_sst_answers_and_eos_from_the_tokenizer():
    sst2 = render_file("sst2", "test", FIXTURES / "sst2/stsa.binary.test")[0]
    assert sst2.context == "no movement , no yuks , not much of anything . This quote has a tone that is"
    assert sst2.premise_free == " This quote has a tone that is"
    assert sst2.choices == (" negative\n", " positive\n") and sst2.label == 0
    llama_like = RenderContext(split="test", eos_token="</s>", bos_token="<s>")
    sst5 = render_file("sst5", "test", FIXTURES / "sst5/stsa.fine.test", llama_like)[0]
    assert sst5.choices == (
        " very negative.</s>",
        " somewhat negative.</s>",
        " neutral.</s>",
        " somewhat positive.</s>",
        " very positive.</s>",
    )
    assert sst5.label == 1


def test_agnews_trec_real_records():
    agnews = render_file("agnews", "test", FIXTURES / "agnews/test.csv")[0]
    assert agnews.context == (
        "Title: Fears for T N pension after talks\nSummary: Unions representing workers at Turner   Newall say "
        "they are 'disappointed' after talks with stricken parent firm Federal Mogul.\nTopic:"
    )
    assert agnews.premise_free == " Topic:"
    assert agnews.choices == (" World", " Sports", " Business", " Science") and agnews.label == 2
    trec = render_file("trec", "test", FIXTURES / "trec/TREC_10.label")
    assert trec[1].context == "What county is Modesto, California in? The answer to this question will be"
    assert trec[1].premise_free == " The answer to this question will be"
    assert trec[1].choices == (
        " a description.",
        " an entity.",
        " a location.",
        " a number.",
        " an abbreviation.",
        " a person.",
    )
    assert [ex.label for ex in trec] == [3, 2, 5]  # NUM, LOC, HUM


def test_trec_training_file_with_a_latin1_byte():
    train = render_file("trec", "train", FIXTURES / "trec/train_5500.label")
    assert (
        train[3].context
        == 'What does "CNN" stand for in the Grünwald story? The answer to this question will be'
    )
    assert train[3].label == 4  # ABBR


def test_superglue_real_records_and_boolq_double_question_mark():
    boolq = render_file("boolq", "validation", FIXTURES / "boolq/val.jsonl")[1]
    assert boolq.context == (
        "Title: Drinking water -- Drinking water with meals is safe for most people.\n"
        " Question: Can I drink water after I eat??\n The answer is:"
    )
    assert boolq.premise_free == " Question: Can I drink water after I eat??\n The answer is:"
    assert boolq.choices == (" no", " yes") and boolq.label == 1
    rte = render_file("rte", "validation", FIXTURES / "rte/val.jsonl")[0]
    assert rte.premise_free == " question: Christopher Reeve had an accident. true or false?\n answer:"
    assert rte.context.endswith("Christopher Reeve Foundation.\n" + rte.premise_free)
    assert rte.choices == (" true", " false") and rte.label == 1  # not_entailment
    cb = render_file("cb", "validation", FIXTURES / "cb/val.jsonl")[1]
    assert cb.context == (
        " Given question: ``Who knows? The point is, do we go with it or not?'' Do we assume there is a shipment?"
        " Is there is a shipment true, false, or neither?\n The answer is:"
    )
    assert cb.premise_free == " Is there is a shipment true, false, or neither?\n The answer is:"
    assert cb.choices == (" true", " false", " neither") and cb.label == 2  # neutral


@pytest.mark.parametrize("task,split,original,hub", [
    ("boolq", "validation", "boolq/val.jsonl", "boolq/hub/validation.jsonl"),
    ("rte", "validation", "rte/val.jsonl", "rte/hub/validation.jsonl"),
    ("cb", "validation", "cb/val.jsonl", "cb/hub/validation.jsonl"),
    ("csqa", "validation", "csqa/dev_rand_split.jsonl", "csqa/hub/validation.jsonl"),
    ("openbookqa", "test", "openbookqa/test.jsonl", "openbookqa/hub/test.jsonl"),
    ("arc_easy", "validation", "arc_easy/ARC-Easy-Dev.jsonl", "arc_easy/hub/validation.jsonl"),
    ("piqa", "validation", "piqa/valid.jsonl", "piqa/hub/validation.jsonl"),
    ("sst2", "test", "sst2/stsa.binary.test", "sst2/hub/test.jsonl"),
    ("sst5", "test", "sst5/stsa.fine.test", "sst5/hub/test.jsonl"),
    ("trec", "test", "trec/TREC_10.label", "trec/hub/test.jsonl"),
    ("storycloze", "test", "storycloze/cloze_test_test__spring2016 - cloze_test_ALL_test.csv", "storycloze/hub/test.jsonl"),
    ("hellaswag", "validation", "hellaswag/hellaswag_val.jsonl", "hellaswag/hub/validation.jsonl"),
])  # fmt: skip
def test_original_files_and_hub_schema_render_the_same(task, split, original, hub):
    a = render_file(task, split, FIXTURES / original)
    b = render_file(task, split, FIXTURES / hub)
    assert [as_tuple(x) for x in a] == [as_tuple(x) for x in b]


# -- the hub path, offline: parquet files laid out like a hub repository -----------------------------------


@pytest.fixture
def hub_dir(tmp_path, monkeypatch):
    """Turn ``fixtures/<task>/hub/<split>.jsonl`` into ``<tmp>/<task>/data/<split>-00000-of-00001.parquet``,
    the layout ``datasets.load_dataset(<dir>)`` reads as a hub repository."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")

    def make(task: str) -> Path:
        root = tmp_path / task
        for path in sorted((FIXTURES / task / "hub").glob("*.jsonl")):
            rows = [json.loads(line) for line in path.open(encoding="utf-8")]
            out = root / "data" / f"{path.stem}-00000-of-00001.parquet"
            out.parent.mkdir(parents=True, exist_ok=True)
            datasets.Dataset.from_list(rows).to_parquet(str(out))
        return root

    return make


@pytest.mark.parametrize("task,split", [
    ("hellaswag", "validation"), ("copa", "validation"), ("csqa", "validation"), ("openbookqa", "test"),
    ("arc_challenge", "test"), ("piqa", "validation"), ("sst5", "test"), ("trec", "test"), ("boolq", "validation"),
    ("rte", "validation"), ("cb", "validation"),
])  # fmt: skip
def test_hub_loading_path_renders_like_the_local_copy(task, split, hub_dir):
    spec = get_task(task)
    assert split in spec.source.hub  # the real hub id is configured for this split
    local = hub_dir(task)
    source = replace(spec.source, hub={split: HubSplit(str(local), None, split)})
    records = load_split_records(task, split, source)
    assert records[0].where.endswith(f"{split} row 0")
    ctx = RenderContext(split=split)
    from_hub = [spec.render(r, i, ctx) for i, r in enumerate(records)]
    from_jsonl = render_file(task, split, FIXTURES / task / "hub" / f"{split}.jsonl")
    assert [as_tuple(x) for x in from_hub] == [as_tuple(x) for x in from_jsonl]


def test_local_parquet_copy_in_a_data_dir(hub_dir):
    local = hub_dir("copa")  # data/validation-00000-of-00001.parquet
    spec = get_task("copa")
    records = load_split_records("copa", "validation", spec.source, data_dir=local)
    assert records[0].where.endswith("validation-00000-of-00001.parquet row 0")
    assert (
        spec.render(records[0], 0, RenderContext()).context == "My body cast a shadow over the grass because"
    )


# -- next-token and generation tasks ---------------------------------------------------------------------------


def test_lambada_test_passages_as_the_reference_preprocesses_them():
    ex = render_file("lambada", "test", FIXTURES / "lambada/test.jsonl")[1]
    assert isinstance(ex, NextTokenExample)
    assert ex.text == (
        "\nGive me a minute to change and I'll meet you at the docks.\" She'd forced those words through her "
        'teeth.\n\n"No need to change. We won\'t be that long."\n\nShane gripped her arm and started leading her '
        'to the dock.\n\n"I can make it there on my own, Shane'
    )
    validation = get_task("lambada").render(
        load_split_records(
            "lambada", "test", get_task("lambada").source, data_file=FIXTURES / "lambada/test.jsonl"
        )[1],
        1,
        RenderContext(split="validation"),
    )
    assert validation.text.startswith("Give me a minute")  # only the test split is preprocessed


def test_lama_prompt_and_filter(gpt2_tokenizer):
    from cblight.data.tasks.lama import keep, prepare_prompt

    ex = render_file("lama", "test", FIXTURES / "lama/P19/test.jsonl")[0]
    assert ex.text == "Melanie Durrant was born in Toronto" and ex.answer == " Toronto"
    assert prepare_prompt("Rome", "The capital of [X] is [Y] .") == "The capital of Rome is"
    # "Melanie Durrant was born in" is 7 GPT-2 tokens; " Toronto" is one
    assert len(gpt2_tokenizer("Melanie Durrant was born in")["input_ids"]) == 7
    assert keep(ex, gpt2_tokenizer, 6) and not keep(ex, gpt2_tokenizer, 7)
    two_tokens = replace(ex, text="Melanie Durrant was born in Mississauga", answer=" Mississauga")
    assert len(gpt2_tokenizer(" Mississauga")["input_ids"]) > 1 and not keep(two_tokens, gpt2_tokenizer, 1)


def test_webtext_prompt_is_the_first_sentence():
    docs = render_file("webtext", "test", FIXTURES / "webtext/webtext.test.jsonl")
    first, second = docs
    assert isinstance(first, GenerationExample)
    assert first.prompt == "Is this restaurant family-friendly?"
    assert first.references[0].startswith(" Yes No Unsure\n\nDoes this restaurant")
    assert first.human == first.references[0] and first.short_prefix == ""
    assert second.prompt == "Mr. Smith arrived in the U.S. on Jan. 5 with $3.5 million."
    assert (
        second.prompt + second.human
        == json.loads((FIXTURES / "webtext/webtext.test.jsonl").read_text().splitlines()[1])["text"]
    )


def test_dstc7_jsonl_and_both_multi_reference_layouts():
    ctx = RenderContext(split="test", eos_token="<|endoftext|>")
    a, b = render_file("dstc7", "test", FIXTURES / "dstc7/test.jsonl", ctx)
    assert a.turns == ("what is the best pizza topping ?", "pineapple , obviously")
    assert a.prompt == "what is the best pizza topping ?<|endoftext|>pineapple , obviously<|endoftext|>"
    assert a.human == "pineapple is a crime"  # the second reference is held out, as DSTC7's --vshuman 1
    assert a.references == ("no way , pepperoni wins", "mushrooms all the way")
    assert a.short_prefix == "<|endoftext|>" and a.cut_from == "start"
    assert b.turns == ("has anyone been to iceland ?", "yes , it was cold")  # START dropped
    assert b.human == "i want to go" and b.references == ("how cold ?", "did you see the lights ?")
    refs = render_file("dstc7", "test", FIXTURES / "dstc7/refs/test.refs.txt", ctx)
    assert refs[0].turns == a.turns and refs[0].human == a.human and refs[0].references == a.references
    assert refs[1].human == "it is cold" and refs[1].references == ("yes ",)  # text up to the next '|'
    official = render_file("dstc7", "test", FIXTURES / "dstc7/official/test.refs", ctx)
    assert [ex.turns for ex in official] == [("has anyone been to iceland ?",), a.turns]  # keys-file order
    assert official[1].references == a.references and official[1].human == a.human


def test_summaries_keep_the_marker_and_cut_the_article_end():
    cnn = render_file("cnn_dailymail", "test", FIXTURES / "cnn_dailymail/test.jsonl")[0]
    assert cnn.prompt.startswith("(CNN) -- Mr. Smith") and cnn.prompt.endswith("found cracks. TL;DR:")
    assert cnn.keep_suffix == " TL;DR:" and cnn.cut_from == "end" and cnn.short_prefix == " TL;DR:"
    assert cnn.references == ("Springfield will build a new bridge .\nIt will cost $3.5 million .",)
    assert get_task("cnn_dailymail").output_sentences == 3 and get_task("xsum").output_sentences == 2
    xsum = render_file("xsum", "test", FIXTURES / "xsum/test.jsonl")[0]
    matchsum = render_file("xsum", "test", FIXTURES / "xsum/matchsum/test.jsonl")[0]
    assert xsum.prompt == "The council approved the plan on Tuesday.\nIt will take effect next year. TL;DR:"
    assert (
        matchsum.prompt == "the council approved the plan on tuesday . it will take effect next year . TL;DR:"
    )
    assert matchsum.references == ("a council has approved a new plan .",)


def test_aliases_resolve_to_the_same_spec():
    assert get_task("agn") is get_task("agnews")
    assert get_task("commonsense_qa") is get_task("csqa")
