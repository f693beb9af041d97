"""A rule-based English sentence splitter that works offline (nltk's punkt model is a download).

Where the paper needs sentences: a WebText prompt is the document's *first sentence* (paper §4.1), and a
summary is the first 3 (CNN/DailyMail) or 2 (XSum) sentences of the generated text (appendix "GPT-2
summarization experiments").

The rules, in the spirit of punkt's orthographic heuristics:

* A sentence ends at a run of terminators (``.``, ``!``, ``?``, ``…``; closing quotes and brackets after
  them stay with the sentence) followed by whitespace, when the next word (after any opening quote or
  bracket) starts with an upper-case letter, a digit or other non-lower-case text. A lower-case next word
  never starts a sentence (``"Really?" she asked``, ``Wait... what``, ``e.g. this``).
* After a single ``.``: a title before a name (``Mr.``, ``Dr.``, ``Gen.``, ...) and a single capital
  initial (``J. K. Rowling``) never end a sentence; another known abbreviation (``Inc.``, ``Jan.``,
  ``No.``, ``etc.``) or a dotted acronym (``U.S.``, ``p.m.``) ends one only before a common sentence
  starter (``The``, ``He``, ``But``, ...) and never before a digit (``No. 5``, ``Jan. 12``). Titles and
  abbreviations count only when capitalised, so ``the sun.`` and ``He sat.`` end sentences.
* Decimals (``3.5``) and dotted names (``example.com``) have no space after the dot and never split.
* A blank line (paragraph break) always ends a sentence, punctuated or not; a single newline does not.

``sentence_spans`` gives character offsets into the original text, so ``first_sentences`` returns an exact
prefix of the text (inner whitespace untouched) and ``text[end:]`` is exactly the rest.
"""

from __future__ import annotations

import re

from cblight.option_types import PositiveInt, check_arguments

__all__ = ["first_sentences", "sentence_spans", "split_first_sentence", "split_sentences"]

# Word lists as strings for readability (hence the noqa). Titles and abbreviations count only when
# capitalised ("Sun." the day, not "the sun."), except the always-lower-case Latin ones.
# Titles that precede a name: never the end of a sentence.
TITLES = frozenset(
    "mr mrs ms mx dr prof rev fr sr jr st gen sen rep gov lt col capt cpt sgt maj adm cmdr pres supt "
    "messrs mme mlle hon rt".split()
)
# Abbreviations that may also end a sentence (then the next word is a sentence starter).
ABBREVIATIONS = frozenset(
    "inc corp ltd co bros llc plc dept univ assn est no nos fig figs vol vols ed eds "
    "jan feb mar apr jun jul aug sep sept oct nov dec mon tue tues wed thu thur thurs fri sat sun "
    "ave blvd rd hwy mt ft ste apt".split()
)
LOWER_CASE_ABBREVIATIONS = frozenset("etc vs al approx cf ca pp viz".split())
# Words that commonly open a sentence: after an abbreviation or acronym they signal a boundary.
SENTENCE_STARTERS = frozenset(
    "the a an he she it they we i you his her its their our my your this that these those there here "
    "but and or so yet in on at for with after before when while if as although though however "
    "meanwhile still then now what why how who where which some many most all both each every one two "
    "mr mrs ms dr police officials authorities".split()
)

_END = re.compile(r"(?:[.!?]+|…+)[.!?…]*['\"’”)\]]*(?=\s|$)")
_PARAGRAPH = re.compile(r"\n[^\S\n]*\n")
_ACRONYM = re.compile(r"(?:[A-Za-z]\.)+[A-Za-z]")
_OPENERS = "\"'“‘([{"
# after a terminator: the whitespace, then any opening quotes and brackets, before the next word
_GAP = re.compile(r"\s*[\"'“‘(\[{]*")
_WORD = re.compile(r"[\w'’-]+")


def _is_boundary(text: str, match: re.Match[str]) -> bool:
    pos = _GAP.match(text, match.end()).end()  # always a match, maybe empty
    if pos == len(text):
        return True
    nxt = text[pos]
    if nxt.islower():
        return False
    if match.group(0).rstrip("'\"’”)]") != ".":
        return True  # !, ?, ellipses: the case of the next word decides
    start = match.start()
    while start > 0 and not text[start - 1].isspace():
        start -= 1
    prev = text[start : match.start()].lstrip(_OPENERS)
    if not prev:
        return True
    low = prev.lower()
    capitalised = prev[0].isupper()
    if (capitalised and low in TITLES) or (len(prev) == 1 and prev.isupper()):
        return False
    if (capitalised and low in ABBREVIATIONS) or low in LOWER_CASE_ABBREVIATIONS or _ACRONYM.fullmatch(prev):
        if nxt.isdigit():
            return False
        word = _WORD.match(text, pos)
        return word is not None and word.group(0).lower() in SENTENCE_STARTERS
    return True


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` character offsets of each sentence, leading and trailing whitespace excluded.

    Args:
        text: English text.

    Returns:
        One span per sentence, in order.

    Examples:
        >>> sentence_spans("Dr. Smith arrived at 3.5 p.m. on Jan. 12. He sat down.")
        [(0, 41), (42, 54)]
    """
    ends = {m.end() for m in _END.finditer(text) if _is_boundary(text, m)}
    ends |= {m.start() for m in _PARAGRAPH.finditer(text)} | {len(text)}
    spans, start = [], 0
    for end in sorted(ends):
        piece = text[start:end]
        s, e = start + len(piece) - len(piece.lstrip()), start + len(piece.rstrip())
        if e > s:
            spans.append((s, e))
        start = end
    return spans


def split_sentences(text: str) -> list[str]:
    """The sentences of ``text``, each stripped of surrounding whitespace.

    Args:
        text: English text.

    Returns:
        The sentences in order.

    Examples:
        >>> split_sentences('Dr. Smith arrived at 3.5 p.m. on Jan. 12. He sat down. "Really?" she asked.')
        ['Dr. Smith arrived at 3.5 p.m. on Jan. 12.', 'He sat down.', '"Really?" she asked.']
    """
    return [text[s:e] for s, e in sentence_spans(text)]


def first_sentences(text: str, n: PositiveInt) -> str:
    """The text of the first ``n`` sentences, exactly as written (a summary's first 3 or 2 sentences, appendix
    "GPT-2 summarization experiments").

    Args:
        text: English text.
        n: how many sentences to keep (positive).

    Returns:
        The prefix of ``text`` (leading whitespace dropped) that holds them; the whole text if it has
        fewer, ``""`` if it has none.

    Examples:
        >>> first_sentences("One. Two.  Three.", 2)
        'One. Two.'
    """
    check_arguments(first_sentences, {"n": n})
    spans = sentence_spans(text)[:n]
    return text[spans[0][0] : spans[-1][1]] if spans else ""


def split_first_sentence(text: str) -> tuple[str, str]:
    """``(first sentence, rest)`` with ``first + rest == text.lstrip()``: the rest keeps its leading space
    (a WebText prompt is the document's first sentence, paper §4.1).

    Args:
        text: English text.

    Returns:
        The first sentence and the rest of the text.

    Examples:
        >>> split_first_sentence("It rained. We stayed in.")
        ('It rained.', ' We stayed in.')
    """
    start, end = (sentence_spans(text) or [(0, 0)])[0]  # no sentence: an empty one at the start
    return text[start:end], text[end:]
