"""What ``cblight tune`` refuses before the model loads, in one pass on the parsed config
(``check_before_loading``): a run with no step limit (``check_max_steps``), what FSDP2 cannot shard
(``check_strategy``), every directory the run writes, an export it would overwrite, the prompts and guard
bands the validation data cannot check (``check_validation_data``). What tuning asks of the shared option
groups (``check_shared_options``) ``CoherenceTuning`` checks when it is made, with its other options; the
module's ``setup`` runs the same run checks for a ``Trainer.fit`` called from Python, and skips them
for a module that this pass checked. A refusal is one line and costs no model load.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, fields, is_dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from cblight.errors import ConfigError
from cblight.options import Boosting, Sampling
from cblight.tune.callbacks import GuardOptions, resume_interrupted_run

log = logging.getLogger(__name__)

__all__ = [
    "check_before_loading",
    "check_max_steps",
    "check_shared_options",
    "check_strategy",
    "check_validation_data",
]

# How a strategy is named on the command line or in a config, by what cblight makes of it.
_FSDP2 = ("ModelParallelStrategy", "FSDP2Strategy")
_UNTESTED_SHARDING = ("fsdp", "FSDPStrategy", "deepspeed", "DeepSpeedStrategy")


def check_shared_options(boosting: Boosting, sampling: Sampling) -> None:
    """Refuse a boosting that coherence tuning's teacher is not (the last ``k`` tokens boosted in the
    generation form of Table 2, with a non-zero ``alpha``) and a sampling that does not draw one sequence
    per prompt (tuning learns from samples)."""
    if boosting.mode != "last_k":
        raise ConfigError(
            f"boosting.mode must be last_k (the teacher boosts against the last k tokens), got {boosting.mode!r}"
        )
    if boosting.resolved_form != "generation":
        raise ConfigError(
            "boosting.form must be generation or null (Table 2's (1-alpha) log f_max + alpha log f_k), "
            f"got {boosting.form!r}"
        )
    if boosting.alpha == 0 and boosting.adaptive is None:
        raise ConfigError(
            "boosting.alpha = 0 makes the boosted teacher the model itself and the KL identically zero; "
            "use a negative alpha (Table 2: -0.05 or -0.1)"
        )
    if sampling.do_sample is not True:
        raise ConfigError(
            f"sampling.do_sample must be true (coherence tuning samples its sequences), got {sampling.do_sample!r}"
        )
    if sampling.num_beams not in (None, 1):
        raise ConfigError(
            f"sampling.num_beams must be null or 1 (tuning samples, it does not search), got {sampling.num_beams!r}"
        )


def check_strategy(strategy: Any, lora: Any, rollouts: Any) -> None:
    """What a strategy cannot tune, refused in one line (``strategy``: a Lightning strategy, its name, or a
    parsed ``trainer.strategy``): Lightning's FSDP1 and DeepSpeed, which cblight does not shard with (FSDP2
    does: ``-c configs/fsdp.yaml``); and under FSDP2, LoRA (its adapters are not sharded) and the static
    KV cache or a compiled decode step (sharded sampling runs transformers' dynamic cache, synced)."""
    name = strategy if isinstance(strategy, str) else type(strategy).__name__
    class_path = _get(strategy, "class_path")
    if isinstance(class_path, str):
        name = class_path.rpartition(".")[2]
    if name.startswith(_UNTESTED_SHARDING):
        raise ConfigError(
            f"trainer.strategy {name}: cblight tune shards models with FSDP2 (Lightning's "
            "ModelParallelStrategy): use -c configs/fsdp.yaml, or DDP (--trainer.strategy ddp) for a model that "
            "fits one device"
        )
    if name not in _FSDP2:
        return
    if lora.rank:
        raise ConfigError(
            f"lora.rank = {lora.rank} under FSDP2 (trainer.strategy {name}): LoRA adapters are not sharded; "
            "tune with LoRA on one device or with DDP (--trainer.strategy ddp), where the initial model is the "
            "base model with its adapters disabled, not a copy"
        )
    if rollouts.cache == "static" or rollouts.compile:
        raise ConfigError(
            f"rollouts.cache: static / rollouts.compile under FSDP2 (trainer.strategy {name}): sharded sampling "
            "runs transformers' dynamic KV cache with synced steps; use rollouts.cache: dynamic or auto"
        )


def check_max_steps(max_steps: int | None) -> None:
    """Refuse a run without a step limit (the prompt stream never ends) or with no step to take: a run that
    takes no optimizer step would export the base model as if it were tuned."""
    if max_steps is None or max_steps == -1:
        raise ConfigError("set trainer.max_steps: the prompt stream never ends (the paper runs 32 steps)")
    if max_steps < 1:
        raise ConfigError(
            f"trainer.max_steps = {max_steps} takes no optimizer step, so nothing would be tuned or exported; "
            "set it to 1 or more (the paper runs 32)"
        )


# What switches the default guard off, as a user types it
GUARD_OFF = "--model.guard.max_ppl_ratio null --model.guard.min_entropy_ratio null"


def check_validation_data(guard: GuardOptions, datamodule: Any, refuse_unguarded: bool = False) -> None:
    """A guard band set by hand must be checkable: any needs validation prompts, ``max_ppl_ratio`` held-out
    human text too. With ``refuse_unguarded`` (the command line, before the model loads) the default guard
    needs validation prompts as well: a guard that is on must look at the model it lets through. Otherwise
    the default bands are checked where the run measures them, and one line says which are not.

    Args:
        guard: the guard's bands.
        datamodule: the prompt data module (one without ``val_prompts`` is not checked).
        refuse_unguarded: refuse a guard that is on in a run without validation prompts.
    """
    if not guard.enabled or not hasattr(datamodule, "val_prompts"):
        return
    defaults = {f.name: f.default for f in fields(guard)}
    chosen = [k for k, v in vars(guard).items() if v is not None and v != defaults[k]]
    validated = bool(datamodule.val_prompts())
    texts = validated and bool(datamodule.val_texts())
    if chosen and not validated:
        raise ConfigError(f"the guard checks validation (guard.{chosen[0]}): set data.val_size > 0")
    if "max_ppl_ratio" in chosen and not texts:
        raise ConfigError(
            "guard.max_ppl_ratio needs held-out human text: a task source (data.task) with "
            "data.val_size > 0, or data.val_texts_file"
        )
    if refuse_unguarded and not validated:
        raise ConfigError(
            "the collapse guard (on by default) checks the model at validation and this run has none "
            f"(data.val_size 0): set data.val_size > 0 (e.g. 8), or switch the guard off ({GUARD_OFF})"
        )
    if not validated:
        log.warning("collapse guard: this run has no validation (data.val_size 0), so nothing is guarded")
    elif guard.max_ppl_ratio is not None and not texts:
        log.warning(
            "collapse guard: guard.max_ppl_ratio is not checked: no held-out human text (a task source, or "
            "data.val_texts_file)"
        )


def check_export_apart(out: Path, root: Path, save_dirs: list[Path]) -> None:
    """Refuse an export directory that holds the run's own files: ``trainer.default_root_dir`` itself, or a
    directory above a logger's ``save_dir`` (the run's logs and checkpoints would land in the export, and
    the export check would take them for an earlier run's files)."""
    resolved = out.expanduser().resolve()
    inside = [("trainer.default_root_dir", root), *(("trainer.logger's save_dir", d) for d in save_dirs)]
    for option, path in inside:
        path = path.expanduser().resolve()
        if path == resolved or resolved in path.parents:
            raise ConfigError(
                f"model.export.dir {str(out)!r} holds this run's own files ({option} {str(path)!r}: its logs "
                "and checkpoints): choose a directory of its own, e.g. --model.export.dir hf_model"
            )


def _get(group: Any, key: str, default: Any = None) -> Any:
    """A field of a parsed option group (a jsonargparse Namespace or a mapping; anything else has none)."""
    value = group.get(key) if hasattr(group, "get") else None
    return default if value is None else value


def _plain(group: Any) -> dict[str, Any]:
    """A parsed option group as a plain mapping (read, not built: the module builds its groups once)."""
    if hasattr(group, "as_dict"):
        group = group.as_dict()
    if is_dataclass(group):
        group = asdict(group)
    return {k: v for k, v in dict(group or {}).items() if not k.startswith("__")}


def check_before_loading(
    config: Any,
    datamodule_class: type,
    build: Callable[[], Any],
    locks: list[Any] | None,
    saved_config: Callable[[], dict[str, Any]],
) -> tuple[Any, Any]:
    """The one check pass of ``cblight tune``, before the model loads. From the parsed config: the step
    limit, what the strategy cannot shard, every directory the run writes (``trainer.default_root_dir``, the
    loggers' ``save_dir``, ``model.export.dir``: creatable and writable), an export already in
    ``model.export.dir`` (refused unless ``export.overwrite``), a guard with validation turned off, and the
    prompt data module, made here once. Then ``build`` makes the module (it checks its own options and the
    checkpoint's config and tokenizer, no weights), and the prompts are read and checked: a source with none,
    ``data.val_size`` too large, a batch larger than them, what the guard needs, a prompt too short for
    ``boosting.k``. The module is then marked checked (``run_checked``), so that neither its ``setup`` nor
    its exporter's checks again. With ``locks`` (the launching process), the export directory is locked for
    this run and the lock appended there, for the caller to release when the run ends. A run of the same
    config that was interrupted resumes from its last checkpoint (``ckpt_path`` set in ``config``).

    Args:
        config: the parsed ``fit`` config (its ``ckpt_path`` is set when an interrupted run resumes).
        datamodule_class: the prompt data module's class, made here once from ``data``.
        build: makes the module from the config (the parser's instantiation) and returns it.
        locks: where the launching process keeps its locks (``None`` in the processes a launcher started).
        saved_config: makes the config as ``config.yaml`` would hold it (``resume_interrupted_run``).

    Returns:
        The module and the data module, checked.
    """
    from cblight.runs import OutputLock, check_output_dir
    from cblight.tune.export import check_export_dir

    trainer, model = config.get("trainer") or {}, config.get("model") or {}
    check_max_steps(_get(trainer, "max_steps"))
    # read from the config, not made: the module makes its option groups, once, in ``build``
    lora, rollouts, export = (
        SimpleNamespace(**_plain(_get(model, name))) for name in ("lora", "rollouts", "export")
    )
    check_strategy(_get(trainer, "strategy", "auto"), lora, rollouts)
    root = Path(_get(trainer, "default_root_dir", ".")).expanduser()
    check_output_dir(root, "trainer.default_root_dir")
    loggers, save_dirs = _get(trainer, "logger"), []
    for logger in loggers if isinstance(loggers, list) else [loggers]:
        save_dir = _get(_get(logger, "init_args"), "save_dir")
        if isinstance(save_dir, str):
            save_dirs.append(Path(save_dir))
            check_output_dir(Path(save_dir), "trainer.logger's save_dir")
    if export.enabled and export.dir:  # else the exporter checks and locks it (its ``setup``)
        out = root / Path(export.dir).expanduser()
        check_export_apart(out, root, save_dirs)
        check_output_dir(out, "model.export.dir")
        check_export_dir(out, export.overwrite)
        if locks is not None:
            locks.append(OutputLock(out, option="model.export.dir").acquire())
    guarded = any(v is not None for v in _plain(_get(model, "guard")).values())
    if guarded and _get(trainer, "limit_val_batches", 1) == 0:
        raise ConfigError(
            "the collapse guard (on by default) checks the model at validation and trainer.limit_val_batches 0 "
            f"turns validation off: drop it, or switch the guard off ({GUARD_OFF})"
        )
    data = config.get("data")
    datamodule = datamodule_class(**_plain(data)) if data is not None else None

    module = build()
    if hasattr(datamodule, "train_prompts"):
        prompts = datamodule.train_prompts()  # an empty source, or val_size >= the prompts, is refused here
        datamodule.check_batch_size()
        # a guard with nothing to look at is refused here; one that cannot check a band says so, once
        check_validation_data(module.guard_options, datamodule, refuse_unguarded=True)
        module.check_prompts(prompts)  # the tokenizer alone: no weights
    module.run_checked = True

    if config.get("ckpt_path") is None:
        resume_interrupted_run(config, saved_config, locks)
    return module, datamodule
