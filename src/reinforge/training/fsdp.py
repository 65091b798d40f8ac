"""FSDP2 sharding of the policy (`[trainer.distributed] sharding = "fsdp2"`).

`torch.distributed.fsdp.fully_shard` is applied to every decoder layer (the classes the model names
in `_no_split_modules`) and to the root, so each rank keeps 1/N of the weights, gradients and AdamW
state, and a forward or backward gathers one layer at a time. Gradients are reduce-scattered as a
SUM (divide factor 1, sum-only collectives, which gloo supports too): each rank's gradient is
already its share of the whole batch's loss (`loss_scales`), so the shares must be added, not
averaged.

The full weights and optimiser state exist only when gathered, which is a collective every rank
joins (`Policy.engine_state` / `Policy.state_dict` on the leader, `follow_leader` elsewhere). The
gathered optimiser state is converted to the layout `torch.optim.Optimizer.state_dict` uses (the
parameters numbered in order), so a checkpoint is the same file whichever sharding wrote it and
either can resume it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from reinforge.algorithms import PPO, Algorithm
from reinforge.errors import InvalidRequestError
from reinforge.training.config import OptimSettings

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)
"""Whole tensors, gathered to rank 0's CPU memory (the other ranks get an empty dict): what the
engine loads and a checkpoint stores, without a second full copy on any GPU."""


def refuse_unshardable(algorithm: Algorithm, optim: OptimSettings) -> None:
    """Raise unless FSDP2 can train this: the full model, without PPO's value head (a separate,
    unsharded module whose forward passes only the leader makes) or LoRA adapters (small enough to
    replicate, and peft's per-role switching is not written for sharded layers)."""
    if optim.lora is not None or isinstance(algorithm, PPO):
        raise InvalidRequestError(
            "distributed.sharding = 'fsdp2' trains the full model without a value head: drop "
            "[trainer.optim.lora] or use another algorithm than PPO, or use sharding = 'replicate'"
        )


def shard_model(model: torch.nn.Module) -> None:
    """Shard `model` in place: each decoder layer, then the root (embeddings, final norm, head)."""
    layer_classes = set(getattr(model, "_no_split_modules", None) or ())
    for module in list(model.modules()):
        if module is not model and type(module).__name__ in layer_classes:
            fully_shard(module)
    fully_shard(model)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)


def trained_names(model: torch.nn.Module) -> list[str]:
    """The trained parameters' names, in the order the policy's optimiser holds them."""
    return [name for name, p in model.named_parameters() if p.requires_grad]


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Collective: the whole weights on rank 0's CPU (empty elsewhere)."""
    state: dict[str, Any] = get_model_state_dict(model, options=_FULL)
    return state


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Collective: AdamW's whole state on rank 0 (empty elsewhere), numbered like
    `optimizer.state_dict()` of the unsharded policy."""
    state: dict[str, Any] = get_optimizer_state_dict(model, optimizer, options=_FULL)
    if not state:
        return {}
    index = {name: i for i, name in enumerate(trained_names(model))}
    return {
        "state": {index[name]: value for name, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [index[name] for name in group["params"]]} for group in state["param_groups"]
        ],
    }


def load_full_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, numbered: Mapping[str, Any]
) -> None:
    """Collective: give the sharded `optimizer` the whole state `numbered` (the unsharded
    optimiser's `state_dict()`, present on every rank); each rank keeps its shard of it."""
    names = trained_names(model)
    state: Any = {
        "state": {names[i]: value for i, value in numbered["state"].items()},
        "param_groups": [
            {**group, "params": [names[i] for i in group["params"]]} for group in numbered["param_groups"]
        ],
    }
    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def as_full(value: torch.Tensor) -> torch.Tensor:
    """A reduced value (the gradient norm of sharded gradients) as one ordinary tensor."""
    return value.full_tensor() if isinstance(value, DTensor) else value
