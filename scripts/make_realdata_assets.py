"""Write ``cblight/assets/realdata/``: fixed-seed samples of real benchmark files for the demo and the
real-model test tier, in the benchmarks' original formats.

    python scripts/make_realdata_assets.py --source ../shared/realdata

Reads the unmodified public files (LAMBADA, CommonsenseQA, PIQA, WebText; sources and licences in the
written README) and keeps, per file, the lines at ``sorted(random.Random(seed).sample(range(n), size))``:
the output is the same on every run. Rerunning it is how the shipped samples were made.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "cblight" / "assets" / "realdata"
SEED = 2022

# (source file, destination file, how many lines, seed offset); labels files follow their jsonl's choice
PLAN = [
    ("lambada/lambada_test.jsonl", "lambada/lambada_test.jsonl", 200, 0),
    ("lambada/lambada_development_plain_text.txt", "lambada/lambada_development_plain_text.txt", 200, 1),
    ("commonsenseqa/dev_rand_split.jsonl", "csqa/dev_rand_split.jsonl", 200, 2),
    ("commonsenseqa/train_rand_split.jsonl", "csqa/train_rand_split.jsonl", 200, 3),
    ("webtext/webtext.test.jsonl", "webtext/webtext.test.jsonl", 64, 4),
    ("webtext/webtext.valid.jsonl", "webtext/webtext.valid.jsonl", 256, 5),
]
PIQA_REPORTED, PIQA_HELDOUT = 200, 200

README = """# Real benchmark samples

Fixed-seed samples of public benchmark files, unmodified lines in their original formats, for the demo
(`python -m cblight.demo`) and the real-model test tier (`tests/realmodel/`). Made by
`scripts/make_realdata_assets.py` (seed {seed}); numbers on them are estimates with the standard errors shown.

| folder | files (lines) | source | licence |
|---|---|---|---|
| lambada/ | `lambada_test.jsonl` (200 of 5153), `lambada_development_plain_text.txt` (200 of 4869) | LAMBADA (Paperno et al. 2016): OpenAI's detokenised test set; the original development set | CC BY 4.0 |
| csqa/ | `dev_rand_split.jsonl` (200 of 1221), `train_rand_split.jsonl` (200 of 9741) | CommonsenseQA (Talmor et al. 2019) | MIT |
| piqa/ | `valid.jsonl` + `valid-labels.lst` (200 of 1838), `heldout-valid.jsonl` + `heldout-valid-labels.lst` (200 others) | PIQA (Bisk et al. 2020) validation set | AFL-3.0 |
| webtext/ | `webtext.test.jsonl` (64 of 4723), `webtext.valid.jsonl` (256 of 4724) | GPT-2 output dataset's WebText (OpenAI), as redistributed cut to about 63 GPT-2 tokens a document | MIT |

PIQA's training file is not shipped: the demo chooses PIQA's alpha* on `heldout-valid.jsonl`, 200 validation
questions disjoint from the 200 it reports (the paper chooses it on a sample of the training set).
WebText's test documents give the generation prompts (first sentences), its validation documents the
coherence-tuning prompts, so that tuning never sees an evaluation prompt.
"""


def sample(n: int, size: int, seed: int) -> list[int]:
    return sorted(random.Random(seed).sample(range(n), min(size, n)))


def lines_of(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines(keepends=True)


def write(dest: Path, lines: list[str]) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text("".join(lines), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--source", default=str(Path(__file__).resolve().parents[2] / "shared" / "realdata"))
    args = parser.parse_args()
    src = Path(args.source)
    for rel_src, rel_dest, size, offset in PLAN:
        lines = lines_of(src / rel_src)
        write(OUT / rel_dest, [lines[i] for i in sample(len(lines), size, SEED + offset)])
    piqa, labels = lines_of(src / "piqa/valid.jsonl"), lines_of(src / "piqa/valid-labels.lst")
    assert len(piqa) == len(labels)
    chosen = random.Random(SEED + 6).sample(range(len(piqa)), PIQA_REPORTED + PIQA_HELDOUT)
    for name, idx in (
        ("valid", sorted(chosen[:PIQA_REPORTED])),
        ("heldout-valid", sorted(chosen[PIQA_REPORTED:])),
    ):
        write(OUT / f"piqa/{name}.jsonl", [piqa[i] for i in idx])
        write(OUT / f"piqa/{name}-labels.lst", [labels[i] for i in idx])
    (OUT / "README.md").write_text(README.format(seed=SEED), encoding="utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
