"""Shared by the tuning tests: prompts, a tiny CPU trainer and module, rollouts and a brute-force reference."""

from functools import partial
from pathlib import Path

import lightning as L
import torch

from cblight.batching import left_pad
from cblight.boosting import log_softmax32
from cblight.options import Boosting
from cblight.scoring import Encoder
from cblight.tune.coherence_tuning import CoherenceTuning
from cblight.tune.export import ExportOptions
from cblight.tune.loss import Sampled, sampled_token_mask
from cblight.tune.rollouts import sample_sequences
from cblight.tune.validation import ValidationOptions
from tests.helpers import ROOT

RUN_PROMPTS = [
    "The quick brown fox jumps over the lazy dog",
    "A journey of a thousand miles begins",
    "Question: what is the capital of France? Answer:",
    "She opened the door because the bell rang",
    "Title: Markets rally. Summary:",
    "This quote has a tone that is",
]


def tiny_trainer(max_steps, tmp_path, callbacks=(), **kwargs):
    """A quiet one-process Trainer whose run directory is the test's own ``tmp_path``: a run locks its
    directory, and tests in parallel workers must not share the working directory."""
    return L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=bool(callbacks),
        callbacks=list(callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        num_sanity_val_steps=0,
        **kwargs,
    )


def tiny_tuning(path, **kwargs):
    defaults = dict(
        model=str(path),
        boosting=Boosting(k=3, alpha=-0.5),
        max_new_tokens=6,
        optimizer=partial(torch.optim.Adam, lr=1e-3),
        export=ExportOptions(enabled=False),
        validation=ValidationOptions(log_samples_every_n_steps=0),
    )
    return CoherenceTuning(**{**defaults, **kwargs})


SAMPLE_PROMPTS = ["The quick brown fox jumps over the lazy dog", "", "A journey of a thousand miles begins"]


def sample_rollouts(model, tok, prompts, max_new_tokens=10, seed=0):
    enc = Encoder(tok)
    ids, mask = left_pad([enc.context(p) for p in prompts], tok.pad_token_id, "cpu")
    torch.manual_seed(seed)
    return sample_sequences(
        model,
        ids,
        mask,
        max_new_tokens=max_new_tokens,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )


def with_early_eos(sampled: Sampled, eos: int) -> Sampled:
    """Row 0 ends with an EOS after two sampled tokens (followed by junk that must be ignored)."""
    seqs = sampled.sequences.clone()
    seqs[0, sampled.prompt_width + 2] = eos
    return Sampled(
        seqs,
        sampled.attention_mask,
        sampled.prompt_width,
        sampled_token_mask(seqs, sampled.prompt_width, eos),
    )


def reference_terms(model, tok, sampled, k, alpha, teacher_model=None):
    """Per-position (teacher log-probs as constants, student log-probs with gradient), one unpadded forward
    per prefix and per short window."""
    prefix = Encoder(tok).prefix
    teacher_model = teacher_model or model
    rows, cols = torch.nonzero(sampled.sampled, as_tuple=True)
    students, teachers, long = [], [], []
    for r, c in zip(rows.tolist(), cols.tolist()):
        start = int((sampled.attention_mask[r] == 0).sum())
        context = sampled.sequences[r, start:c].view(1, -1)
        students.append(log_softmax32(model(input_ids=context).logits[0, -1]))
        with torch.no_grad():
            full = log_softmax32(teacher_model(input_ids=context).logits[0, -1])
            if context.shape[1] - len(prefix) > k:
                window = torch.tensor([prefix + sampled.sequences[r, c - k : c].tolist()])
                short = log_softmax32(teacher_model(input_ids=window).logits[0, -1])
                long.append(True)
            else:
                short = full
                long.append(False)
            teachers.append(torch.log_softmax((1 - alpha) * full + alpha * short, -1))
    return torch.stack(teachers), torch.stack(students), torch.tensor(long)


TUNE_CONFIG = str(ROOT / "configs" / "coherence_tuning.yaml")


# the collapse guard off: a run without validation is refused while it is on
GUARD_OFF = ["--model.guard.max_ppl_ratio", "null", "--model.guard.min_entropy_ratio", "null"]


def tune_args(model: str | Path, prompts: Path, *extra: str, guard: bool = False) -> list[str]:
    """A tiny tuning run on a prompts file (every path under the test's directory), without validation and
    so, unless ``guard``, with the collapse guard switched off."""
    return [
        "tune", "-c", TUNE_CONFIG, "--model.model", str(model), "--model.boosting.k", "3",
        "--model.max_new_tokens", "5", "--model.validation.log_samples_every_n_steps", "1",
        "--data.task", "null", "--data.prompts_file", str(prompts), "--data.batch_size", "2",
        "--data.val_size", "0", "--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false", *([] if guard else GUARD_OFF), *extra,
    ]  # fmt: skip
