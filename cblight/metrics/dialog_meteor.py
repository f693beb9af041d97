"""METEOR of the paper's Table 3: the METEOR 1.5 scorer as the official DSTC7 evaluation runs it, and nltk's.

* ``Meteor`` (official): Denkowski & Lavie's METEOR 1.5 jar with its English resources (exact, Snowball
  stem, WordNet synonym and paraphrase-table stages; ``-l en -norm``), one *corpus* score: the jar sums
  each segment's statistics against its best reference and scores the sum (its "Final score"), which is
  what DialoGPT's ``dstc/metrics.py`` ``calc_meteor`` reports. The jar and its paraphrase table come with
  the ``pycocoevalcap`` wheel (``pip install 'cblight[dialog]'``); it needs a Java runtime (Debian:
  ``apt-get install default-jre-headless``). The jar runs in its ``-stdio`` mode in one process kept for
  the Python process (loading the paraphrase table takes ~10 s; scoring 1000 examples ~5 s), whose EVAL
  answer equals the file mode's "Final score" that ``dstc.py`` reads (checked on real DSTC7 responses).
* ``NltkMeteor``: the mean of nltk's sentence-level ``meteor_score`` (exact and Porter-stem matches;
  WordNet synonyms only where nltk's WordNet corpus is installed). It runs anywhere but is far from the
  official value (68.9 vs 38.2 on one real set), so tables label it ``meteor_nltk``.

``resolve_meteor_route("auto")`` picks the official scorer when Java and the jar are there, else nltk's.
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import math
import shutil
import subprocess
import tempfile
import threading
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist

from cblight.errors import ConfigError
from cblight.metrics.dialog import (
    DialogCorpus,
    Normalize,
    check_nonempty,
    cycle_references,
    dialog_words,
)
from cblight.metrics.ragged import PaperMetric, score_once
from cblight.option_types import PositiveInt, check_arguments

MeteorRoute = Literal["auto", "official", "nltk"]

# ---------------------------------------------------------------------------------------------------------
# Finding and running the jar


def find_meteor_jar() -> Path | None:
    """The METEOR 1.5 jar shipped by ``pycocoevalcap`` (a namespace package: no ``__file__``)."""
    spec = importlib.util.find_spec("pycocoevalcap")
    roots = (spec.submodule_search_locations or []) if spec is not None else []
    return next((j for r in roots if (j := Path(r) / "meteor" / "meteor-1.5.jar").is_file()), None)


def official_meteor_missing(jar: str | None = None) -> str | None:
    """What the official METEOR lacks on this machine (one line naming what to install), or ``None``."""
    if shutil.which("java") is None:
        return "the METEOR 1.5 jar needs a Java runtime, and no `java` is on PATH: apt-get install default-jre-headless"
    if jar is not None:
        return None if Path(jar).is_file() else f"no METEOR 1.5 jar at {jar}"
    if find_meteor_jar() is None:
        return "the METEOR 1.5 jar comes with the pycocoevalcap package, which is missing: pip install 'cblight[dialog]'"
    return None


def resolve_meteor_route(meteor: MeteorRoute, jar: str | None = None) -> Literal["official", "nltk"]:
    """``"official"`` or ``"nltk"``; ``"auto"`` is official when it can run here.

    Args:
        meteor: ``auto``, ``official`` or ``nltk``.
        jar: another METEOR 1.5 jar (default: pycocoevalcap's).

    Returns:
        The scorer that will run.

    Raises:
        ~cblight.errors.ConfigError: for ``official`` where it cannot run, saying what to install.
    """
    if meteor == "nltk":
        return "nltk"
    missing = official_meteor_missing(jar)
    if missing is not None and meteor == "official":
        raise ConfigError(f"meteor='official': {missing} (or use meteor='nltk')")
    return "nltk" if missing else "official"


def _field(text: str) -> str:
    # one stdio line per segment, fields separated by "|||"
    return " ".join(text.replace("|||", "| | |").split())


class MeteorJar:
    """One METEOR 1.5 process in ``-stdio`` mode with DSTC7's options (``-l en -norm``, 1 GB heap), started
    on first use and stopped at exit."""

    def __init__(self, jar: Path, java: str = "java", heap: str = "1g"):
        self.jar = Path(jar)
        self.command = [java, f"-Xmx{heap}", "-Dfile.encoding=UTF-8", "-jar", str(self.jar)]
        self.command += ["-", "-", "-stdio", "-l", "en", "-norm"]
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        atexit.register(self.close)

    def corpus_score(self, hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> float:
        """The jar's corpus score of hypotheses (strings) against their lists of references."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                # stderr to a file, not a pipe nobody reads, which could fill
                self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
                self._proc = subprocess.Popen(
                    self.command,
                    cwd=self.jar.parent,  # the jar finds data/paraphrase-en.gz beside itself
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=self._stderr,
                    text=True,
                    encoding="utf-8",
                    bufsize=1,
                )
            stats = [
                self._ask(" ||| ".join(["SCORE", *map(_field, refs), _field(hyp)]))
                for hyp, refs in zip(hypotheses, references)
            ]
            # the jar answers EVAL with one score per segment, then the aggregate
            return float(self._ask("EVAL ||| " + " ||| ".join(stats), lines=len(stats) + 1))

    def close(self) -> str:
        """Stop the process (it holds no state worth a clean exit); the last lines it wrote to stderr."""
        if self._proc is None:
            return ""
        self._proc.kill()
        self._proc.wait()
        self._proc = None
        self._stderr.seek(0)
        tail = self._stderr.read().decode("utf-8", "replace").strip().splitlines()[-3:]
        self._stderr.close()
        return " | ".join(tail)

    def _ask(self, line: str, lines: int = 1) -> str:
        """Send one line; the last of the ``lines`` answer lines."""
        assert self._proc is not None and self._proc.stdin is not None and self._proc.stdout is not None
        try:
            self._proc.stdin.write(line + "\n")
            self._proc.stdin.flush()
            for _ in range(lines):
                answer = self._proc.stdout.readline()
                if not answer:
                    raise BrokenPipeError
        except (BrokenPipeError, OSError):
            raise RuntimeError(f"the METEOR 1.5 jar stopped ({self.close() or 'no message'})") from None
        return answer.strip()


@functools.cache
def meteor_jar(jar: Path) -> MeteorJar:
    """The process-wide ``MeteorJar`` of the jar at ``jar``."""
    return MeteorJar(jar, java=shutil.which("java") or "java")


# ---------------------------------------------------------------------------------------------------------
# The official METEOR


class Meteor(DialogCorpus):
    """Corpus METEOR 1.5 (``compute()``: a float64 tensor, a fraction), as DSTC7's ``dstc.py`` (paper Table 3).

    Keeps the normalised corpus (the jar scores it as a whole); under DDP the synced corpus is scored once,
    on the group's first rank, and the value broadcast. Needs Java and the ``dialog`` extra.

    Args:
        normalize: ``dstc``, ``lower`` or ``none`` (see ``CorpusBLEU``).
        n_refs: cut or cycle each example's references as ``dstc.py --n_refs`` (``None``: as given; cycling
            alone does not change METEOR).
        jar: another METEOR 1.5 jar (default: pycocoevalcap's).
        **kwargs: torchmetrics' ``Metric`` options.

    Raises:
        ~cblight.errors.ConfigError: when the jar or Java is missing, saying what to install.
    """

    higher_is_better = True

    def __init__(
        self,
        normalize: Normalize = "dstc",
        n_refs: PositiveInt | None = None,
        jar: str | None = None,
        **kwargs: Any,
    ):
        check_arguments(Meteor.__init__, locals())
        super().__init__(normalize, n_refs, **kwargs)
        resolve_meteor_route("official", jar)
        self.jar = Path(jar) if jar is not None else find_meteor_jar()

    def compute(self) -> torch.Tensor:
        hyps, refs = self.read_corpus("METEOR")
        if self.n_refs is not None:
            refs = cycle_references(refs, self.n_refs)
        texts = [" ".join(h) for h in hyps], [[" ".join(r) for r in rs] for rs in refs]
        if not (self._is_synced and dist.is_available() and dist.is_initialized()):
            return torch.tensor(meteor_jar(self.jar).corpus_score(*texts), dtype=torch.float64)
        # every rank holds the same gathered corpus: one JVM, on the group's first rank, scores it; its
        # value (or its error, raised on every rank) is broadcast
        group = self.process_group
        result: list[Any] = [None]
        if dist.get_rank(group) == 0:
            try:
                result[0] = meteor_jar(self.jar).corpus_score(*texts)
            except Exception as exc:
                result[0] = exc
        dist.broadcast_object_list(
            result, src=0 if group is None else dist.get_global_rank(group, 0), group=group
        )
        if isinstance(result[0], Exception):
            raise result[0]
        return torch.tensor(result[0], dtype=torch.float64)


# ---------------------------------------------------------------------------------------------------------
# nltk's METEOR


#: Stands in for nltk's WordNet reader: no synsets, so METEOR's synonym stage matches nothing.
NO_SYNONYMS = types.SimpleNamespace(synsets=lambda *args, **kwargs: [])


def wordnet_reader() -> Any | None:
    """nltk's WordNet reader when the corpus is installed, else ``None``."""
    try:
        from nltk.corpus import wordnet

        wordnet.synsets("dog")
    except (LookupError, OSError):
        return None
    return wordnet


class NltkMeteor(PaperMetric):
    """Mean sentence METEOR (nltk ``meteor_score`` against all references of an example), far from the
    official value: tables label it ``meteor_nltk``. ``compute()`` gives
    ``{"meteor_nltk": ..., "meteor_synonyms": 1.0 or 0.0}``.

    Args:
        normalize: ``dstc``, ``lower`` or ``none`` (see ``CorpusBLEU``).
        use_synonyms: ``None`` uses WordNet synonyms when nltk's WordNet corpus is installed; ``True``
            requires it; ``False`` never uses it.
        **kwargs: torchmetrics' ``Metric`` options.

    Raises:
        LookupError: for ``use_synonyms=True`` without the WordNet corpus.
    """

    higher_is_better = True

    def __init__(self, normalize: Normalize = "dstc", use_synonyms: bool | None = None, **kwargs: Any):
        check_arguments(NltkMeteor.__init__, locals())
        super().__init__(**kwargs)
        self.normalize = normalize
        self.synonyms = use_synonyms is not False and wordnet_reader() is not None
        if use_synonyms and not self.synonyms:
            raise LookupError(
                "use_synonyms=True needs nltk's WordNet corpus (python -m nltk.downloader wordnet); "
                "pass use_synonyms=None to fall back to exact and stem matches"
            )
        self.add_sums("total", dtype=torch.float64)
        self.add_sums("count")

    def update(self, hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> None:
        from nltk.translate.meteor_score import meteor_score

        hyps, refs = dialog_words(hypotheses, references, self.normalize)
        reader = wordnet_reader() if self.synonyms else NO_SYNONYMS
        scores = [meteor_score(ref, hyp, wordnet=reader) for hyp, ref in zip(hyps, refs)]
        self.total += math.fsum(scores)
        self.count += len(scores)

    def compute(self) -> dict[str, torch.Tensor]:
        check_nonempty(self.count, "METEOR")
        return {
            "meteor_nltk": self.total / self.count,
            "meteor_synonyms": torch.tensor(float(self.synonyms), dtype=torch.float64),
        }


# ---------------------------------------------------------------------------------------------------------
# Functional forms


def meteor(
    hypotheses: Sequence[str],
    references: Sequence[Sequence[str]],
    normalize: Normalize = "dstc",
    n_refs: PositiveInt | None = None,
    jar: str | None = None,
) -> float:
    """The official corpus METEOR 1.5 (``Meteor``, Table 3's METEOR as a fraction) in one call.

    Args:
        hypotheses: the responses.
        references: per response, a non-empty list of reference strings.
        normalize: ``dstc``, ``lower`` or ``none`` (see ``CorpusBLEU``).
        n_refs: cut or cycle each example's references to this many (``None``: as given).
        jar: another METEOR 1.5 jar (default: pycocoevalcap's).

    Returns:
        The corpus score.
    """
    return score_once(Meteor(normalize, n_refs, jar), hypotheses, references)


def nltk_meteor(
    hypotheses: Sequence[str],
    references: Sequence[Sequence[str]],
    normalize: Normalize = "dstc",
    use_synonyms: bool | None = None,
) -> dict[str, float]:
    """nltk's mean sentence METEOR (``NltkMeteor``) in one call.

    Args:
        hypotheses: the responses.
        references: per response, a non-empty list of reference strings.
        normalize: ``dstc``, ``lower`` or ``none`` (see ``CorpusBLEU``).
        use_synonyms: WordNet synonyms: ``None`` where installed, ``True`` required, ``False`` never.

    Returns:
        ``{"meteor_nltk": ..., "meteor_synonyms": 1.0 or 0.0}``.

    Examples:
        >>> scores = nltk_meteor(["i am fine , thanks ."], [["i'm fine, thank you."]], use_synonyms=False)
        >>> round(scores["meteor_nltk"], 4), scores["meteor_synonyms"]
        (0.6464, 0.0)
    """
    return score_once(NltkMeteor(normalize, use_synonyms), hypotheses, references)
