"""The offline sentence splitter on real text, and fitting prompts into a token budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cblight.data.examples import DataError, GenerationExample
from cblight.data.sentences import first_sentences, sentence_spans, split_first_sentence, split_sentences
from cblight.truncation import fit_example, fit_prompt

SAMPLES = Path(__file__).resolve().parents[1] / "fixtures"


def test_lambada_passage_real_text():
    text = json.loads((SAMPLES / "lambada/test.jsonl").read_text().splitlines()[0])["text"]
    assert split_sentences(text) == [
        "In my palm is a clear stone, and inside it is a small ivory statuette.",
        "A guardian angel.",
        '"Figured if you\'re going to be out at night getting hit by cars, you might as well have some backup."',
        "I look at him, feeling stunned.",
        "Like this is some sort of sign.",
        "But as I stare at Harlin, his mouth curved in a confident grin, I don't care about signs",
    ]


def test_quotes_with_questions_inside_a_sentence():
    text = json.loads((SAMPLES / "lambada/test.jsonl").read_text().splitlines()[2])["text"]
    sentences = split_sentences(text)
    assert sentences[1] == '"What can I say?"'
    assert sentences[5] == '"No insurance?" she wailed.'  # lower-case after ?" : same sentence


def test_webtext_first_sentence_and_exact_remainder():
    text = json.loads((SAMPLES / "webtext/webtext.test.jsonl").read_text().splitlines()[0])["text"]
    first, rest = split_first_sentence(text)
    assert first == "Is this restaurant family-friendly?"
    assert first + rest == text
    assert rest.startswith(" Yes No Unsure\n\nDoes")


@pytest.mark.parametrize("text,expected", [
    ("Mr. Smith went to Washington. He arrived at 5 p.m. Monday.",
     ["Mr. Smith went to Washington.", "He arrived at 5 p.m. Monday."]),
    ("The U.S. economy grew 3.5 percent in Jan. 2020. It moved to the U.S. The next year was calm.",
     ["The U.S. economy grew 3.5 percent in Jan. 2020.", "It moved to the U.S.", "The next year was calm."]),
    ('He said "Stop." Then he left. "Why?" she asked.', ['He said "Stop."', "Then he left.", '"Why?" she asked.']),
    ("Wait... what? It was over... The end!", ["Wait... what?", "It was over...", "The end!"]),
    ("J. K. Rowling wrote it. Apple Inc. makes phones. No. 5 is on example.com today.",
     ["J. K. Rowling wrote it.", "Apple Inc. makes phones.", "No. 5 is on example.com today."]),
    ("Dr. Jones (the surgeon) agreed. (He was tired.) Then rain.",
     ["Dr. Jones (the surgeon) agreed.", "(He was tired.)", "Then rain."]),
    ("A headline without a period\n\nThe story starts here. It ends here.",
     ["A headline without a period", "The story starts here.", "It ends here."]),
    ("He sat. Later the sun. Afterwards, etc. The end.", ["He sat.", "Later the sun.", "Afterwards, etc.", "The end."]),
    ("no terminator at all", ["no terminator at all"]),
    ("", []),
])  # fmt: skip
def test_rules(text, expected):
    assert split_sentences(text) == expected


def test_cnn_like_article_and_summary_truncation():
    article = json.loads((SAMPLES / "cnn_dailymail/test.jsonl").read_text())["article"]
    assert split_sentences(article)[:3] == [
        "(CNN) -- Mr. Smith, the mayor of the U.S. city of Springfield, said on Monday that the town would build "
        "a new bridge.",
        "The bridge will cost $3.5 million.",
        "Work starts in Jan. 2024, officials said.",
    ]
    generated = " The town will build a bridge. It costs $3.5 million.\nWork starts soon. Nobody objected."
    assert (
        first_sentences(generated, 3)
        == "The town will build a bridge. It costs $3.5 million.\nWork starts soon."
    )
    assert first_sentences(generated, 2) == "The town will build a bridge. It costs $3.5 million."
    assert first_sentences("Only one.", 3) == "Only one."
    with pytest.raises(ValueError):
        first_sentences(generated, 0)


def test_spans_index_the_original_text():
    text = "  One.  Two!\n\nThree?  "
    assert [text[s:e] for s, e in sentence_spans(text)] == ["One.", "Two!", "Three?"]


# -- fitting a prompt into the window ------------------------------------------------------------------------------


def test_fit_prompt_keeps_the_marker_and_cuts_the_article_end(gpt2_tokenizer):
    tok = gpt2_tokenizer
    article = "The first sentence matters. " + "Filler words go here. " * 30
    prompt = article.strip() + " TL;DR:"
    whole = tok(prompt)["input_ids"]
    assert (
        fit_prompt(tok, prompt, len(whole), keep_suffix=" TL;DR:", cut_from="end") == whole
    )  # fits: unchanged
    ids = fit_prompt(tok, prompt, 20, keep_suffix=" TL;DR:", cut_from="end")
    marker = tok(" TL;DR:")["input_ids"]
    assert len(ids) == 20 and ids[-len(marker) :] == marker
    assert (
        ids[: 20 - len(marker)] == tok(article.strip())["input_ids"][: 20 - len(marker)]
    )  # the beginning kept
    assert tok.decode(ids).startswith("The first sentence matters.")


def test_fit_prompt_cut_from_start_keeps_the_latest_turns(gpt2_tokenizer):
    tok = gpt2_tokenizer
    ex = GenerationExample(
        0, "old turn one<|endoftext|>old turn two<|endoftext|>latest turn<|endoftext|>", (), cut_from="start"
    )
    ids = fit_example(tok, ex, 4)
    assert ids == tok(ex.prompt)["input_ids"][-4:]
    assert tok.decode(ids).endswith("latest turn<|endoftext|>")


def test_fit_prompt_counts_llama_bos(tiny_llama_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_llama_dir))
    ids = fit_prompt(tok, "a b c d e f g h TL;DR:", 6, keep_suffix=" TL;DR:", cut_from="end")
    assert len(ids) <= 6 and ids[0] == tok.bos_token_id


def test_fit_prompt_errors(gpt2_tokenizer):
    with pytest.raises(DataError, match=r"leaves no room for the prompt"):
        fit_prompt(gpt2_tokenizer, "word " * 50 + " TL;DR:", 3, keep_suffix=" TL;DR:", cut_from="end")
    with pytest.raises(DataError, match=r"does not end with the marker"):
        fit_prompt(gpt2_tokenizer, "no marker here", 3, keep_suffix=" TL;DR:")
