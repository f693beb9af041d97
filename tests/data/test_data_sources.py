"""Readers of the original file formats and every kind of bad input: each gives a clear ``DataError`` that
names the task, the file and line (or hub id), and the field."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from cblight.data.datamodule import EvalDataModule
from cblight.data.examples import DataError
from cblight.data.registry import RenderContext, get_task
from cblight.data.sources import HubSplit, load_split_records, read_csv
from cblight.data.tasks.agnews import COLUMNS

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def render_all(task: str, split: str, **where) -> list:
    spec = get_task(task)
    records = load_split_records(task, split, spec.source, **where)
    return [spec.render(r, i, RenderContext(split=split)) for i, r in enumerate(records)]


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


# -- original formats -----------------------------------------------------------------------------------------


def test_agnews_csv_with_and_without_a_header_row():
    with_header = read_csv(FIXTURES / "agnews/test.csv", COLUMNS, headerless=COLUMNS)
    without = read_csv(FIXTURES / "agnews/train.csv", COLUMNS, headerless=COLUMNS)
    assert with_header[0].fields["Class Index"] == "3" and with_header[0].where.endswith("test.csv line 2")
    assert (
        len(without) == 4
        and without[0].fields["Title"] == "Wall St. Bears Claw Back Into the Black (Reuters)"
    )
    assert without[0].where.endswith("train.csv line 1")


def test_piqa_without_its_labels_file(tmp_path):
    shutil.copy(FIXTURES / "piqa/valid.jsonl", tmp_path / "valid.jsonl")
    with pytest.raises(
        DataError, match=r"valid\.jsonl has no 'label' field and its labels file .*valid-labels\.lst"
    ):
        render_all("piqa", "validation", data_dir=tmp_path)
    write(tmp_path / "valid-labels.lst", "0\n")
    with pytest.raises(DataError, match=r"valid-labels\.lst has 1 labels but .*valid\.jsonl has 2 records"):
        render_all("piqa", "validation", data_dir=tmp_path)
    write(tmp_path / "valid-labels.lst", "0\n2\n")
    with pytest.raises(DataError, match=r"valid-labels\.lst line 2 is '2', not a label 0 or 1"):
        render_all("piqa", "validation", data_dir=tmp_path)


def test_sst_float_scores_of_the_treebank_schema(tmp_path):
    rows = [
        {"sentence": "Great !", "label": 0.9},
        {"sentence": "Meh .", "label": 0.5},
        {"sentence": "Bad .", "label": 0.1},
    ]
    path = write(tmp_path / "test.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    sst2 = render_all("sst2", "test", data_file=path)
    assert [(ex.context.split(" This")[0], ex.label) for ex in sst2] == [
        ("Great !", 1),
        ("Bad .", 0),
    ]  # neutral dropped
    assert [ex.label for ex in render_all("sst5", "test", data_file=path)] == [4, 2, 0]


def test_lama_needs_all_forty_relations(tmp_path):
    write(tmp_path / "P19/test.jsonl", (FIXTURES / "lama/P19/test.jsonl").read_text())
    with pytest.raises(DataError, match=r"lama: split 'test' needs 40 files in .*; missing P20/test\.jsonl"):
        render_all("lama", "test", data_dir=tmp_path)


def test_lama_record_of_an_unknown_relation(tmp_path):
    row = {"sub_label": "Twin Town", "obj_label": "Paris", "predicate_id": "P190"}
    path = write(tmp_path / "P190/test.jsonl", json.dumps(row) + "\n")
    with pytest.raises(
        DataError, match=r"relation 'P190' at .*P190/test\.jsonl line 1 is not one of the reference's 40"
    ):
        render_all("lama", "test", data_file=path)


# -- bad input: clear errors naming the file, line and field ------------------------------------------------------


def test_missing_field_names_field_file_and_line(tmp_path):
    path = write(tmp_path / "val.jsonl", '{"premise": "A.", "choice1": "b", "choice2": "c", "label": 0}\n')
    with pytest.raises(DataError, match=r"copa: record at .*val\.jsonl line 1 has no field 'question'"):
        render_all("copa", "validation", data_file=path)


def test_wrong_format_names_the_line(tmp_path):
    path = write(tmp_path / "stsa.binary.test", "1 fine .\nnot a label line\n")
    with pytest.raises(DataError, match=r"sst2: .*stsa\.binary\.test line 2 is not '<label> <sentence>'"):
        render_all("sst2", "test", data_file=path)
    path = write(tmp_path / "TREC_10.label", "NUM:dist How far ?\nHow far is it ?\n")
    with pytest.raises(DataError, match=r"trec: .*TREC_10\.label line 2 is not 'COARSE:fine question'"):
        render_all("trec", "test", data_file=path)
    path = write(tmp_path / "val.jsonl", '{"premise": "x"\n')
    with pytest.raises(DataError, match=r"val\.jsonl line 1 is not valid JSON"):
        render_all("cb", "validation", data_file=path)


def test_csv_in_the_wrong_schema(tmp_path):
    path = write(tmp_path / "test.csv", "id,sentence,ending\n1,a,b\n")
    with pytest.raises(DataError, match=r"test\.csv has no column 'InputStoryid'"):
        render_all("storycloze", "test", data_file=path)
    path = write(tmp_path / "agnews.csv", "Class Index,Title\n1,x\n")
    with pytest.raises(DataError, match=r"agnews\.csv line 1 has 2 fields, expected 3"):
        render_all("agnews", "test", data_file=path)


@pytest.mark.parametrize("task,split,row,message", [
    ("cb", "validation", {"premise": "p", "hypothesis": "h", "label": "maybe"}, r"field 'label' at .* is 'maybe', not one of"),
    ("rte", "validation", {"premise": "p", "hypothesis": "h", "label": -1}, r"field 'label' at .* is -1, not one of"),
    ("boolq", "validation", {"question": "q", "passage": "p", "label": 2}, r"field 'label' at .* is 2"),
    ("copa", "validation", {"premise": "A.", "choice1": "b", "choice2": "c", "question": "cause", "label": 2},
     r"label at .* is 2, outside the 2 answers"),
    ("csqa", "validation", {"id": "x", "question": "q?", "question_concept": "c",
                            "choices": {"label": ["A", "B"], "text": ["a", "b"]}, "answerKey": ""},
     r"field 'answerKey' at .* is '', not one of the choice labels"),
    ("agnews", "test", None, r"label at .*line 2 is 4, outside the 4 answers"),
    ("storycloze", "test", None, r"label at .*line 2 is 2, outside the 2 answers"),
    ("hellaswag", "validation", {"activity_label": "a", "ctx_a": "b", "ctx_b": "c", "endings": ["x", "y"], "label": ""},
     r"has no label \(the test split is unlabelled\)"),
])  # fmt: skip
def test_label_outside_the_answer_set(tmp_path, task, split, row, message):
    if task == "agnews":
        path = write(tmp_path / "test.csv", 'Class Index,Title,Description\n5,"T","D"\n')
    elif task == "storycloze":
        head = (
            (FIXTURES / "storycloze/cloze_test_test__spring2016 - cloze_test_ALL_test.csv")
            .read_text()
            .splitlines()[0]
        )
        path = write(tmp_path / "test.csv", head + "\nid,a,b,c,d,e,f,3\n")
    else:
        path = write(tmp_path / "data.jsonl", json.dumps(row) + "\n")
    with pytest.raises(DataError, match=message):
        render_all(task, split, data_file=path)


def test_missing_split_in_a_data_dir(tmp_path):
    write(tmp_path / "val.jsonl", (FIXTURES / "copa/val.jsonl").read_text())
    with pytest.raises(DataError, match=r"copa: no file for split 'train' in .* \(looked for train\.jsonl"):
        render_all("copa", "train", data_dir=tmp_path)
    with pytest.raises(DataError, match=r"data file for split 'test' not found"):
        render_all("copa", "test", data_file=tmp_path / "nope.jsonl")


@pytest.mark.parametrize("task,words", [
    ("storycloze", r"loading script .*cloze_test_val__spring2016 - cloze_test_ALL_val\.csv"),
    ("agnews", r"fancyzhx/ag_news joins title and description .*train\.csv and test\.csv"),
    ("lama", r"local files only: .*P19/, P20/"),
    ("webtext", r"webtext\.test\.jsonl"),
])  # fmt: skip
def test_tasks_without_a_loadable_hub_copy_say_which_files_to_use(task, words):
    spec = get_task(task)
    with pytest.raises(DataError, match=words):
        load_split_records(task, spec.report_split, spec.source)


def test_hub_id_that_needs_a_loading_script(monkeypatch):
    import datasets

    def refuse(*args, **kwargs):
        raise RuntimeError("Dataset scripts are no longer supported, but found piqa.py")

    monkeypatch.setattr(datasets, "load_dataset", refuse)
    spec = get_task("piqa")
    source = replace(spec.source, hub={"validation": HubSplit("ybisk/piqa", None, "validation")})
    with pytest.raises(
        DataError, match=r"piqa: cannot load split 'validation' from ybisk/piqa: it needs a loading script"
    ):
        load_split_records("piqa", "validation", source)


def test_unknown_task_and_duplicates():
    with pytest.raises(DataError, match=r"unknown task 'copaa'; known tasks: .*copa"):
        EvalDataModule(tasks=["copaa"])
    with pytest.raises(DataError, match=r"lists a task twice"):
        EvalDataModule(tasks=["agnews", "agn"])
    with pytest.raises(DataError, match=r"data_dirs/data_files name task 'rte', which is not in tasks"):
        EvalDataModule(tasks=["copa"], data_dirs={"rte": "/tmp"})


# -- the data module ---------------------------------------------------------------------------------------------


def test_data_module_sampled_selection_split_and_aliases():
    dm = EvalDataModule(
        tasks=["agn", "trec"], data_root=str(FIXTURES), data_dirs={"agn": str(FIXTURES / "agnews")}
    )
    dm.setup()
    agnews = dm.splits["agnews"]
    assert len(agnews["report"].examples) == 2
    sel = agnews["selection"]
    assert (
        sel.split == "train" and len(sel.examples) == 2 and sel.sampled_indices == sorted(sel.sampled_indices)
    )
    assert [ex.idx for ex in sel.examples] == sel.sampled_indices
    trec = dm.splits["trec"]
    assert (
        len(trec["report"].examples) == 3 and len(trec["selection"].examples) == 3
    )  # all 4 train lines hold 3
    again = EvalDataModule(tasks=["trec"], data_root=str(FIXTURES))
    again.setup()
    assert (
        again.splits["trec"]["selection"].sampled_indices == trec["selection"].sampled_indices
    )  # fixed seed


def test_splits_read_from_data_files_name_the_file():
    """A selection split mapped to another file (the demo's PIQA: 200 held-out validation questions) says
    so wherever results name it, instead of passing for a sample of the training set."""
    piqa = Path(__file__).resolve().parents[2] / "cblight" / "assets" / "realdata" / "piqa"
    dm = EvalDataModule(
        tasks=["piqa"],
        data_files={
            "piqa": {"train": str(piqa / "heldout-valid.jsonl"), "validation": str(piqa / "valid.jsonl")}
        },
        limit=5,
    )
    dm.setup()
    assert dm.splits["piqa"]["selection"].description == "train (heldout-valid.jsonl) sample of 5 (seed 1234)"
    assert dm.splits["piqa"]["report"].description == "validation (valid.jsonl)"
    plain = EvalDataModule(tasks=["trec"], data_root=str(FIXTURES))
    plain.setup()
    assert plain.splits["trec"]["selection"].description == "train sample of 3 (seed 1234)"


def test_data_module_lama_filter_uses_the_tokenizer_and_largest_k(tmp_path, gpt2_tokenizer):
    from cblight.data.tasks.lama import RELATIONS
    from cblight.tiny import GPT2_TOKENIZER_DIR

    sample = (FIXTURES / "lama/P19/test.jsonl").read_text()
    short = json.dumps({"sub_label": "Bo", "obj_label": "Paris", "predicate_id": "P19"}) + "\n"
    for rel in RELATIONS:
        for name in ("dev.jsonl", "test.jsonl"):
            write(tmp_path / rel / name, sample + short if rel == "P19" else "")
    dm = EvalDataModule(
        tasks=["lama"], data_dirs={"lama": str(tmp_path)}, tokenizer=str(GPT2_TOKENIZER_DIR), max_k=5
    )
    texts = [ex.text for ex in dm.examples("lama")]
    assert texts == [
        "Melanie Durrant was born in Toronto",
        "Jim Cuddy was born in Toronto",
    ]  # "Bo was born in" is 4 tokens
    dm = EvalDataModule(
        tasks=["lama"], data_dirs={"lama": str(tmp_path)}, tokenizer=str(GPT2_TOKENIZER_DIR), max_k=3
    )
    assert len(dm.examples("lama")) == 3
    with pytest.raises(DataError, match=r"needs the tokenizer and the grid's largest k"):
        EvalDataModule(tasks=["lama"], data_dirs={"lama": str(tmp_path)}).examples("lama")


def test_data_module_hands_generation_examples_to_a_loader():
    dm = EvalDataModule(tasks=["webtext", "dstc7"], data_root=str(FIXTURES), batch_size=1)
    loaders = dm.test_dataloader()
    assert len(loaders) == 2 and dm.val_dataloader() == []
    batch = next(iter(loaders[1]))
    assert len(batch) == 1 and batch[0].turns
