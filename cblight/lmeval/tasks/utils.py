"""Documents of cblight's local lm-eval tasks: cblight's own task specs render the local files, so the
prompts and choices are exactly those ``evaluate.py`` scores (paper Table 10). Each task reads the
directory named by its ``--metadata`` key, e.g. ``--metadata '{"piqa_dir": "/data/piqa"}'``."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from cblight.data.examples import DataError

DEMO_DIR = Path(__file__).resolve().parents[2] / "assets" / "demo_data"


def _docs(task: str, data_dir: str | Path) -> Any:
    import datasets

    from cblight.data.registry import RenderContext, get_task
    from cblight.data.sources import load_split_records

    spec = get_task(task)
    split = spec.report_split
    records = load_split_records(spec.name, split, spec.source, data_dir=data_dir)
    rows = [asdict(spec.render(record, i, RenderContext(split=split))) for i, record in enumerate(records)]
    return datasets.DatasetDict({"validation": datasets.Dataset.from_list(rows)})


def copa_docs(copa_dir: str | None = None, **_: Any) -> Any:
    """COPA's validation split: ``copa_dir`` (SuperGLUE ``val.jsonl``), else the bundled demo data."""
    return _docs("copa", copa_dir or DEMO_DIR / "copa")


def piqa_docs(piqa_dir: str | None = None, **_: Any) -> Any:
    """PIQA's validation split from ``piqa_dir`` (``valid.jsonl`` + ``valid-labels.lst``)."""
    if not piqa_dir:
        raise DataError(
            'cblight_piqa reads local PIQA files: pass --metadata \'{"piqa_dir": "/path/to/piqa"}\' '
            "(a directory with valid.jsonl and valid-labels.lst)"
        )
    return _docs("piqa", piqa_dir)
