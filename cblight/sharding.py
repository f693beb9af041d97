"""Models sharded over processes with PyTorch's FSDP2 (``fully_shard`` over a DeviceMesh), through Lightning's
``ModelParallelStrategy``, and the one rule every sharded model call keeps (docs/tuning.md, "Models that
outgrow one GPU").

* ``FSDP2Strategy``: Lightning's ``ModelParallelStrategy`` with every process a data-parallel rank (the
  mesh is the whole world, no tensor parallelism), the strategy of ``-c configs/fsdp.yaml``; it runs on
  CPU (gloo) as on GPUs (NCCL), on one node or many.
* ``build_causal_lm``: the one home of "a model for this strategy": ``cblight.models.load_causal_lm`` when
  nothing is sharded; under FSDP2 ``build_sharded_causal_lm``, which builds the model on the meta device,
  applies ``fully_shard`` to each decoder layer and the root over the mesh, and fills each process's shards from the
  checkpoint's safetensors files, reading only the rows that process owns, one tensor at a time: no
  process ever holds the whole model.
* ``SyncedForwards``: under FSDP2 every forward of a sharded model is a collective (each layer's weights
  are all-gathered), so every process must make the same calls of a model in the same order. A phase of
  calls whose number depends on the data (a teacher's chunks and windows, a batch of texts) counts them
  and pads with 1-token forwards up to the most any process made before the next phase starts.
* ``full_state_dict``: the whole weights, gathered once onto the CPU of rank 0 (the export);
  ``consolidate_checkpoint``: a distributed checkpoint directory as one file that loads in one process.

Nothing here imports a wing; the tuning module, both evaluators and the benchmarks build through it.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.strategies import ModelParallelStrategy

from cblight.errors import ConfigError
from cblight.models import (
    LoadOptions,
    ModelLoadError,
    check_dtype_supported,
    checkpoint_config,
    load_causal_lm,
    resolve_model_path,
)

log = logging.getLogger(__name__)

__all__ = [
    "FSDP2Strategy",
    "SyncedForwards",
    "build_causal_lm",
    "build_sharded_causal_lm",
    "consolidate_checkpoint",
    "decoder_layers",
    "fsdp_mesh",
    "full_state_dict",
    "is_sharded",
    "local_numel",
]


class FSDP2Strategy(ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` (FSDP2) with every process one data-parallel rank: the model is
    sharded over all ``num_nodes x devices`` processes and each process reads its own share of the data.
    (``ModelParallelStrategy``'s own default splits the mesh into nodes and tensor-parallel devices, which
    cblight's models do not use.) Its other arguments are ``ModelParallelStrategy``'s.

    Args:
        save_distributed_checkpoint: every process writes its shards of the weights and optimizer states
            (``*.distcp`` files in a ``.ckpt`` directory); ``False`` gathers them into one file on rank 0.
        process_group_backend: ``gloo`` (CPU) or ``nccl`` (GPUs); default: the device's.
    """

    def __init__(self, save_distributed_checkpoint: bool = True, process_group_backend: str | None = None):
        super().__init__(
            data_parallel_size="auto",
            tensor_parallel_size=1,
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
        )

    def setup_environment(self) -> None:
        self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()


def is_sharded(trainer: Any) -> bool:
    """Whether a trainer shards its model with FSDP2 (Lightning's ``ModelParallelStrategy``).

    Args:
        trainer: a Lightning ``Trainer``, or ``None`` (a module used outside one).

    Returns:
        ``True`` when its strategy is a ``ModelParallelStrategy`` (``FSDP2Strategy`` among them).
    """
    return trainer is not None and isinstance(getattr(trainer, "strategy", None), ModelParallelStrategy)


def fsdp_mesh(trainer: Any) -> Any | None:
    """The 1-D DeviceMesh a trainer's FSDP2 strategy shards over (its data-parallel dimension). A mesh with
    tensor parallelism is refused (``ConfigError``): cblight's models shard with FSDP2 alone.

    Args:
        trainer: a Lightning ``Trainer`` whose strategy has set up its mesh, or ``None``.

    Returns:
        The data-parallel DeviceMesh, or ``None`` when the model is not sharded.
    """
    if not is_sharded(trainer):
        return None
    mesh = trainer.strategy.device_mesh
    if mesh["tensor_parallel"].size() != 1:
        raise ConfigError(
            f"trainer.strategy: tensor_parallel_size {mesh['tensor_parallel'].size()} is not supported: cblight "
            "shards its models with FSDP2 alone; use -c configs/fsdp.yaml (cblight.sharding.FSDP2Strategy)"
        )
    return mesh["data_parallel"]


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks, each sharded on its own by ``build_sharded_causal_lm``.

    Args:
        model: a transformers model; its ``_no_split_modules`` names the block classes (``GPT2Block``,
            ``LlamaDecoderLayer``...).

    Returns:
        The blocks in module order, outermost first (a block inside another is not listed again).
    """
    names = set(getattr(model, "_no_split_modules", None) or ())
    found: list[torch.nn.Module] = []
    for module in model.modules():
        if type(module).__name__ in names and not any(module in set(f.modules()) for f in found):
            found.append(module)
    return found


def _weight_files(path: Path, name: str) -> dict[str, Path]:
    """Which safetensors file of a checkpoint directory holds each tensor."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        return {key: path / file for key, file in weight_map.items()}
    single = path / "model.safetensors"
    if single.is_file():
        from safetensors import safe_open

        with safe_open(str(single), framework="pt") as f:
            return dict.fromkeys(f.keys(), single)
    held = sorted(p.name for p in path.iterdir())[:6] if path.is_dir() else []
    raise ModelLoadError(
        f"cannot shard model {name!r}: FSDP2 loading reads safetensors weights one tensor at a time, and "
        f"{path} has none ({', '.join(held) or 'no files'}); save it with save_pretrained (safetensors), or "
        "tune it replicated (DDP)"
    )


def _local_dir(name: str, load: LoadOptions) -> Path:
    """The checkpoint's local directory: the path itself, an ``offline:`` model's converted directory, or
    a Hub id's snapshot (its config, weights and tokenizer files; from the cache when offline)."""
    path = Path(resolve_model_path(name, load.revision)).expanduser()
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    try:
        return Path(
            snapshot_download(str(name), revision=load.revision, allow_patterns=["*.json", "*.safetensors"])
        )
    except Exception as err:  # the Hub's errors are many; the message names the model
        raise ModelLoadError(f"cannot load model {name!r} for FSDP2: {type(err).__name__}: {err}") from err


def _local_slice(param: torch.Tensor) -> tuple[slice, ...]:
    """The index of the global tensor that this process's shard of ``param`` (a DTensor) holds."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    return tuple(slice(o, o + s) for o, s in zip(offset, shape, strict=True))


@torch.no_grad()
def _fill_from_checkpoint(model: torch.nn.Module, files: dict[str, Path], name: str) -> None:
    """Copy each parameter's local shard (and each persistent buffer the checkpoint holds) from the
    safetensors files, reading only that shard's rows; a tied parameter is read once under any of its
    names."""
    from safetensors import safe_open
    from torch.distributed.tensor import DTensor

    handles = {file: safe_open(str(file), framework="pt") for file in set(files.values())}
    aliases: dict[int, list[str]] = {}
    for key, tensor in [*model.named_parameters(remove_duplicate=False), *model.named_buffers()]:
        aliases.setdefault(id(tensor), []).append(key)
    params = dict(model.named_parameters())
    for key, tensor in [*params.items(), *model.named_buffers()]:
        stored = next((a for a in aliases[id(tensor)] if a in files), None)
        if stored is None:
            if key in params:
                raise ModelLoadError(
                    f"cannot shard model {name!r}: its checkpoint has no tensor {key!r} (transformers converts "
                    "some checkpoints while loading them, which FSDP2 loading does not); tune it replicated (DDP)"
                )
            continue  # a buffer the model computes itself (rotary inv_freq): kept as built
        if isinstance(tensor, DTensor):
            local = tensor.to_local()
            if local.numel():
                local.copy_(handles[files[stored]].get_slice(stored)[_local_slice(tensor)])
        else:  # a buffer (small), or a parameter of a module left unsharded
            tensor.copy_(handles[files[stored]].get_tensor(stored))


def build_sharded_causal_lm(
    name: str, load: LoadOptions, mesh: Any, *, reshard_after_forward: bool = True
) -> torch.nn.Module:
    """A causal LM sharded with FSDP2 over ``mesh``, built without any process holding it whole: the model is
    made on the meta device (buffers such as rotary ``inv_freq`` real), each decoder layer
    (``decoder_layers``) and then the root (embeddings, final norm, output layer; a tied output layer stays
    tied) are sharded by ``fully_shard``, and each process's shards are allocated and read from the checkpoint's
    safetensors files (``model.safetensors`` or its index), only the rows it owns. In eval mode, as
    ``cblight.models.load_causal_lm`` returns it; its forward, ``generate`` (with ``synced_gpus``) and
    ``save_pretrained`` of ``full_state_dict`` work as for the whole model.

    Args:
        name: a Hub id, a local directory or an ``offline:`` name.
        load: revision, dtype and remote code (``LoadOptions``).
        mesh: the 1-D DeviceMesh of the processes that share the model (``fsdp_mesh``).
        reshard_after_forward: free each layer's gathered weights after its forward (FSDP2's default, the
            least memory).

    Returns:
        The sharded model (its parameters DTensors of this process's rows).
    """
    from accelerate import init_empty_weights
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM, GenerationConfig

    check_dtype_supported(name, load)
    config = checkpoint_config(name, load)
    path = _local_dir(name, load)
    files = _weight_files(path, name)
    dtype = load.torch_dtype
    if dtype == "auto":
        dtype = getattr(config, "dtype", None) or torch.float32
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    # parameters on the meta device, buffers real: the computed ones (rotary inv_freq) are not in checkpoints
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(
            config, dtype=dtype, trust_remote_code=load.trust_remote_code
        )
    model.tie_weights()  # accelerate's meta parameters untie the output layer from the embeddings
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    buffers = {key: b.detach().clone() for key, b in model.named_buffers()}
    model.to_empty(device=mesh.device_type)
    with torch.no_grad():
        for key, b in model.named_buffers():
            b.copy_(buffers[key])
    _fill_from_checkpoint(model, files, name)
    if (path / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(str(path))
    model.config._name_or_path = str(path)
    model.eval()
    return model


def build_causal_lm(
    name: str,
    load: LoadOptions = LoadOptions(),
    *,
    mesh: Any | None = None,
    device: torch.device | str | None = None,
    device_map: str | dict | None = None,
) -> torch.nn.Module:
    """A model for the run's strategy: sharded over ``mesh`` (``build_sharded_causal_lm``) when there is one,
    else ``cblight.models.load_causal_lm`` (whole, on ``device``, or placed by ``device_map``).

    Args:
        name: a Hub id, a local directory or an ``offline:`` name.
        load: revision, dtype and remote code.
        mesh: the FSDP2 mesh (``fsdp_mesh(trainer)``), or ``None``.
        device: where a whole model goes.
        device_map: accelerate's placement of a whole model over devices (not with ``mesh``).

    Returns:
        The model, in eval mode.
    """
    if mesh is None:
        return load_causal_lm(name, load, device=device, device_map=device_map)
    if device_map is not None:
        raise ConfigError(
            "model.device_map places a whole model over devices of one process; under FSDP2 (trainer.strategy "
            "ModelParallelStrategy) the processes share it: leave device_map unset"
        )
    return build_sharded_causal_lm(name, load, mesh)


def local_numel(module: torch.nn.Module) -> int:
    """How many parameter elements this process holds of a module.

    Args:
        module: a module, sharded (DTensor parameters) or not.

    Returns:
        The number of elements of its parameters, a DTensor's local shard counted for the DTensor.
    """
    from torch.distributed.tensor import DTensor

    return sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in module.parameters())


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole weights of a sharded model, gathered tensor by tensor onto rank 0's CPU; every process must
    call it (a collective).

    Args:
        model: the model, sharded over the processes by ``fully_shard``.

    Returns:
        On rank 0, parameter and buffer name to full CPU tensor, a tied parameter under its first name only
        (as ``save_pretrained`` writes it); ``{}`` on the other ranks.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    names = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
    return {key: value for key, value in state.items() if key in names}


def consolidate_checkpoint(path: str | Path) -> Path:
    """A distributed (FSDP2) Lightning checkpoint, a directory of ``*.distcp`` shards beside ``meta.pt``, as
    one file ``<path>.consolidated`` that loads in one process (``CoherenceTuning.load_from_checkpoint``):
    the whole weights and every entry of ``meta.pt`` (hyperparameters, step, sampling random states); the
    optimizer's states are left out.

    Args:
        path: the checkpoint directory (e.g. ``.../checkpoints/last_good.ckpt``).

    Returns:
        The consolidated file's path.
    """
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    path = Path(path)
    if not ((path / "meta.pt").is_file() and (path / ".metadata").is_file()):
        raise ConfigError(f"{path} is not a distributed checkpoint (a directory with meta.pt and .metadata)")
    out = path.with_name(path.name + ".consolidated")
    gathered = out.with_name(out.name + ".part")
    dcp_to_torch_save(path, gathered)
    try:
        state = torch.load(gathered, map_location="cpu", weights_only=True)
    finally:
        gathered.unlink()
    meta = torch.load(path / "meta.pt", map_location="cpu", weights_only=True)
    torch.save({**meta, "state_dict": state["state_dict"]}, out)
    return out


def _dummy_forward(model: Any) -> None:
    """One 1-token forward: the collectives of a call, at the least cost."""
    param = next(iter(model.parameters()))
    ids = torch.zeros((1, 1), dtype=torch.long, device=param.device)
    model(input_ids=ids, use_cache=False)


class SyncedForwards:
    """Every process calls each sharded model the same number of times, phase by phase.

    A phase (``phase(model)``) holds calls of one model whose number depends on this process's data. It
    keeps the protocol of transformers' ``generate(synced_gpus=True)``: before each of its calls a process
    says so (a max all-reduce of 1); once done, it keeps asking (all-reducing 0) and, while another process
    still calls, joins that call with a 1-token forward; when no process calls any more, all leave the phase
    together. Calls pair up across processes by order alone (a layer's all-gather does not depend on the
    input's shape). ``phase(model, calls=n)`` pads to a number every process knows, with no all-reduce;
    ``most`` agrees on a number (of phases to walk) before any of them. Disabled (``enabled=False``: one
    process, or a replicated model), it does nothing.

    Args:
        enabled: whether the models are sharded over several processes.
        device: where the all-reduced flags live (the process group's device).
    """

    def __init__(self, enabled: bool = False, device: torch.device | str = "cpu"):
        self.enabled = enabled
        self.device = torch.device(device)

    def most(self, local: int) -> int:
        """The largest of every process's number; every process calls it at the same point, before the calls
        it counts.

        Args:
            local: this process's number.

        Returns:
            The maximum over the processes (``local`` itself when disabled).
        """
        if not self.enabled:
            return local
        count = torch.tensor([local], device=self.device)
        torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MAX)
        return int(count.item())

    @contextlib.contextmanager
    def phase(self, model: Any, calls: int | None = None) -> Iterator[None]:
        """A block whose forward calls of a model are synced with every process's (see the class).

        Args:
            model: the sharded model whose calls the block makes (``None``: nothing to sync).
            calls: a number of calls every process knows: the block's calls are padded with 1-token
                forwards to it, with no all-reduce (``None``: synced call by call).

        Yields:
            Nothing; on leaving the block, this process joins the others' remaining calls.
        """
        if not self.enabled or model is None:
            yield
            return
        made = [0]

        def announce(*_: Any) -> None:
            if calls is None:
                self.most(1)  # "I call": pairs with another process's wait below
            made[0] += 1

        # before FSDP's own pre-forward hook (its all-gather), so the flag comes first in every call
        handle = model.register_forward_pre_hook(announce, prepend=True)
        try:
            yield
        finally:
            handle.remove()
        with torch.no_grad():
            if calls is None:
                while self.most(0):  # another process still calls: join its call
                    _dummy_forward(model)
            else:
                if made[0] > calls:
                    raise RuntimeError(f"{made[0]} forward calls in a phase of {calls}")
                for _ in range(calls - made[0]):
                    _dummy_forward(model)
