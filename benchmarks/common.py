"""Helpers shared by the benchmark scripts: a GPT-2-small-shaped random model and synthetic prompts."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

WORDS = (
    "the of and to in a is that for it as was with be by on not he this are or his from at which but have an "
    "they you were her all she there would their we him been has when who will more no if out so said what up "
    "its about into than them can only other new some could time these two may then do first any my now such "
    "like our over man me even most made after also did many before must through back years where much your way "
    "well down should because each just those people how too little state good very make world still own see men "
    "work long get here between both life being under never day same another know while last might us great old "
    "year off come since against go came right used take three"
).split()


def sentence(rng: random.Random, n_words: int) -> str:
    words = [rng.choice(WORDS) for _ in range(n_words)]
    return " ".join(words).capitalize() + "."


def gpt2_small_dir(path: str | Path, n_positions: int = 1024) -> Path:
    """A randomly initialised GPT-2 small (124M: 12 layers, 768 wide) with the real GPT-2 tokenizer."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from cblight.tiny import gpt2_tokenizer

    path = Path(path)
    if (path / "config.json").exists():
        return path
    torch.manual_seed(0)
    tok = gpt2_tokenizer()
    model = GPT2LMHeadModel(GPT2Config(n_positions=n_positions, pad_token_id=tok.eos_token_id))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def best_of(fn: Callable[[], object], repeats: int = 3) -> tuple[float, object]:
    """Minimum wall time over ``repeats`` runs (and the last result)."""
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return min(times), out


def median(xs: list[float]) -> float:
    return statistics.median(xs)
