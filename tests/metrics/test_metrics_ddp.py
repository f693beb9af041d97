"""Two CPU processes (gloo): every metric's synced ``compute()`` equals its single-process value.

Rank ``r`` takes examples ``r, r+2, ...`` of an odd-sized corpus (uneven shards), and one metric is fed on
rank 0 only (a rank without data must not break the gather). The official METEOR (the METEOR 1.5 jar,
scored on the first rank and broadcast) takes part where Java and the jar are there (CI installs both).
"""

import math
import random

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from cblight.metrics import (
    ROUGE,
    ContextSensitivity,
    CorpusBLEU,
    CorpusNIST,
    LongRangeRepetition,
    Meteor,
    NGramDiversity,
    NltkCorpusBLEU,
    NltkCorpusNIST,
    NltkMeteor,
    RepetitionRate,
    ResponseLength,
    SelfBLEU,
    ZipfCoefficient,
    generated_token_log_probs,
)
from cblight.metrics.dialog_meteor import official_meteor_missing

WORLD = 2
K = 4


def corpus():
    rng = random.Random(0)
    words = ["the", "a", "cat", "dog", "sat", "on", "mat", "is", "big", "I", "you", ",", "."]
    docs = [[rng.randrange(30) for _ in range(rng.randrange(5, 120))] for _ in range(11)]
    docs[3] = [1, 2, 3] * 8  # ends in a repetition
    hyps = [" ".join(rng.choice(words) for _ in range(rng.randrange(0, 12))) for _ in range(11)]
    refs = [
        [" ".join(rng.choice(words) for _ in range(rng.randrange(1, 12))) for _ in range(1 + i % 3)]
        for i in range(11)
    ]
    ctxs = [[rng.randrange(50000) for _ in range(rng.randrange(1, 12))] for _ in range(11)]
    gens = [[rng.randrange(50000) for _ in range(rng.randrange(0, 30))] for _ in range(11)]
    return docs, hyps, refs, ctxs, gens


def compute_all(shard, n_shards, model_dir, thresholds):
    """Every metric over this shard; under an initialised process group ``compute()`` syncs."""
    from cblight.models import load_causal_lm

    docs, hyps, refs, ctxs, gens = corpus()
    mine = list(range(shard, len(docs), n_shards))
    token_metrics = {
        "lr": LongRangeRepetition(ns=(10, 50)),
        "zipf": ZipfCoefficient(),
        "rep": RepetitionRate(),
        "self_bleu": SelfBLEU(n_sample=None),
    }
    text_metrics = {
        "bleu": CorpusBLEU(orders=(2, 4)),
        "nist": CorpusNIST(orders=(2, 4)),
        "nltk_bleu": NltkCorpusBLEU(orders=(2, 4)),
        "nltk_nist": NltkCorpusNIST(orders=(2, 4)),
        "nltk_meteor": NltkMeteor(use_synonyms=False),
        "rouge": ROUGE(),
    }
    if official_meteor_missing() is None:
        text_metrics["meteor"] = Meteor()
    hyp_metrics = {"div": NGramDiversity(), "len": ResponseLength()}
    rank0_only = NGramDiversity()
    coherence = ContextSensitivity(*thresholds)
    model = load_causal_lm(model_dir)
    for lo in range(0, len(mine), 2):  # two examples per update, as batches would come
        idx = mine[lo : lo + 2]
        for m in token_metrics.values():
            m.update([docs[i] for i in idx])
        for m in text_metrics.values():
            if isinstance(m, ROUGE):
                m.update([hyps[i] for i in idx], [refs[i][0] for i in idx])
            else:
                m.update([hyps[i] for i in idx], [refs[i] for i in idx])
        for m in hyp_metrics.values():
            m.update([hyps[i] for i in idx])
        if shard == 0:
            rank0_only.update([hyps[i] for i in idx])
        # One document per forward pass: a document's float32 log-probs then do not depend on which other
        # documents share its padded batch, which differs between the sharded and the single-process run
        # (batched, ppl differed by 1.5e-8 relative: float32 matmuls over other shapes, not the sync).
        scored = [generated_token_log_probs(model, [ctxs[i]], [gens[i]], k=K)[0] for i in idx]
        coherence.update([f for f, _ in scored], [s for _, s in scored])
    out = {}
    for name, m in {**token_metrics, **text_metrics, **hyp_metrics, "coherence": coherence}.items():
        value = m.compute()
        values = value if isinstance(value, dict) else {"": value}
        out.update({f"{name}/{k}": float(v) for k, v in values.items()})
    out.update({f"rank0_only/{k}": float(v) for k, v in rank0_only.compute().items()})
    return out


def _worker(rank, init_file, model_dir, thresholds, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        torch.save(compute_all(rank, WORLD, model_dir, thresholds), f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_synced_values_equal_single_process(tiny_gpt2_dir, tmp_path):
    from cblight.models import load_causal_lm

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        # thresholds inside the random model's probability range, so LTF counts something
        _, _, _, ctxs, gens = corpus()
        scored = generated_token_log_probs(load_causal_lm(str(tiny_gpt2_dir)), ctxs, gens, k=K)
        p_full = torch.cat([f for f, _ in scored]).exp()
        p_short = torch.cat([s for _, s in scored]).exp()
        thresholds = (float(p_full.quantile(0.3)) * 1.0001, float(p_short.quantile(0.7)) * 0.9999)
        single = compute_all(0, 1, str(tiny_gpt2_dir), thresholds)
    finally:
        torch.set_num_threads(before)
    mp.spawn(
        _worker,
        args=(str(tmp_path / "rendezvous"), str(tiny_gpt2_dir), thresholds, str(tmp_path)),
        nprocs=WORLD,
        join=True,
    )
    # the rank-0-only metric: its single-process value is that of shard 0 alone
    docs, hyps, *_ = corpus()
    alone = NGramDiversity()
    alone.update([hyps[i] for i in range(0, len(docs), WORLD)])
    single.update({f"rank0_only/{k}": float(v) for k, v in alone.compute().items()})
    assert 0 < single["coherence/ltf"] < 1
    assert single["rep/"] > 0 and single["bleu/bleu2"] > 0
    assert ("meteor/" in single) == (official_meteor_missing() is None)
    for rank in range(WORLD):
        synced = torch.load(tmp_path / f"rank{rank}.pt")
        assert synced.keys() == single.keys()
        for key, value in single.items():
            assert math.isfinite(value), key
            # Every state is an integer count or a float64 sum of identical per-example values: the synced
            # and single-process results differ only in float64 summation order, at most n * 2^-53 relative
            # for n < 2000 summands (2.2e-13); ppl = exp(mean nll) scales that by the mean nll (~11 nats of a
            # random model): 2.4e-12. 1e-11 leaves a 4x margin and still catches any float32 path (~1e-7).
            assert synced[key] == pytest.approx(value, rel=1e-11, abs=1e-12), key
        for key in ("lr/lr_10", "lr/lr_50", "coherence/ltf", "bleu/bleu2", "bleu/bleu4", "rep/"):
            assert synced[key] == single[key], key
