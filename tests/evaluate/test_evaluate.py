"""evaluate.py end to end on a tiny random GPT-2 and the bundled demo data.

Every reported number is recomputed independently: multiple-choice accuracies from the per-example
predictions file and log-likelihoods from a naive one-example-at-a-time model loop; LAMBADA's whole
(k, alpha) grid from a naive loop over the model on each full and short context.
"""

import json
import math
from pathlib import Path

import pytest
import torch

from cblight.cli import evaluate_cli
from cblight.data.registry import RenderContext, get_task
from cblight.data.sources import read_jsonl
from cblight.models import load_causal_lm, load_tokenizer
from cblight.scoring import Encoder
from tests.helpers import EVAL_QUIET_CPU

DEMO = Path(__file__).resolve().parents[2] / "cblight" / "assets" / "demo_data"
KS = [1, 3, 6]
NT_ALPHAS = [0.0, -0.5, -1.0, -2.0]


def run(args, out: Path):
    return evaluate_cli(
        ["--data.data_root", str(DEMO), "--model.output_dir", str(out), *EVAL_QUIET_CPU, *args]
    )


@pytest.fixture(scope="module")
def evaluated(tiny_gpt2_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("eval")
    run(
        [
            "--model.model",
            str(tiny_gpt2_dir),
            "--data.tasks",
            "[copa, lambada]",
            "--data.batch_size",
            "3",
            "--model.batch_size",
            "4",
            "--model.ks",
            json.dumps(KS),
            "--model.next_token_alphas",
            json.dumps(NT_ALPHAS),
        ],
        out,
    )
    return out


def naive_logprobs(model, ids):
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)


def test_results_files(evaluated):
    results = json.loads((evaluated / "results.json").read_text())
    assert set(results["tasks"]) == {"copa", "lambada"}
    copa = results["tasks"]["copa"]
    assert copa["report"]["split"] == "validation" and copa["report"]["n"] == 10
    assert copa["selection"]["split"] == "train sample of 10 (seed 1234)"
    assert len(copa["selection"]["indices"]) == 10
    assert len(copa["sweep"]["alphas"]) == 701 and len(copa["sweep"]["report_acc"]) == 701
    for key in ("acc", "acc_base", "acc_pmi", "alpha_star", "acc_stderr"):
        assert key in copa["report"]
    lam = results["tasks"]["lambada"]
    assert lam["report"]["k_star"] in KS and lam["report"]["alpha_star"] in NT_ALPHAS
    assert (evaluated / "plots" / "copa.png").stat().st_size > 1000
    assert (evaluated / "plots" / "lambada.png").stat().st_size > 1000
    assert "copa" in results["summary"] and "lambada" in results["summary"]
    metrics = (next((evaluated / "logs").glob("version_*")) / "metrics.csv").read_text()
    assert "test/copa/acc" in metrics and "val/copa/alpha_star" in metrics and "test/lambada/acc" in metrics


def test_copa_accuracies_recomputed_from_predictions(evaluated):
    results = json.loads((evaluated / "results.json").read_text())["tasks"]["copa"]
    rows = [
        json.loads(line)
        for line in (evaluated / "predictions" / "copa.validation.jsonl").read_text().splitlines()
    ]
    assert len(rows) == 10

    def acc(alpha):
        hits = 0
        for r in rows:
            scores = [f + alpha * s for f, s in zip(r["ll_full"], r["ll_short"])]
            hits += scores.index(max(scores)) == r["label"]
        return hits / len(rows)

    rep = results["report"]
    assert rep["acc_base"] == pytest.approx(acc(0.0))
    assert rep["acc_pmi"] == pytest.approx(acc(-1.0))
    assert rep["acc"] == pytest.approx(acc(rep["alpha_star"]))
    for alpha, value in list(zip(results["sweep"]["alphas"], results["sweep"]["report_acc"]))[::50]:
        assert value == pytest.approx(acc(alpha))
    assert rep["acc_stderr"] == pytest.approx(math.sqrt(rep["acc"] * (1 - rep["acc"]) / 10))

    # alpha* is the first best alpha of the selection curve, recomputed from the selection cache
    cache = [
        json.loads(x) for x in (evaluated / "cache/copa/train-sample/rank0.jsonl").read_text().splitlines()
    ]
    assert sorted(r["id"] for r in cache) == results["selection"]["indices"]

    def sel_acc(alpha):
        return sum(
            max(range(2), key=lambda j: (r["ll_full"][j] + alpha * r["ll_short"][j], -j)) == r["label"]
            for r in cache
        ) / len(cache)

    curve = [sel_acc(a) for a in results["sweep"]["alphas"]]
    assert curve == pytest.approx(results["sweep"]["selection_acc"])
    assert rep["alpha_star"] == results["sweep"]["alphas"][curve.index(max(curve))]


def test_copa_log_likelihoods_match_naive_model_loop(evaluated, tiny_gpt2_dir):
    model = load_causal_lm(str(tiny_gpt2_dir))
    enc = Encoder(load_tokenizer(str(tiny_gpt2_dir)))
    spec = get_task("copa")
    records = read_jsonl(DEMO / "copa" / "val.jsonl")
    rows = {
        r["id"]: r
        for r in map(json.loads, (evaluated / "predictions/copa.validation.jsonl").read_text().splitlines())
    }
    for idx, rec in enumerate(records):
        ex = spec.render(rec, idx, RenderContext(split="validation"))
        for j, choice in enumerate(ex.choices):
            for ctx_text, key in ((ex.context, "ll_full"), (ex.premise_free, "ll_short")):
                ctx, cont = enc.pair(ctx_text, choice)
                lp = naive_logprobs(model, ctx + cont[:-1])
                ref = sum(float(lp[len(ctx) - 1 + t, tok]) for t, tok in enumerate(cont))
                # float32 log-probs of a batched, shared-context forward vs a lone one differ by ~1e-6
                # per token; a few tokens summed stay far below 1e-4
                assert rows[idx][key][j] == pytest.approx(ref, abs=1e-4)


def test_lambada_grid_matches_naive_loop(evaluated, tiny_gpt2_dir):
    results = json.loads((evaluated / "results.json").read_text())["tasks"]["lambada"]
    model = load_causal_lm(str(tiny_gpt2_dir))
    enc = Encoder(load_tokenizer(str(tiny_gpt2_dir)))
    spec = get_task("lambada")
    records = read_jsonl(DEMO / "lambada" / "test.jsonl")
    hits = torch.zeros(len(KS), len(NT_ALPHAS), dtype=torch.float64)  # counts: exact in float64
    logp = torch.zeros(len(KS), len(NT_ALPHAS), dtype=torch.float64)
    short_target = torch.zeros(len(records), len(KS))
    base_hits = 0
    for idx, rec in enumerate(records):
        ids = enc.context(spec.render(rec, idx, RenderContext(split="test")).text)
        ctx, target = ids[:-1], ids[-1]
        full = naive_logprobs(model, ctx)[-1]
        base_hits += int(full.argmax()) == target
        for i, k in enumerate(KS):
            short = naive_logprobs(model, ctx[-k:])[-1]
            short_target[idx, i] = float(short[target])
            for j, a in enumerate(NT_ALPHAS):
                mixed = full + a * short
                hits[i, j] += int(mixed.argmax()) == target
                logp[i, j] += float(torch.log_softmax(mixed, -1)[target])
    n = len(records)
    assert results["report"]["n"] == n
    assert results["report"]["acc_base"] == pytest.approx(base_hits / n)
    # accuracy = count / n in float64 on both sides: exact
    assert results["sweep"]["report_acc"] == (hits / n).tolist()
    # perplexity sums float32 log-probs of a batched forward vs a one-at-a-time one (~1e-6 apart each);
    # exp of their mean moves by ~1e-6 relative, so 1e-4 leaves 100x room
    torch.testing.assert_close(
        torch.tensor(results["sweep"]["report_ppl"], dtype=torch.float64),
        torch.exp(-logp / n),
        rtol=1e-4,
        atol=0,
    )
    rows = [json.loads(x) for x in (evaluated / "predictions/lambada.test.jsonl").read_text().splitlines()]
    assert {"full_rank", "short_rank", "boosted_rank", "target"} <= set(rows[0])
    # the short-context log-prob of the target, as multiple-choice rows carry ll_short. The file holds the
    # batched, left-padded float32 forward and the reference one context at a time: they differ only in
    # float32 summation order (~1e-6 on log-probs of magnitude ~10), so 1e-4 absolute leaves 100x room
    by_id = {r["id"]: r for r in rows}
    got = torch.tensor([by_id[i]["short_log_prob"] for i in range(len(records))])
    torch.testing.assert_close(got, short_target, rtol=0, atol=1e-4)
    k_star = rows[0]["k_star"]
    assert [by_id[i]["short_log_prob_k_star"] for i in range(len(records))] == got[
        :, KS.index(k_star)
    ].tolist()


def copy_cache(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src / "cache", dst / "cache")
    return dst


def test_rerun_with_new_grid_needs_no_model(evaluated, tiny_gpt2_dir, tmp_path, monkeypatch):
    import cblight.evaluator as base

    def refuse(*args, **kwargs):
        raise AssertionError("the model must not be loaded when every example is cached")

    monkeypatch.setattr(base, "build_causal_lm", refuse)
    res = run(
        [
            "--model.model",
            str(tiny_gpt2_dir),
            "--data.tasks",
            "[copa]",
            "--model.choice_alphas",
            "[0.5, 0.0, -0.25, -1.0, -3.0]",
        ],
        copy_cache(evaluated, tmp_path / "rerun"),
    )
    assert res["copa"]["sweep"]["alphas"] == [0.5, 0.0, -0.25, -1.0, -3.0]


def test_interrupted_run_resumes(evaluated, tiny_gpt2_dir, tmp_path, monkeypatch):
    from cblight.scoring import Scorer

    out = copy_cache(evaluated, tmp_path / "resume")
    shard = out / "cache/copa/validation/rank0.jsonl"
    lines = shard.read_text().splitlines()
    shard.write_text("\n".join(lines[:4]) + "\n" + lines[4][:20])  # 4 whole records and a torn line
    scored = []
    original = Scorer.score_text

    def counting(self, groups, names=None):
        scored.extend(names or [])
        return original(self, groups, names)

    monkeypatch.setattr(Scorer, "score_text", counting)
    res = run(["--model.model", str(tiny_gpt2_dir), "--data.tasks", "[copa]"], out)
    assert len(scored) == 2 * 6  # the 6 missing validation examples, full and premise-free; nothing else

    def lls(path):
        return {
            r["id"]: (r["ll_full"], r["ll_short"]) for r in map(json.loads, path.read_text().splitlines())
        }

    resumed = lls(out / "predictions/copa.validation.jsonl")
    original = lls(evaluated / "predictions/copa.validation.jsonl")
    assert resumed.keys() == original.keys()
    for idx, (full, short) in original.items():
        # the resumed run batches these examples differently: float32 results move by ~1e-6
        assert resumed[idx][0] == pytest.approx(full, abs=1e-5) and resumed[idx][1] == pytest.approx(
            short, abs=1e-5
        )
    assert res["copa"]["report"]["n"] == 10


@pytest.mark.distributed
def test_ddp_two_processes_match_one(evaluated, tiny_gpt2_dir, tmp_path):
    """Two CPU processes (gloo): the sampler pads 9 examples to 10 with a repeat; deduplication by example id
    must give exactly the single-process numbers."""
    import subprocess
    import sys

    args = [
        "--model.model",
        str(tiny_gpt2_dir),
        "--data.tasks",
        "[copa, lambada]",
        "--data.limit",
        "5",
        "--data.batch_size",
        "2",
        "--model.ks",
        json.dumps(KS),
        "--model.next_token_alphas",
        json.dumps(NT_ALPHAS),
    ]
    single = run(args, copy_cache(evaluated, tmp_path / "single"))  # cached: no model calls needed
    out = tmp_path / "ddp"
    cmd = [
        sys.executable,
        "evaluate.py",
        *args,
        "--data.data_root",
        str(DEMO),
        "--model.output_dir",
        str(out),
    ]
    cmd += ["--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp"]
    cmd += ["--trainer.enable_progress_bar", "false"]
    proc = subprocess.run(
        cmd, cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(list((out / "cache/copa/validation").glob("rank*.jsonl"))) == 2  # both ranks did work
    ddp = json.loads((out / "results.json").read_text())["tasks"]
    for task in ("copa", "lambada"):
        assert ddp[task]["report"]["n"] == 5
        for key, value in single[task]["report"].items():
            assert ddp[task]["report"][key] == (
                pytest.approx(value) if isinstance(value, float) else value
            ), key
        for key in ("report_acc", "selection_acc"):
            torch.testing.assert_close(
                torch.tensor(ddp[task]["sweep"][key]), torch.tensor(single[task]["sweep"][key])
            )


def _bad(args, tmp_path, capsys, match):
    out = tmp_path / "bad"
    with pytest.raises(SystemExit) as exc:
        run(args, out)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert match in err, err
    assert not (out / "results.json").exists()


def test_bad_input_is_one_clear_line(tiny_gpt2_dir, tmp_path, capsys):
    model = ["--model.model", str(tiny_gpt2_dir)]
    _bad([*model, "--data.tasks", "[nope]"], tmp_path, capsys, "unknown task 'nope'")
    _bad(
        ["--model.model", str(tmp_path / "missing"), "--data.tasks", "[copa]"],
        tmp_path,
        capsys,
        "no directory",
    )
    _bad(
        [*model, "--data.tasks", "[copa]", "--model.choice_alphas", "[]"],
        tmp_path,
        capsys,
        "alpha grid is empty",
    )
    _bad([*model, "--data.tasks", "[lambada]", "--model.ks", "[0, 2]"], tmp_path, capsys, "model.ks")
    _bad(
        [*model, "--data.tasks", "[lambada]", "--data.data_files", "{lambada: {test: /no/such.jsonl}}"],
        tmp_path,
        capsys,
        "data file for split 'test' not found",
    )
    copa = tmp_path / "copa"
    copa.mkdir()
    (copa / "train.jsonl").write_text((DEMO / "copa" / "train.jsonl").read_text())
    dirs = ["--data.tasks", "[copa]", "--data.data_dirs", json.dumps({"copa": str(copa)})]
    (copa / "val.jsonl").write_text(
        '{"premise": "It rained.", "choice1": "a", "choice2": "b", "question": "effect"\n'
    )
    _bad([*model, *dirs], tmp_path, capsys, "line 1 is not valid JSON")
    (copa / "val.jsonl").write_text(
        '{"premise": "It rained.", "choice1": "a", "choice2": "b", "question": "effect"}\n'
    )
    _bad([*model, *dirs], tmp_path, capsys, "val.jsonl line 1 has no field 'label'")
    (copa / "val.jsonl").write_text(
        '{"premise": "It rained.", "choice1": "", "choice2": "b", "question": "effect", "label": 0}\n'
    )
    _bad([*model, *dirs], tmp_path, capsys, "empty answer choice")
    (copa / "val.jsonl").write_text(
        '{"premise": "It rained.", "choice1": "a", "choice2": "b", "question": "effect", "label": 7}\n'
    )
    _bad([*model, *dirs], tmp_path, capsys, "label at")
    long_choice = " ".join(["word"] * 20)
    (copa / "val.jsonl").write_text(
        json.dumps(
            {
                "premise": "It rained.",
                "choice1": long_choice,
                "choice2": "b",
                "question": "effect",
                "label": 0,
            }
        )
    )
    _bad([*model, *dirs, "--model.max_length", "8"], tmp_path, capsys, "more than the model window of 8")
