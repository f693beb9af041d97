"""A tiny random GPT-2 built locally, for the offline demo, the tests and the speed benchmarks.

Nothing here downloads anything: the model uses the real GPT-2 tokenizer files bundled in
``cblight/assets/gpt2-tokenizer`` (byte-identical to the Hub's ``gpt2`` tokenizer), and is written with
``save_pretrained`` so every consumer loads it through ``from_pretrained``. (The tests' tiny Llama, BOS and
rotary positions, is built in tests/helpers.py.)
"""

from __future__ import annotations

from pathlib import Path

import torch

GPT2_TOKENIZER_DIR = Path(__file__).parent / "assets" / "gpt2-tokenizer"


def gpt2_tokenizer():
    """The bundled real GPT-2 tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(GPT2_TOKENIZER_DIR))


def build_tiny_gpt2(
    out_dir: str | Path,
    *,
    n_layer: int = 2,
    n_embd: int = 32,
    n_head: int = 2,
    n_positions: int = 256,
    seed: int = 0,
) -> Path:
    """A random GPT-2 (absolute positions) with GPT-2's real 50257-token vocabulary."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = gpt2_tokenizer()
    tok.model_max_length = n_positions
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=len(tok),
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_positions=n_positions,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.eos_token_id,
    )
    GPT2LMHeadModel(config).save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return Path(out_dir)
