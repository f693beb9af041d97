"""The comparison methods (paper Tables 5, 11, 12) through ``evaluate.py`` on a tiny random GPT-2, every
number recomputed by brute force: the model run on each string of each method separately, the strings
spelled out here (not taken from ``cblight.evaluate.method_prompts``), and the methods' formulas applied by
hand (numpy, as the reference code does)."""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch

from cblight.cli import evaluate_cli
from cblight.data.registry import RenderContext, get_task
from cblight.data.sources import load_split_records
from cblight.models import load_causal_lm, load_tokenizer
from cblight.scoring import Encoder
from tests.helpers import ROOT

FIXTURES = ROOT / "tests" / "fixtures"
TASKS = ["sst2", "trec", "agnews", "copa", "csqa", "hellaswag"]
METHODS = ["boost", "pmi_dc", "pmi_empty", "calibrate", "channel"]
QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.accelerator", "cpu", "--model.plots", "false"]
# Batched scoring (padding, a shared KV cache) and this one-string-at-a-time loop run different float32
# kernels on the tiny model; their sums agree to ~1e-6, so 1e-4 is loose enough for any CPU yet far below
# the score gaps between choices.
LL_TOL = 1e-4
pytestmark = pytest.mark.usefixtures("one_thread")


def run(args: list[str], out: Path) -> dict:
    config, args = (args[:2], args[2:]) if args[:1] == ["-c"] else ([], args)  # a config comes first
    return evaluate_cli(
        [
            *config,
            "--data.data_root", str(FIXTURES),
            "--model.output_dir", str(out),
            "--model.choice_alphas", "[0.0, -1.0]",
            *QUIET,
            *args,
        ]
    )  # fmt: skip


@pytest.fixture(scope="module")
def evaluated(tiny_gpt2_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("baselines")
    run(
        [
            "--model.model", str(tiny_gpt2_dir),
            "--data.tasks", json.dumps(TASKS),
            "--data.limit", "4",
            "--model.methods", json.dumps(METHODS),
        ],
        out,
    )  # fmt: skip
    return out


class BruteForce:
    """log P(continuation | context): the model on one whole string, the lm-eval token boundary."""

    def __init__(self, model_dir: Path):
        self.model = load_causal_lm(str(model_dir)).eval()
        self.enc = Encoder(load_tokenizer(str(model_dir)))

    def ll(self, context: str, continuation: str) -> float:
        ctx, cont = self.enc.pair(context, continuation)
        with torch.no_grad():
            lp = torch.log_softmax(self.model(torch.tensor([ctx + cont[:-1]])).logits[0].float(), -1)
        return sum(float(lp[len(ctx) - 1 + t, tok]) for t, tok in enumerate(cont))


@pytest.fixture(scope="module")
def brute(tiny_gpt2_dir):
    return BruteForce(tiny_gpt2_dir)


def rows(out: Path, task: str, split: str) -> list[dict]:
    return [json.loads(x) for x in (out / "predictions" / f"{task}.{split}.jsonl").read_text().splitlines()]


def raw_records(task: str) -> list:
    spec = get_task(task)
    return load_split_records(task, spec.report_split, spec.source, data_dir=str(FIXTURES / task))


# the strings each method feeds the model, written out per task
DOMAIN = {
    "sst2": lambda ex, rec: " This quote has a tone that is",
    "trec": lambda ex, rec: " The answer to this question will be",
    "agnews": lambda ex, rec: "\nTopic:",
    "copa": lambda ex, rec: " because" if rec.fields["question"] == "cause" else " so",
    "csqa": lambda ex, rec: " the answer is:",
    "hellaswag": lambda ex, rec: " " + ex.context.strip().split(" ")[-1],  # Holtzman et al.: the last word
}
CONTENT_FREE = {
    "sst2": lambda cf: f"{cf} This quote has a tone that is",
    "trec": lambda cf: f"{cf} The answer to this question will be",
    "agnews": lambda cf: f"Title: {cf}\nSummary: {cf}\nTopic:",
}
CHANNEL = {  # Min et al. 2022's first template per task, and the input x
    "sst2": (["A terrible one .", "A great one ."], lambda rec: rec.fields["text"]),
    "trec": (
        [f"{w} :" for w in ("Description", "Entity", "Location", "Number", "Expression", "Human")],
        None,  # x: the rendered question (the task's detokeniser applied), read off the context below
    ),
    "agnews": (
        [f"Topic: {w}." for w in ("World", "Sports", "Business", "Technology")],
        lambda rec: rec.fields["Title"] + " " + rec.fields["Description"],
    ),
}


def expected_scores(brute: BruteForce, task: str, ex, rec) -> dict[str, list[float]]:
    full = [brute.ll(ex.context, c) for c in ex.choices]
    out = {
        "pmi_dc": [f - brute.ll(DOMAIN[task](ex, rec), c) for f, c in zip(full, ex.choices)],
        "pmi_empty": [f - brute.ll("", c) for f, c in zip(full, ex.choices)],
    }
    if task in CONTENT_FREE:
        cf = np.array(
            [
                [math.exp(brute.ll(CONTENT_FREE[task](x), c)) for c in ex.choices]
                for x in ("N/A", "", "[MASK]")
            ]
        )
        p_cf = cf.mean(axis=0)
        p_cf = p_cf / p_cf.sum()  # run_classification.py get_p_content_free
        p = np.exp(full) / np.exp(full).sum()  # the label distribution, normalised
        out["calibrate"] = list(np.log(np.linalg.inv(np.identity(len(p)) * p_cf) @ p))  # W = diag(p_cf)^-1
    if task in CHANNEL:
        prefixes, x_of = CHANNEL[task]
        x = x_of(rec) if x_of else ex.context[: -len(" The answer to this question will be")]
        out["channel"] = [brute.ll(prefix, " " + x) for prefix in prefixes]
    return out


@pytest.mark.parametrize("task", TASKS)
def test_every_method_matches_brute_force(evaluated, brute, task):
    results = json.loads((evaluated / "results.json").read_text())
    result = results["tasks"][task]
    spec = get_task(task)
    records = raw_records(task)
    by_id = {r["id"]: r for r in rows(evaluated, task, spec.report_split)}
    applicable = {"pmi_dc", "pmi_empty"} | ({"calibrate"} if task in CONTENT_FREE else set())
    applicable |= {"channel"} if task in CHANNEL else set()
    for method in METHODS[1:]:
        assert result["methods"][method]["reported"] == (method in applicable), (task, method)
        if method not in applicable:
            assert result["methods"][method]["not_applicable"]
            assert f"acc_{method}" not in result["report"]
    hits = dict.fromkeys(applicable, 0)
    for idx, row in by_id.items():
        ex = spec.render(records[idx], idx, RenderContext(split=spec.report_split))
        want = expected_scores(brute, task, ex, records[idx])
        for method in applicable:
            got = row[f"score_{method}"]
            assert got == pytest.approx(want[method], abs=LL_TOL), (task, idx, method)
            best = int(np.argmax(want[method]))
            margin = sorted(want[method])[-1] - sorted(want[method])[-2]
            if margin > 10 * LL_TOL:  # a near-tie may go either way under float32 noise
                assert row[f"pred_{method}"] == best, (task, idx, method)
            hits[method] += row[f"pred_{method}"] == ex.label
    n = len(by_id)
    for method in applicable:
        assert result["report"][f"acc_{method}"] == pytest.approx(hits[method] / n)


def test_comparison_table_layout(evaluated):
    results = json.loads((evaluated / "results.json").read_text())
    comparison = results["comparison"]
    assert comparison["headers"] == [
        "task",
        "n",
        "f_max",
        "PMI",
        "PMI (empty)",
        "CC",
        "Channel",
        "Ours",
        "alpha*",
        "k*",
    ]
    table = {row["task"]: row for row in comparison["rows"]}
    assert list(table) == TASKS
    assert table["csqa"]["CC"] is None and table["csqa"]["Channel"] is None  # "-" as in the paper
    sst2 = results["tasks"]["sst2"]["report"]
    assert table["sst2"]["CC"] == pytest.approx(100 * sst2["acc_calibrate"])
    assert table["sst2"]["Ours"] == pytest.approx(100 * sst2["acc"])
    assert comparison["table"].splitlines()[0].split() == [
        "task",
        "n",
        "f_max",
        "PMI",
        "PMI",
        "(empty)",
        "CC",
        "Channel",
        "Ours",
        "alpha*",
        "k*",
    ]
    assert results["methods"] == METHODS
    assert results["tasks"]["sst2"]["methods"]["pmi_dc"]["domain_premise"] == " This quote has a tone that is"
    connectors = {" because" if r.fields["question"] == "cause" else " so" for r in raw_records("copa")}
    premise = results["tasks"]["copa"]["methods"]["pmi_dc"][
        "domain_premise"
    ]  # one per example: the connector
    assert premise == (sorted(connectors) if len(connectors) > 1 else connectors.pop())


# ---------------------------------------------------------------------------------------------------------
# The commands of docs/evaluate.md's "Comparison methods" section (once the README's), with the tiny model substituted


def readme_command(*needles: str) -> list[str]:
    """The arguments of the docs/evaluate.md line ``cblight evaluate ...`` that holds every one of ``needles``."""
    text = (ROOT / "docs" / "evaluate.md").read_text()  # holds the README's former section
    section = text[text.index("## Comparison methods and served models") :]
    section = section[: section.index("\n## ", 1)]
    lines = [
        x for x in section.splitlines() if x.startswith("cblight evaluate ") and all(n in x for n in needles)
    ]
    assert len(lines) == 1, needles
    return shlex.split(lines[0].split("#")[0])[2:]


def substituted(args: list[str], model: Path) -> list[str]:
    """``args`` with the model replaced by ``model`` (or given, where the config's default is a Hub id)."""
    out = list(args)
    if "--model.model" in out:
        out[out.index("--model.model") + 1] = str(model)
    else:
        out += ["--model.model", str(model)]
    return out


# ---------------------------------------------------------------------------------------------------------
# Table 5: contextual calibration on LAMA


def lama_tree(root: Path) -> Path:
    from cblight.data.tasks.lama import RELATIONS

    facts = [("Ann", "Paris"), ("Tom", "London"), ("Ada", "Rome"), ("Bo", "Paris")]
    lines = "".join(
        json.dumps({"sub_label": s, "obj_label": o, "predicate_id": "P19"}) + "\n" for s, o in facts
    )
    capital = json.dumps({"sub_label": "France", "obj_label": "Paris", "predicate_id": "P36"}) + "\n"
    for rel in RELATIONS:
        for name in ("train.jsonl", "dev.jsonl", "test.jsonl"):
            path = root / rel / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(lines if rel == "P19" else capital if rel == "P36" else "")
    return root


def zhao_lama_answer(full: torch.Tensor, cf: list[torch.Tensor], top: int) -> int:
    """run_lama.py for one example: the top-``top`` first tokens, p_cf the minimum over the placeholders,
    both renormalised over those candidates, answer argmax(p - p_cf)."""
    probs = torch.softmax(full.double(), -1).numpy()
    cf_probs = np.min(np.stack([torch.softmax(c.double(), -1).numpy() for c in cf]), axis=0)
    candidates = np.argsort(-probs, kind="stable")[:top]
    p = probs[candidates] / probs[candidates].sum()
    q = cf_probs[candidates] / cf_probs[candidates].sum()
    return int(candidates[int(np.argmax(p - q))])


def test_lama_calibration_matches_brute_force(tiny_gpt2_dir, brute, tmp_path):
    lama = lama_tree(tmp_path / "lama")
    out = tmp_path / "out"
    args = substituted(readme_command("configs/table5_lama_cc.yaml"), tiny_gpt2_dir)
    results = run(
        [
            *args,
            "--data.data_dirs", json.dumps({"lama": str(lama)}),
            "--model.ks", "[1, 2]",
            "--model.next_token_alphas", "[0.0, -0.5]",
            "--model.method_options.calibrate_top_n", "20",
        ],
        out,
    )  # fmt: skip
    result = results["lama"]
    assert result["methods"]["calibrate"]["content_free_inputs"] == ["[MASK]", "N/A", "BLANK"]
    predicted = {r["id"]: r for r in rows(out, "lama", "test")}
    records = load_split_records("lama", "test", get_task("lama").source, data_dir=str(lama))
    templates = {"P19": "[X] was born in", "P36": "The capital of [X] is"}
    hits = 0
    for idx, row in predicted.items():
        rec = records[idx].fields
        template = templates[rec["predicate_id"]]
        ids = brute.enc.context(template.replace("[X]", rec["sub_label"]) + " " + rec["obj_label"])
        with torch.no_grad():
            full = brute.model(torch.tensor([ids[:-1]])).logits[0, -1]
            cf = [
                brute.model(torch.tensor([brute.enc.context(template.replace("[X]", x))])).logits[0, -1]
                for x in ("[MASK]", "N/A", "BLANK")
            ]
        answer = zhao_lama_answer(full, cf, 20)
        assert row["pred_calibrate"] == brute.enc.tokenizer.decode([answer]), idx
        hits += answer == ids[-1]
    assert len(predicted) == 5
    assert result["report"]["acc_calibrate"] == pytest.approx(hits / len(predicted))
    table = {r["task"]: r for r in json.loads((out / "results.json").read_text())["comparison"]["rows"]}
    assert table["lama"]["CC"] == pytest.approx(100 * hits / len(predicted))  # Table 5's "Zhao et al." row


# ---------------------------------------------------------------------------------------------------------
# PMI with an empty premise = lm-evaluation-harness's acc_mutual_info, on identical requests


def test_pmi_empty_equals_lmeval_acc_mutual_info(tiny_gpt2_dir, tmp_path):
    import lm_eval
    from lm_eval.tasks import TaskManager

    from cblight.lmeval import TASKS_DIR

    demo = ROOT / "cblight" / "assets" / "demo_data"
    out = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={tiny_gpt2_dir},dtype=float32",
        tasks=["cblight_copa"],  # COPA rendered by cblight's task spec from the demo files
        task_manager=TaskManager(include_path=str(TASKS_DIR), include_defaults=False),
        batch_size=4,
        device="cpu",
        log_samples=True,
    )
    samples = sorted(out["samples"]["cblight_copa"], key=lambda s: s["doc_id"])
    ours_out = tmp_path / "ours"
    evaluate_cli(
        [
            "--model.model", str(tiny_gpt2_dir),
            "--data.data_root", str(demo),
            "--data.tasks", "[copa]",
            "--data.selection", "false",
            "--model.choice_alphas", "[0.0]",
            "--model.methods", "[boost, pmi_empty]",
            "--model.output_dir", str(ours_out),
            *QUIET,
        ]
    )  # fmt: skip
    ours = sorted(rows(ours_out, "copa", "validation"), key=lambda r: r["id"])
    assert len(ours) == len(samples) == 10
    for row, sample in zip(ours, samples):
        lls = [float(r[0]) for r in sample["filtered_resps"]]  # conditional, then unconditional (context "")
        mutual_info = [c - u for c, u in zip(lls[:2], lls[2:])]
        assert row["score_pmi_empty"] == pytest.approx(mutual_info, abs=LL_TOL)
        assert float(row["correct_pmi_empty"]) == sample["acc_mutual_info"]
    report = json.loads((ours_out / "results.json").read_text())["tasks"]["copa"]["report"]
    assert report["acc_pmi_empty"] == pytest.approx(out["results"]["cblight_copa"]["acc_mutual_info,none"])


# ---------------------------------------------------------------------------------------------------------
# The per-example cache: a method added later costs only its own passes; a finished run needs no model


def test_adding_a_method_scores_only_its_strings(tiny_gpt2_dir, tmp_path, monkeypatch):
    import cblight.evaluator as base
    from cblight.scoring import Scorer

    out = tmp_path / "out"
    common = ["--model.model", str(tiny_gpt2_dir), "--data.tasks", "[sst2]", "--data.selection", "false"]
    first = run([*common, "--model.methods", "[boost, pmi_dc]"], out)
    scored: list[str] = []
    original = Scorer.score_text

    def counting(self, groups, names=None):
        scored.extend(names or [])
        return original(self, groups, names)

    monkeypatch.setattr(Scorer, "score_text", counting)
    second = run([*common, "--model.methods", "[boost, pmi_dc, calibrate]"], out)
    n = first["sst2"]["report"]["n"]
    assert n == 4
    assert scored == [f"sst2 content-free input {x!r}" for x in ("N/A", "", "[MASK]")]  # once per task
    assert second["sst2"]["report"]["acc_pmi_dc"] == first["sst2"]["report"]["acc_pmi_dc"]
    # a domain premise equal to the premise-free context reuses its numbers: no model call at all
    scored.clear()
    run(
        [
            *common,
            "--model.methods",
            "[boost, pmi_dc, calibrate]",
            "--model.method_options.domain_premises",
            json.dumps({"sst2": " This quote has a tone that is!"}),
        ],
        out,
    )
    assert len(scored) == n
    scored.clear()
    same = run(
        [
            *common,
            "--model.methods",
            "[boost, pmi_dc, calibrate]",
            "--model.method_options.domain_premises",
            json.dumps({"sst2": " This quote has a tone that is"}),
        ],
        out,
    )
    assert scored == [] and same["sst2"]["report"]["acc_pmi_dc"] == same["sst2"]["report"]["acc_pmi"]
    # a changed domain premise is recomputed, everything else is kept
    scored.clear()
    premise = json.dumps({"sst2": " Overall it was"})
    third = run(
        [
            *common,
            "--model.methods",
            "[boost, pmi_dc, calibrate]",
            "--model.method_options.domain_premises",
            premise,
        ],
        out,
    )
    assert len(scored) == n and all(name.endswith("(pmi_dc)") for name in scored)
    assert third["sst2"]["methods"]["pmi_dc"]["domain_premise"] == " Overall it was"

    def refuse(*args, **kwargs):
        raise AssertionError("the model must not be loaded when every example is cached")

    monkeypatch.setattr(base, "build_causal_lm", refuse)
    again = run(
        [
            *common,
            "--model.methods",
            "[boost, pmi_dc, calibrate]",
            "--model.method_options.domain_premises",
            premise,
        ],
        out,
    )
    assert again["sst2"]["report"] == third["sst2"]["report"]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--model.methods", "[boost, pmi]"], "methods"),
        (["--model.methods", "[boost, channel, channel]"], "methods repeats a name"),
        (
            ["--model.method_options.channel_template", "4"],
            "error: model.method_options.channel_template must be one of 0, 1, 2, 3, got 4",
        ),
        (
            ["--model.method_options.calibrate_top_n", "-1"],
            "error: model.method_options.calibrate_top_n must be an integer >= 0, got -1",
        ),
        (["--model.method_options.content_free_inputs", "[]"], "method_options.content_free_inputs is empty"),
    ],
)
def test_bad_method_options_are_one_line(tiny_gpt2_dir, tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        run(["--model.model", str(tiny_gpt2_dir), "--data.tasks", "[sst2]", *args], tmp_path / "bad")
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "bad" / "results.json").exists()


# ---------------------------------------------------------------------------------------------------------
# The configs of Tables 11 and 12 (Table 5's runs in test_lama_calibration_matches_brute_force)

TABLE_ROWS = ["storycloze", "hellaswag", "copa", "csqa", "openbookqa", "arc_easy", "arc_challenge"]
TABLE_ROWS += ["sst2", "sst5", "agnews", "trec", "boolq", "rte", "cb"]


def test_table12_config_runs_in_the_papers_layout(tiny_gpt2_dir, tmp_path):
    out = tmp_path / "t12"
    args = readme_command("configs/table12_methods_gpt2.yaml", "Table 12")
    run([*substituted(args, tiny_gpt2_dir), "--data.limit", "2"], out)
    results = json.loads((out / "results.json").read_text())
    comparison = results["comparison"]
    assert comparison["headers"] == ["task", "n", "f_max", "PMI", "CC", "Channel", "Ours", "alpha*", "k*"]
    assert [r["task"] for r in comparison["rows"]] == TABLE_ROWS  # the paper's row order
    for row in comparison["rows"]:
        report = results["tasks"][row["task"]]["report"]
        assert row["PMI"] == pytest.approx(100 * report["acc_pmi_dc"])
        assert row["Ours"] == pytest.approx(100 * report["acc"]) and row["alpha*"] == report["alpha_star"]
        fixed_labels = row["task"] in ("sst2", "sst5", "agnews", "trec", "boolq", "rte", "cb")
        assert (row["CC"] is not None) == fixed_labels, row["task"]
        assert (row["Channel"] is not None) == (row["task"] in ("sst2", "sst5", "agnews", "trec")), row[
            "task"
        ]


def test_table11_config_runs_on_a_local_model_too(tiny_gpt2_dir, tmp_path):
    """The served config with the tiny model substituted and the backend switched to local (its run against
    a real server is tests/realmodel/test_served_real.py)."""
    out = tmp_path / "t11"
    results = run(
        [
            "-c", str(ROOT / "configs/table11_methods_served.yaml"),
            "--model.model", str(tiny_gpt2_dir),
            "--model.tokenizer", str(tiny_gpt2_dir),
            "--model.backend", "local",
            "--model.server", "null",
            "--data.tasks", "[csqa, sst5]",
            "--data.limit", "2",
        ],
        out,
    )  # fmt: skip
    saved = json.loads((out / "results.json").read_text())
    assert saved["comparison"]["headers"] == ["task", "n", "f_max", "PMI", "CC", "Ours", "alpha*", "k*"]
    assert (
        results["sst5"]["methods"]["calibrate"]["reported"] and "acc_calibrate" in results["sst5"]["report"]
    )
    assert not results["csqa"]["methods"]["calibrate"]["reported"]
