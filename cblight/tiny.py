"""Tiny random causal LMs built locally, for the offline demo, the tests and the speed benchmarks.

Nothing here downloads anything: the GPT-2 model uses the real GPT-2 tokenizer files bundled in
``cblight/assets/gpt2-tokenizer`` (byte-identical to the Hub's ``gpt2`` tokenizer); the Llama model uses a
byte-level BPE tokenizer trained on the spot with ``tokenizers``, which adds BOS like Llama's does. Both are
written with ``save_pretrained`` so every consumer loads them through ``from_pretrained``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

GPT2_TOKENIZER_DIR = Path(__file__).parent / "assets" / "gpt2-tokenizer"

_DEFAULT_CORPUS = (
    "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step. "
    "Question: what is the capital of France? Answer: Paris. The answer is: yes. This quote has a tone that is "
    "positive. Title: Markets rally. Summary: Stocks rose on Monday. Topic: Business. TL;DR: it was fine. "
    "She opened the door because the bell rang, so he went home. Ballad metre is less regular than common metre."
)


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
    return _save(GPT2LMHeadModel(config), tok, out_dir)


def _save(model: Any, tok: Any, out_dir: str | Path) -> Path:
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return Path(out_dir)


def build_tiny_llama(
    out_dir: str | Path, *, hidden_size: int = 32, num_layers: int = 2, seed: int = 0
) -> Path:
    """A random Llama (rotary positions, grouped-query attention) with a byte-level BPE tokenizer trained
    on a short corpus, which starts every encoding with ``<s>`` as Llama's does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    core.train_from_iterator([_DEFAULT_CORPUS] * 4, trainer=trainer)
    core.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", core.token_to_id("<s>"))]
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="</s>"
    )
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    tok.model_max_length = 256
    return _save(LlamaForCausalLM(config), tok, out_dir)
