"""A run of an evaluator: where it writes, that it writes alone, how it stops, and what it runs; how a
command ends.

* **Output directory**: ``resolve_output_dir`` fills ``{model}`` in (the evaluator, when it is built),
  ``check_output_dir`` refuses one that could not hold the results, and ``OutputLock`` keeps two runs from
  writing one directory at once. The CLI checks and locks it once, after building the evaluator and
  before any model or data is loaded.
  ``readable_by_all`` opens a saved model directory to every user (an offline model's conversion, a tuned
  export), as a shared cache or a group's folder needs.
* **Signals**: within ``stop_on_signals`` SIGINT and SIGTERM raise ``RunInterrupted`` at once, in the
  middle of a batch if need be; ``check_interrupt``, called by the evaluators before every batch, raises it
  too should a library have swallowed the first one. Cache rows are appended all-or-none
  (``cblight.cache``), so a rerun resumes. ``exit_on_bad_input``, around every command, turns
  ``RunInterrupted`` into one line and exit status 128 + the signal number (130 for SIGINT, 143 for
  SIGTERM), as a shell reports a killed command.
  A training run defers the first signal (``defer``) to a checkpointed stop at its next step boundary.
  Bad input (a ``CblightError``) becomes one line and exit status 2, never a traceback; so too in
  ``run_subcommands``, which runs a command of subcommands (``cblight data``, ``cblight zoo``).
* **The run**: ``run_evaluation`` chooses alpha* (and k*) on the selection splits with Lightning's
  validation loop when the evaluator selects (``Evaluator.selects``), then reports on the test splits;
  ``run_comparison`` runs one evaluation per checkpoint (tuned vs boosted vs base) and prints the table
  the evaluator's class lays out (``Evaluator.comparison_table``).

Core: it imports no wing; the evaluators (``cblight.evaluate``, ``cblight.generate``) plug in through the
``cblight.evaluator.Evaluator`` base.
"""

from __future__ import annotations

import atexit
import fcntl
import itertools
import json
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from cblight.errors import CblightError, ConfigError
from cblight.results import atomic_write_json

LOCK_NAME = ".cblight.lock"


# ---------------------------------------------------------------------------------------------------------
# The output directory


class OutputDirError(CblightError):
    """An output directory that cannot be used: a file in its path, not writable, or in use by another run."""


def resolve_output_dir(template: str, label: str) -> Path:
    """``template`` with ``{model}`` replaced by the model's short name ``label`` (``models.model_label``:
    ``gpt2``, ``Llama-2-7b-hf``, ``smollm2-135m``)."""
    return Path(template.replace("{model}", label))


def check_output_dir(path: Path, option: str = "model.output_dir") -> None:
    """Refuse a directory that could not hold the results: a file on its path, or a deepest existing
    directory that cannot be written (read-only file system, permissions). Checked by writing, and at once
    removing, a probe file, which also catches what ``os.access`` misses for root."""
    path = Path(path).expanduser()
    existing = path
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    too_long = _too_long(path, existing)
    if too_long:
        shown = str(path) if len(str(path)) <= 80 else str(path)[:60] + "..." + str(path)[-16:]
        raise OutputDirError(
            f"{option} {shown!r} is too long for the file system ({too_long}): choose a shorter {option}"
        )
    if not existing.is_dir():
        where = "it" if existing == path else str(existing)
        raise OutputDirError(f"{option} {str(path)!r} cannot be a directory: {where} is a file")
    try:
        fd, probe = tempfile.mkstemp(prefix=".cblight-probe-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise OutputDirError(f"{option} {str(path)!r} is not writable ({existing}: {err.strerror})") from None


# Room left under an output directory for the files a run writes inside it (cache/<task>/<split>/rank0.jsonl)
_ROOM = 200


def _too_long(path: Path, existing: Path) -> str | None:
    """Why ``path`` cannot exist on the file system of ``existing`` (its deepest existing directory): a name
    longer than the file system's ``NAME_MAX``, or a path without room for a run's files under ``PATH_MAX``."""
    try:
        name_max = os.pathconf(existing, "PC_NAME_MAX")
        path_max = os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096  # Linux's
    longest = max((len(os.fsencode(part)) for part in path.parts), default=0)
    if longest > name_max:
        return f"a name of {longest} bytes, where the limit is {name_max}"
    total = len(os.fsencode(str(path.absolute())))
    if total + _ROOM > path_max:
        return f"{total} bytes in all, where the limit for the files inside it is {path_max - _ROOM}"
    return None


class OutputLock:
    """An exclusive lock on an output directory: ``flock`` on ``<dir>/.cblight.lock``, a file naming its
    owner (pid, host, start time, command) so that a second run is refused with a message naming the first.
    The kernel drops the lock when its process ends, however it ends, so a lock file left by a killed run
    is simply taken over. Released, and its file removed, at exit."""

    def __init__(self, directory: str | Path, option: str = "model.output_dir"):
        self.dir = Path(directory).expanduser()
        self.path = self.dir / LOCK_NAME
        self.option = option
        self._file: IO[str] | None = None
        self._created: list[Path] = []  # directories the lock made, removed again if left empty

    def acquire(self) -> OutputLock:
        try:
            missing = itertools.takewhile(lambda p: not os.path.lexists(p), [self.dir, *self.dir.parents])
            self._created = list(missing)
            self.dir.mkdir(parents=True, exist_ok=True)
            for attempt in range(100):
                fh = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 (held open: it is the lock)
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    fh.seek(0)
                    text = fh.read()
                    fh.close()
                    if not text.endswith("}") and attempt < 99:
                        time.sleep(0.01)  # its owner is writing it
                        continue
                    owner = json.loads(text) if text.endswith("}") else {}
                    if owner.get("pid") == os.getpid() and owner.get("host") == socket.gethostname():
                        return self  # this process holds it already (the CLI, then the run itself)
                    raise OutputDirError(
                        f"{self.option} {str(self.dir)!r} is in use by another run (pid {owner.get('pid')} on "
                        f"host {owner.get('host')}, started {owner.get('started')}: "
                        f"{owner.get('command', '')[:200]}); wait for it to finish or choose another "
                        + ("output_dir" if self.option == "model.output_dir" else f"--{self.option}")
                    ) from None
                if os.path.exists(self.path) and os.path.samefile(self.path, fh.fileno()):
                    break
                fh.close()  # its owner removed the file after it was opened here: lock the new one
            else:
                raise OutputDirError(f"{self.option} {str(self.dir)!r}: could not take the lock {self.path}")
            fh.truncate(0)
            started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
            owner = {"pid": os.getpid(), "host": socket.gethostname(), "started": started}
            json.dump({**owner, "command": " ".join(sys.argv)}, fh)
            fh.flush()
        except OSError as err:
            raise OutputDirError(
                f"{self.option} {str(self.dir)!r} is not writable ({err.strerror})"
            ) from None
        self._file = fh
        atexit.register(self.release)
        return self

    def release(self) -> None:
        fh, self._file = self._file, None
        if fh is None:
            return
        self.path.unlink(missing_ok=True)  # while still held, so no other run's lock file is removed
        fh.close()
        for directory in self._created:  # a run refused before writing anything leaves no directory
            try:
                directory.rmdir()
            except OSError:
                break  # not empty: the run wrote results there


RUN_SETTINGS = "run.json"
# What a run leaves in its output directory that a rerun with other settings would replace or mix with
_RESULTS = ("results.json", "predictions", "generations", "cache", "plots")


def _holds_results(directory: Path) -> bool:
    return any(os.path.lexists(directory / name) for name in _RESULTS)


def _shown(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def check_rerun(
    directory: str | Path,
    settings: Mapping[str, Any],
    overwrite: bool,
    resweep: tuple[str, ...] = (),
) -> None:
    """A run into an output directory that holds another run's results: the directory records the settings
    of its run (``run.json``: option -> value, every option that changes the results), written here before
    any work. A rerun with the same settings goes on (it resumes from the cache); one whose settings differ
    is refused, naming the first that differs and the fix, so that a smaller or other run never replaces
    ``results.json`` and ``predictions/`` without a word; with ``overwrite`` it replaces them. Options in
    ``resweep`` (a new analysis of the cached numbers, such as another alpha grid: docs/evaluate.md, "Resume
    and re-sweep") may differ, said in one line that the cache is reused. A directory without a
    record (new, or written before runs recorded their settings), or whose run left no results, takes this
    run's. Call it holding the directory's lock, and ``forget_run_without_results`` when the run ends."""
    path = Path(directory).expanduser() / RUN_SETTINGS
    settings = json.loads(json.dumps(dict(settings), default=str))  # plain JSON values, compared as saved
    recorded: Any = None
    if path.is_file() and not overwrite and _holds_results(path.parent):
        try:
            recorded = json.loads(path.read_text(encoding="utf-8")).get("settings")
        except (ValueError, AttributeError):  # UnicodeDecodeError is a ValueError
            recorded = None  # an unreadable record is no run's: this run's replaces it
    changed: list[str] = []
    if isinstance(recorded, dict):
        changed = [k for k in dict.fromkeys([*recorded, *settings]) if recorded.get(k) != settings.get(k)]
    if refused := [key for key in changed if key not in resweep]:
        key = refused[0]
        raise OutputDirError(
            f"model.output_dir {str(path.parent)!r} holds the results of a run with other settings ({key} "
            f"{_shown(recorded.get(key))} there, {_shown(settings.get(key))} now): rerun with its settings "
            "to resume it, choose another --model.output_dir, or pass --model.overwrite true to replace its "
            "results"
        )
    atomic_write_json(path, {"settings": settings})
    if changed:  # only options of resweep differ here
        print(
            f"note: {directory} holds this run's cached scores under other {', '.join(changed)}: reusing "
            "them; results.json and predictions/ are replaced",
            file=sys.stderr,
        )


def forget_run_without_results(directory: str | Path) -> None:
    """The settings ``check_rerun`` recorded go again if the run left no results (refused on bad input, say),
    so that the directory, empty again, goes with the lock that made it."""
    directory = Path(directory).expanduser()
    if not _holds_results(directory):
        (directory / RUN_SETTINGS).unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------------------
# Stopping on SIGINT / SIGTERM


def readable_by_all(directory: str | Path) -> Path:
    """Make a saved model directory readable by every user: its files 0644, its folders 0755.

    ``save_pretrained`` writes ``model.safetensors`` 0600 (safetensors' own temporary file, moved into
    place), so a model exported to a shared cache or a group's folder would be readable by its owner alone.

    Args:
        directory: the directory ``save_pretrained`` wrote (an offline model's conversion, a tuned export).

    Returns:
        ``directory``, as a ``Path``.
    """
    directory = Path(directory)
    for path in directory.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    directory.chmod(0o755)
    return directory


class RunInterrupted(BaseException):
    """A run stopped by a signal. A BaseException, so no ``except Exception`` on the way swallows it."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


# A signal delivered twice at once (to the process group, and forwarded by Lightning's launcher) is one.
REPEAT_AFTER_S = 2.0
_requested: list[tuple[int, float]] = []  # (signal, when) of every signal received in the block
_defer = [False]


def requested() -> int | None:
    """The first signal received within ``stop_on_signals`` (``None``: none)."""
    return _requested[0][0] if _requested else None


def check_interrupt() -> None:
    """Raise ``RunInterrupted`` if a stop was requested (called between batches)."""
    if _requested:
        raise RunInterrupted(_requested[0][0])


def _handler(signum: int, frame: Any) -> None:
    now = time.monotonic()
    if _requested and now - _requested[0][1] < REPEAT_AFTER_S:
        return
    _requested.append((signum, now))
    if len(_requested) == (2 if _defer[0] else 1):  # the first at once; when deferred, the second
        raise RunInterrupted(signum)


@contextmanager
def stop_on_signals(defer: bool = False) -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise ``RunInterrupted`` (main thread only; elsewhere a no-op).
    With ``defer`` the first is only recorded (``requested``), for the run to stop at its next step
    boundary, and a second one, 2 s or more later, raises. Lightning chains its own SIGTERM handler in
    front of ours while a trainer runs, unless the block starts inside the run."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _requested.clear()
    _defer[0] = defer
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.getsignal(s) for s in signals}
    for s in signals:
        signal.signal(s, _handler)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


# ---------------------------------------------------------------------------------------------------------
# The run


def run_evaluation(trainer: Any, model: Any, datamodule: Any, print_summary: bool = True) -> dict[str, Any]:
    """Choose alpha* (and k*) on the selection splits (when ``model.selects``), then report on the test
    splits; returns the evaluator's ``results``."""
    from lightning.pytorch.utilities import rank_zero_info

    with stop_on_signals():
        try:
            datamodule.setup("validate")
            if model.selects and datamodule.loader_splits("selection"):
                trainer.validate(model, datamodule=datamodule, verbose=False)
            trainer.test(model, datamodule=datamodule, verbose=False)
        except RunInterrupted:
            launcher = getattr(trainer.strategy, "launcher", None)
            if hasattr(launcher, "kill"):  # DDP worker processes started by this one stop too
                launcher.kill(signal.SIGTERM)
            raise
    if print_summary and model.summary:
        rank_zero_info("\n" + model.summary)
    return model.results


def run_comparison(cli: Any, checkpoints: Mapping[str, str]) -> dict[str, Any]:
    """Tuned vs boosted vs base: the parsed config's evaluation for every checkpoint, each into
    ``<output_dir>/<label>/``, then one table in the evaluator's layout (Table 4 for scored tasks, Table 2
    for generation) printed and written with every run's results to ``<output_dir>/results.json``.

    Refused before the first run starts: fewer than two checkpoints, a label that is not a plain word (it
    names an output folder), and a checkpoint that does not load (the evaluator's ``check_checkpoint``:
    config and tokenizer, no weights), so that a missing last one stops the run before the first is
    evaluated."""
    from lightning.pytorch.utilities import rank_zero_info

    if len(checkpoints) < 2:
        raise ConfigError(f"--compare needs at least two checkpoints (label: path), got {dict(checkpoints)}")
    for label in checkpoints:
        if not label or "/" in label or label.startswith("."):
            raise ConfigError(f"--compare: {label!r} cannot name an output folder; use a plain word")
    template = cli.model
    for label, path in checkpoints.items():
        try:
            template.check_checkpoint(path)
        except CblightError as err:
            raise ConfigError(f"--compare {label}: {err}; nothing was evaluated") from None
    base_dir = Path(template.output_dir)
    hparams = {k: v for k, v in template.hparams.items() if not k.startswith("_")}  # init args only
    first = next(iter(checkpoints.values()))
    if cli.datamodule.splits == {} and hasattr(cli.datamodule, "tokenizer"):
        # prompts render with the special tokens of the checkpoints compared, not of the config's model
        cli.datamodule.tokenizer = first
    runs: dict[str, Any] = {}
    for label, path in checkpoints.items():
        args = {
            **hparams,
            "model": path,
            "tokenizer": None,
            "output_dir": str(base_dir / label),
            "run_label": label,
            **template.comparison_overrides(hparams, first),
        }
        module = type(template)(**args)
        trainer = cli.instantiate_trainer(logger=cli.trainer.loggers or False, callbacks=[])
        runs[label] = run_evaluation(trainer, module, cli.datamodule, print_summary=False)
    table, rows = type(template).comparison_table(runs)
    payload = {"checkpoints": dict(checkpoints), "summary": table, "rows": rows, "runs": runs}
    if cli.trainer.is_global_zero:
        path = atomic_write_json(base_dir / "results.json", payload)
        rank_zero_info(f"\nComparison ({', '.join(checkpoints)})\n{table}\n\nresults: {path}")
    return payload


# ---------------------------------------------------------------------------------------------------------
# The command


def exit_on_bad_input(fn: Any) -> Any:
    """Run ``fn``; bad input (a ``CblightError``, also one jsonargparse wraps while it instantiates a class)
    becomes one line on stderr and exit status 2, a stop by a signal one line and 128 + its number."""
    try:
        return fn()
    except RunInterrupted as stop:
        print(
            f"error: {stop}: finished work is kept (an evaluation's cache, tuning's last checkpoint); "
            "rerun the same command to resume",
            file=sys.stderr,
        )
        raise SystemExit(128 + stop.signum) from None
    except Exception as err:
        bad: BaseException | None = err
        for _ in range(20):
            if bad is None or isinstance(bad, CblightError):
                break
            bad = bad.__cause__ or bad.__context__
        if not isinstance(bad, CblightError):
            raise
        print(f"error: {bad}", file=sys.stderr)
        raise SystemExit(2) from None


def run_subcommands(commands: dict[str, Any], argv: list[str] | None, prog: str | None, about: str) -> int:
    """Runs a command of subcommands (``cblight data list|peek``), each a function whose signature gives its
    options and that returns the text to print; the exit status: 0, or 2 for bad input (one line)."""
    from jsonargparse import auto_cli

    from cblight.parse_errors import Parser

    try:
        print(
            exit_on_bad_input(
                lambda: auto_cli(commands, args=argv, prog=prog, description=about, parser_class=Parser)
            )
        )
    except SystemExit as stop:  # --help (0), a parse error or bad input (2)
        return stop.code if isinstance(stop.code, int) else 0
    return 0
