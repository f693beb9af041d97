"""The lm-evaluation-harness model against independent references.

* alpha = 0: lm-eval's own HF backend (``HFLM``) on the same tiny model and requests (log-likelihoods,
  greedy flags, rolling perplexity windows, ``generate_until``), and whole ``simple_evaluate`` runs;
* boosted: ``HFLM`` scores of the full and the short request combined by hand, greedy flags from a naive
  per-position loop, and ``evaluate.py`` on the same COPA examples;
* the short-context rules against cblight's own premise-free contexts, and lm-eval's task names;
* ``cblight lmeval`` (the command of docs/tutorials/lmeval.md): output files, ``--use_cache``, one-line errors.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from cblight.data.registry import RenderContext, get_task
from cblight.data.sources import load_split_records
from cblight.lmeval import TASKS_DIR
from cblight.lmeval.contexts import RULES, TASK_RULES, ShortContextError, rule_for
from tests.helpers import FIXTURES, ROOT

DEMO = ROOT / "cblight" / "assets" / "demo_data"

# Log-likelihood sums of a few float32 token log-probs (|ll| < 100) computed in different batch shapes
# (cblight: left-padded groups sharing a KV cache; HFLM: right-padded rows): float32 rounding of the
# logits is ~1e-6 relative, so sums agree to ~1e-5; 1e-4 leaves a margin and still catches any real
# difference (a wrong token or boundary moves a sum by > 1e-2 on these models).
LL_TOL = 1e-4

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------------------
# Short-context rules (pure Python, no lm-eval)


@pytest.mark.parametrize("task", ["piqa", "arc_easy", "arc_challenge", "hellaswag", "copa"])
def test_rules_reproduce_cblight_premise_free_contexts(task):
    """Where lm-eval's prompt is cblight's, the rule gives back cblight's premise-free context exactly."""
    spec = get_task(task)
    records = load_split_records(spec.name, spec.report_split, spec.source, data_dir=FIXTURES / task)
    examples = [spec.render(r, i, RenderContext(split=spec.report_split)) for i, r in enumerate(records)]
    assert examples
    rule = TASK_RULES[task]
    for ex in examples:
        assert RULES[rule](ex.context) == ex.premise_free


def test_rules_on_lmeval_prompts():
    few_shot = "Question: a?\nAnswer: b\n\nQuestion: what holds water?\nAnswer:"
    assert RULES["answer_cue"](few_shot) == " Answer:"
    boolq = "Passage text.\nMore of it.\nQuestion: is the sky blue?\nAnswer:"
    assert RULES["question"](boolq) == " Question: is the sky blue?\nAnswer:"
    assert RULES["connector"]("The man broke his toe therefore") == " therefore"
    assert RULES["after_last_period"]("Skiing: A man waits. He then") == " He then"
    assert RULES["after_last_period"]("Skiing: A man waits.") == ""
    assert RULES["empty"]("anything") == ""


def test_rule_errors_are_one_line():
    with pytest.raises(ShortContextError) as err:
        rule_for("premise_free", "mmlu_anatomy")
    assert "mmlu_anatomy" in str(err.value) and "premise_free_rule=" in str(err.value)
    assert "\n" not in str(err.value)
    assert rule_for("premise_free", "mmlu_anatomy", "answer_cue") == "answer_cue"
    assert rule_for("last_k", "anything") == "last_k" and rule_for("empty", None) == "empty"
    with pytest.raises(ShortContextError, match="answer_cue"):
        RULES["answer_cue"]("no line break here")
    with pytest.raises(ShortContextError, match="Question:"):
        RULES["question"]("Passage\nAnswer:")


def test_mapped_task_names_are_lmeval_tasks():
    """Every lm-eval name of the mapping is a task lm-eval ships (read from its YAMLs, not indexed)."""
    import lm_eval

    names = set()
    for path in Path(lm_eval.__file__).parent.joinpath("tasks").rglob("*.yaml"):
        names.update(re.findall(r"^task:\s*(\S+)\s*$", path.read_text(errors="ignore"), flags=re.M))
    ours = {p.stem for p in TASKS_DIR.glob("*.yaml")}
    for task in TASK_RULES:
        assert task in names or task in ours, task


# ---------------------------------------------------------------------------------------------------------
# Model level: alpha = 0 equals lm-eval's HF backend


def instance(args, task="demo", idx=0, kind="loglikelihood"):
    from lm_eval.api.instance import Instance

    return Instance(request_type=kind, doc={}, arguments=args, idx=idx, metadata=(task, idx, 1))


PAIRS = [
    ("Question: what is the capital of France?\nAnswer:", " Paris"),
    ("Question: what is the capital of France?\nAnswer:", " Paris is a large city."),
    ("Question: what is the capital of France?\nAnswer: ", "Lyon"),  # trailing space moves over
    ("She opened the door because", " the bell rang"),
    ("", " The quick brown fox"),  # lm-eval's unconditional request
    ("A journey of a thousand miles begins with a single step. " * 3 + "The", " end"),
]


@pytest.fixture(scope="module")
def lms(tiny_model_dir):
    from lm_eval.models.huggingface import HFLM

    from cblight.lmeval.model import CblightLM

    hf = HFLM(pretrained=str(tiny_model_dir), dtype="float32", device="cpu", batch_size=1)
    ours = CblightLM(pretrained=str(tiny_model_dir), device="cpu", batch_size=4)
    return hf, ours, tiny_model_dir


def test_loglikelihood_alpha0_equals_hf_backend(lms):
    hf, ours, _ = lms
    reqs = [instance(p, idx=i) for i, p in enumerate(PAIRS)]
    theirs = hf.loglikelihood(reqs, disable_tqdm=True)
    mine = ours.loglikelihood(reqs)
    diff = max(abs(a[0] - b[0]) for a, b in zip(mine, theirs))
    assert diff < LL_TOL, diff
    assert [g for _, g in mine] == [g for _, g in theirs]


def test_rolling_and_generation_alpha0_equal_hf_backend(lms):
    hf, ours, _ = lms
    long_text = "The quick brown fox jumps over the lazy dog. " * 40  # > 256 tokens: several windows
    reqs = [
        instance((t,), idx=i, kind="loglikelihood_rolling") for i, t in enumerate(["Hello world.", long_text])
    ]
    theirs = hf.loglikelihood_rolling(reqs, disable_tqdm=True)
    mine = ours.loglikelihood_rolling(reqs)
    assert mine == pytest.approx(theirs, abs=10 * LL_TOL)  # sums over ~450 tokens
    gen = [
        instance(
            ("Question: what is the capital of France?\nAnswer:", {"until": ["."], "max_gen_toks": 6}), idx=0
        ),
        instance(("She", {"until": ["\n"], "max_gen_toks": 5, "do_sample": False}), idx=1),
    ]
    assert ours.generate_until(gen) == hf.generate_until(gen, disable_tqdm=True)


# ---------------------------------------------------------------------------------------------------------
# Model level: boosted requests against HFLM scores combined by hand and a naive greedy loop


def naive_boosted_greedy(model, ctx, short, cont, alpha):
    """Every continuation token is the argmax of log f(.|ctx, cont<j) + alpha log f(.|short, cont<j)."""
    with torch.no_grad():
        full = torch.log_softmax(model(torch.tensor([ctx + cont[:-1]])).logits[0].float(), -1)
        sh = torch.log_softmax(model(torch.tensor([short + cont[:-1]])).logits[0].float(), -1)
    mixed = full[len(ctx) - 1 :] + alpha * sh[len(short) - 1 :]
    return bool((mixed.argmax(-1) == torch.tensor(cont)).all())


@pytest.mark.parametrize("mode", ["last_k", "empty", "premise_free"])
def test_boosted_loglikelihood_matches_reference(lms, mode):
    from cblight.lmeval.model import CblightLM

    hf, _, model_dir = lms
    alpha, k = -0.7, 3
    lm = CblightLM(pretrained=str(model_dir), alpha=alpha, k=k, short_context=mode, batch_size=3)
    # premise_free under the piqa rule (answer_cue) needs an answer cue; unconditional requests stay unboosted
    pairs = [p for p in PAIRS if p[0] and (mode != "premise_free" or "\n" in p[0])]
    reqs = [instance(p, task="piqa", idx=i) for i, p in enumerate(pairs)]
    got = lm.loglikelihood(reqs)
    tok = hf.tokenizer
    adds_bos = tok("a")["input_ids"][0] == tok.bos_token_id
    for (ctx, cont), (ll, greedy) in zip(pairs, got):
        full, full_greedy = hf.loglikelihood([instance((ctx, cont))], disable_tqdm=True)[0]
        ctx_ids, cont_ids = hf._encode_pair(ctx, cont)
        if mode == "last_k":
            short_ids = ctx_ids[:1] + ctx_ids[1:][-k:] if adds_bos else ctx_ids[-k:]
            short = hf._loglikelihood_tokens([((ctx, cont), short_ids, cont_ids)], disable_tqdm=True)[0][0]
            short_cont = cont_ids
        else:
            text = "" if mode == "empty" else RULES["answer_cue"](ctx)
            short = hf.loglikelihood([instance((text, cont))], disable_tqdm=True)[0][0]
            if text == "":
                short_ids, short_cont = [hf.prefix_token_id], hf.tok_encode(cont, add_special_tokens=False)
            else:
                short_ids, short_cont = hf._encode_pair(text, cont)
        assert ll == pytest.approx(full + alpha * short, abs=LL_TOL)
        if short_cont == cont_ids:
            assert greedy == naive_boosted_greedy(lm.model, ctx_ids, short_ids, cont_ids, alpha)
        else:  # the short request splits the continuation differently: the full context's flag
            assert greedy == full_greedy


def test_boosted_leaves_unconditional_requests_alone(lms):
    from cblight.lmeval.model import CblightLM

    hf, _, model_dir = lms
    lm = CblightLM(pretrained=str(model_dir), alpha=-1.0, short_context="empty")
    req = [instance(("", " The quick brown fox"))]
    expected = hf.loglikelihood(req, disable_tqdm=True)[0][0]
    assert lm.loglikelihood(req)[0][0] == pytest.approx(expected, abs=LL_TOL)


def test_bad_options_and_tasks_without_rules(lms):
    from cblight.errors import CblightError
    from cblight.lmeval.model import CblightLM

    _, _, model_dir = lms
    with pytest.raises(CblightError, match="short_context must be one of"):
        CblightLM(pretrained=str(model_dir), short_context="window")
    with pytest.raises(CblightError, match="unknown --model_args for model cblight: temprature"):
        CblightLM(pretrained=str(model_dir), temprature=0.5)
    lm = CblightLM(pretrained=str(model_dir), alpha=-1.0, short_context="premise_free")
    with pytest.raises(
        ShortContextError, match="no premise-free context is defined for lm-eval task 'mmlu_x'"
    ):
        lm.loglikelihood([instance(("Q?\nAnswer:", " A"), task="mmlu_x")])
    with pytest.raises(CblightError, match="generate_until boosts with short_context=last_k only"):
        lm.generate_until([instance(("Q", {"until": ["."]}))])
    # the token budget: the one check boosted decoding makes (prompt_room), naming lm-eval's option and the fix
    ours, window = lms[1], lms[1].max_length
    fix = f"max_gen_toks={window} leaves no room for a prompt .* window of {window} tokens; set max_gen_toks to {window - 1}"
    with pytest.raises(CblightError, match=fix):
        ours.generate_until([instance(("Q", {"until": ["."], "max_gen_toks": window}))])


# ---------------------------------------------------------------------------------------------------------
# Whole lm-eval runs on a local task over local files


@pytest.fixture(scope="module")
def task_manager():
    from lm_eval.tasks import TaskManager

    # only cblight's local tasks: indexing lm-eval's thousands of built-in tasks costs ~20 s per manager
    return TaskManager(include_path=str(TASKS_DIR), include_defaults=False)


def run_copa(task_manager, model, model_args):
    import lm_eval

    import cblight.lmeval.model  # noqa: F401  (registers "cblight")

    out = lm_eval.simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=["cblight_copa"],
        task_manager=task_manager,
        batch_size=4,
        device="cpu",
        log_samples=True,
    )
    samples = sorted(out["samples"]["cblight_copa"], key=lambda s: s["doc_id"])
    return out["results"]["cblight_copa"], [[r[0][0] for r in s["resps"]] for s in samples]


@pytest.fixture(scope="module")
def copa_runs(tiny_gpt2_dir, task_manager):
    d = str(tiny_gpt2_dir)
    return {
        "hf": run_copa(task_manager, "hf", f"pretrained={d},dtype=float32"),
        "plain": run_copa(task_manager, "cblight", f"pretrained={d}"),
        "pmi": run_copa(task_manager, "cblight", f"pretrained={d},alpha=-1,short_context=empty"),
        "boosted": run_copa(task_manager, "cblight", f"pretrained={d},alpha=-0.5,short_context=premise_free"),
    }


def test_simple_evaluate_alpha0_equals_hf_backend(copa_runs):
    (hf, hf_lls), (ours, our_lls) = copa_runs["hf"], copa_runs["plain"]
    for metric in ("acc,none", "acc_norm,none", "acc_mutual_info,none"):
        assert ours[metric] == hf[metric], metric
    diff = max(abs(a - b) for x, y in zip(our_lls, hf_lls) for a, b in zip(x, y))
    assert diff < LL_TOL, diff
    # alpha = -1 with the empty short context is lm-eval's own acc_mutual_info (PMI)
    assert copa_runs["pmi"][0]["acc,none"] == hf["acc_mutual_info,none"]


def test_simple_evaluate_boosted_equals_evaluate_py(copa_runs, tiny_gpt2_dir, tmp_path):
    from cblight.cli import evaluate_cli

    out = tmp_path / "eval"
    evaluate_cli(
        [
            "--model.model", str(tiny_gpt2_dir),
            "--data.data_root", str(DEMO),
            "--data.tasks", "[copa]",
            "--model.choice_alphas", "[0.0, -0.5, -1.0]",
            "--model.output_dir", str(out),
            "--trainer.accelerator", "cpu",
            "--trainer.enable_progress_bar", "false",
        ]
    )  # fmt: skip
    result = json.loads((out / "results.json").read_text())["tasks"]["copa"]
    curve = dict(zip(result["sweep"]["alphas"], result["sweep"]["report_acc"]))
    rows = [json.loads(x) for x in (out / "predictions" / "copa.validation.jsonl").read_text().splitlines()]
    rows.sort(key=lambda r: r["id"])
    boosted, lls = copa_runs["boosted"]
    assert boosted["acc,none"] == pytest.approx(curve[-0.5], abs=1e-12)
    assert copa_runs["plain"][0]["acc,none"] == pytest.approx(curve[0.0], abs=1e-12)
    assert len(rows) == len(lls) == 10
    for row, got in zip(rows, lls):
        expected = [f - 0.5 * s for f, s in zip(row["ll_full"], row["ll_short"])]
        assert got[:2] == pytest.approx(expected, abs=LL_TOL)


# ---------------------------------------------------------------------------------------------------------
# cblight lmeval: the command of docs/tutorials/lmeval.md (once the README's)


def readme_command() -> list[str]:
    text = (ROOT / "docs" / "tutorials" / "lmeval.md").read_text()  # the README's former section
    line = next(x for x in text.splitlines() if x.startswith("cblight lmeval ") and "--use_cache" in x)
    return line.split()[2:]


@pytest.fixture
def fast_task_index(monkeypatch):
    """lm-eval's CLI builds a TaskManager over every built-in task (~20 s); these runs need only ours."""
    from lm_eval.tasks import TaskManager

    original = TaskManager.__init__

    def init(self, *args, include_defaults=True, **kwargs):
        original(self, *args, include_defaults=False, **kwargs)

    monkeypatch.setattr(TaskManager, "__init__", init)


def test_cli_readme_command_cache_and_errors(tiny_gpt2_dir, tmp_path, monkeypatch, fast_task_index, capsys):
    import cblight.lmeval.model as lm_module
    from cblight.lmeval.__main__ import main

    monkeypatch.chdir(tmp_path)
    args = [
        a.replace("gpt2", str(tiny_gpt2_dir)) if a.startswith("pretrained=") else a for a in readme_command()
    ]
    assert main([*args, "--device", "cpu"]) == 0
    results = list((tmp_path / "out" / "lmeval").rglob("results_*.json"))
    assert len(results) == 1
    acc = json.loads(results[0].read_text())["results"]["cblight_copa"]["acc,none"]
    assert list((tmp_path / "out").glob("lmeval-cache*.db"))
    assert list((tmp_path / "out" / "lmeval").rglob("samples_cblight_copa_*.jsonl"))

    def refuse(*a, **k):
        raise AssertionError("every request is cached: the model must not score anything")

    monkeypatch.setattr(lm_module, "score_pairs", refuse)
    assert main([*args, "--device", "cpu"]) == 0
    again = sorted((tmp_path / "out" / "lmeval").rglob("results_*.json"))
    assert json.loads(again[-1].read_text())["results"]["cblight_copa"]["acc,none"] == acc
    capsys.readouterr()

    other = [a.replace("alpha=-1", "alpha=-2") for a in args]
    assert main([*other, "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: the --use_cache database was written by model cblight with")

    bad = [a.replace("short_context=premise_free", "short_context=window") for a in args]
    assert main([*bad, "--device", "cpu"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: short_context must be one of")
