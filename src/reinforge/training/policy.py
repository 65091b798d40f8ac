"""The policy update: any Hugging Face causal LM, full or LoRA, trained on transitions with advantages.

One `update` is one optimiser step per epoch over a step's transitions: micro-batches by token budget,
gradients accumulated with loss scales computed once over the whole batch (so the result does not
depend on how the batch was split), the clipped policy-gradient loss from `reinforge.algorithms` with
the gateway's behaviour logprobs, and for PPO a value head trained alongside.

With `lora.roles` there is one adapter per role on one frozen base: each adapter is trained only on
its role's transitions (the loss aggregated within the role as `loss_agg` says, each role weighted by
its share of the trained transitions), transitions of roles without an adapter are skipped, and an
adapter with no transitions in a step gets no gradient, so AdamW leaves it bit-identical.

Two shortcuts leave the gradient unchanged (up to float summation order): rows that share a prompt (a
GRPO group) encode it once (`reinforge.algorithms.shared_prefix`), and, when nothing but the
policy-gradient term is optimised (no KL penalty, no value head), rows with a zero advantage (flat
groups) skip the forward pass, since every token of theirs has zero loss. Their tokens still count in
the loss scales; the diagnostic means (entropy, clip fractions, ratios) are over the rows trained.

The policy lives on one device (`Placement`): the model, the value head, the reference copy and every
tensor of the update are put there, and with bfloat16 the forward passes run under autocast over
float32 weights. With `data_parallel` (`reinforge.training.distributed`) every rank runs `update` on
the same whole batch: the loss scales and which roles are trained come from all of it, each rank
computes forward and backward passes on its share of the rows only (balanced by tokens), and the
gradients are summed across ranks before clipping and the optimiser step. With FSDP2 sharding
(`reinforge.training.fsdp`, applied by `shard` once every rank holds the same weights) the sum is
FSDP's reduce-scatter, every rank runs the same number of forward and backward passes (a rank with
fewer rows adds zero-loss passes, since every pass is a collective), and the full state for the
engine or a checkpoint is gathered with every rank taking part.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from transformers import PreTrainedModel

from reinforge.algorithms import (
    PPO,
    Algorithm,
    TokenBatch,
    ValueHead,
    collate_transitions,
    compute_token_logprobs,
    loss_scales,
    policy_loss,
    value_loss,
)
from reinforge.algorithms.logprobs import TokenLogprobs, check_sampling
from reinforge.algorithms.shared_prefix import shared_prefix_logprobs
from reinforge.engine.adapters import lora_key
from reinforge.errors import InvalidRequestError
from reinforge.training import fsdp
from reinforge.training.config import LoraSettings, OptimSettings
from reinforge.training.device import CPU, Placement
from reinforge.training.distributed import DataParallel, GatherPurpose, LeaderOrder
from reinforge.training.microbatch import micro_batches, transition_length
from reinforge.types import Transition

_ADDITIVE = frozenset({"loss/policy", "loss/total", "value/loss", "tokens"})
_PEAKS = frozenset({"policy/ratio_max", "policy/behaviour_drift_max"})
"""Metrics that are a maximum over the batch's tokens: the largest micro-batch's value, not a mean."""


def _fused_adamw_supported(params: Sequence[torch.nn.Parameter]) -> bool:
    """Whether AdamW's fused kernel takes these parameters: one kernel for all of them instead of
    a dozen small ops per parameter, with the same result up to float rounding (docs/training.md
    has the measurement), on every step, flat batches included."""
    return bool(params) and all(
        p.device.type in ("cpu", "cuda") and p.dtype in (torch.float32, torch.float16, torch.bfloat16)
        for p in params
    )


def wrap_lora(model: PreTrainedModel, settings: LoraSettings) -> torch.nn.Module:
    """Freeze `model` and add LoRA adapters (peft) on the configured projections: one, or with
    `settings.roles` one per role, named after it."""
    from peft import LoraConfig, get_peft_model

    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [m for m in settings.target_modules if m not in present]
    if missing:
        raise InvalidRequestError(
            f"LoRA target modules {missing} are not in the model; it has e.g. {sorted(present)[:12]}"
        )
    config = LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules),
        task_type="CAUSAL_LM",
    )
    if not settings.roles:
        return get_peft_model(model, config)
    wrapped = get_peft_model(model, config, adapter_name=settings.roles[0])
    for role in settings.roles[1:]:
        wrapped.add_adapter(role, config)
    return wrapped


def _vanilla_lora_layers(model: torch.nn.Module) -> list[tuple[str, Any]] | None:
    """Each peft LoRA layer of `model` (with its module path) when all are plain LoRA on an
    `nn.Linear` (no DoRA or other variant, no LoRA bias), else None."""
    from peft.tuners.lora import LoraLayer

    layers: list[tuple[str, Any]] = []
    for path, module in model.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        layer: Any = module
        if (
            not isinstance(layer.get_base_layer(), torch.nn.Linear)
            or layer.lora_variant
            or any(layer.lora_bias.values())
        ):
            return None
        layers.append((path, layer))
    return layers


def lower_frozen_base(model: torch.nn.Module, dtype: torch.dtype) -> int:
    """Store the frozen base weights (and biases) of `model`'s LoRA layers in `dtype`; returns how
    many layers changed. Under autocast to `dtype` the forward computes the same values (the cast
    it would make is already made) and saves these tensors for the backward instead of new copies
    (`LoraSettings.base_dtype`)."""
    layers = _vanilla_lora_layers(model)
    if layers is None:
        raise InvalidRequestError("lora.base_dtype = 'compute' needs plain LoRA on linear layers")
    for _, layer in layers:
        base = layer.get_base_layer()
        for param in (base.weight, base.bias):
            if param is not None and not param.requires_grad:
                param.data = param.data.to(dtype)
    return len(layers)


def merged_lora_state(peft_model: Any) -> dict[str, torch.Tensor] | None:
    """The base model's state with the shared adapter merged in, without copying the model: the
    same values as `merge_and_unload` on a copy (base weight + `get_delta_weight`, in the base
    weight's dtype), new tensors only for the merged weights. None when a layer is not plain LoRA
    on an `nn.Linear` (the caller merges a copy with peft then)."""
    inner: torch.nn.Module = peft_model.get_base_model()
    layers = _vanilla_lora_layers(inner)
    if layers is None:
        return None
    state = {
        k.replace(".base_layer.", "."): v.detach() for k, v in inner.state_dict().items() if ".lora_" not in k
    }
    with torch.no_grad():
        for path, layer in layers:
            weight = layer.get_base_layer().weight
            merged = weight.detach().float() if weight.dtype != torch.float32 else weight.detach().clone()
            for adapter in layer.active_adapters:
                if adapter in layer.lora_A:
                    merged += layer.get_delta_weight(adapter).float()
            state[f"{path}.weight"] = merged.to(weight.dtype)
    return state


def _adapter_of(parameter_name: str) -> str | None:
    """The adapter a peft parameter belongs to (`...q_proj.lora_A.<adapter>.weight`), or None."""
    parts = parameter_name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part.startswith("lora_"):
            return parts[i + 1]
    return None


class Policy:
    """The trainable policy and its optimiser; see the module docstring."""

    def __init__(
        self,
        model: PreTrainedModel,
        algorithm: Algorithm,
        optim: OptimSettings,
        *,
        pad_token_id: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        share_prompts: bool = True,
        placement: Placement = CPU,
        data_parallel: DataParallel | None = None,
    ) -> None:
        """`temperature`, `top_p` and `top_k` are the rollouts' sampling: π is the distribution they
        sample from (`compute_token_logprobs`), the one the behaviour logprobs were recorded under.
        `model` is moved to `placement.device`; with `data_parallel`, see the module docstring."""
        self.algorithm = algorithm
        self.placement = placement
        self.device = placement.device
        self.data_parallel = data_parallel
        self._fsdp = data_parallel is not None and data_parallel.sharding == "fsdp2"
        """Sharding asked for: `shard` applies it (until then the model is whole on every rank)."""
        self._sharded = False
        if self._fsdp:
            fsdp.refuse_unshardable(algorithm, optim)
        torch.nn.Module.to(model, self.device)  # in place (PreTrainedModel.to's typing is narrower)
        # Encoding shared prompts once makes the number of forward passes depend on the rows; sharded,
        # every pass is a collective that all ranks must make alike.
        self.share_prompts = share_prompts and not self._fsdp
        self.pad_token_id = pad_token_id
        self.max_grad_norm = optim.max_grad_norm
        self.micro_batch_tokens = optim.micro_batch_tokens
        self.epochs_per_batch = optim.epochs_per_batch
        check_sampling(temperature, top_p, top_k)
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.lora = lora = optim.lora
        self.model: torch.nn.Module = wrap_lora(model, lora) if lora is not None else model
        if lora is not None and lora.base_dtype == "compute" and placement.autocast is not None:
            lower_frozen_base(self.model, placement.autocast)
        self.roles: list[str] = list(lora.roles) if lora is not None and lora.roles else []
        """One adapter per role (empty: the full model, or one shared adapter)."""
        self._role_params: dict[str, list[torch.nn.Parameter]] = {role: [] for role in self.roles}
        if self.roles:
            for name, p in self.model.named_parameters():
                role = _adapter_of(name)
                if role in self._role_params:
                    p.requires_grad_(True)  # peft leaves only the active adapter trainable
                    self._role_params[role].append(p)
        self.model.train()
        self.value_head: ValueHead | None = None
        if isinstance(algorithm, PPO):
            self.value_head = ValueHead(int(model.config.hidden_size)).to(self.device)
        # The reference policy for the KL penalty is the starting policy, frozen. With LoRA it is the
        # base model with adapters disabled, so no copy is needed.
        self._reference: torch.nn.Module | None = None
        if algorithm.kl_coef > 0 and lora is None:
            self._reference = copy.deepcopy(model).eval().requires_grad_(False)
        if self.roles:
            params = [p for role in self.roles for p in self._role_params[role]]
        else:
            params = [p for p in self.model.parameters() if p.requires_grad]
        if self.value_head is not None:
            params += list(self.value_head.parameters())
        self.optimizer = torch.optim.AdamW(
            params,
            lr=optim.learning_rate,
            weight_decay=optim.weight_decay,
            fused=_fused_adamw_supported(params) or None,
        )

    # ---- weights for the engine and for checkpoints ---------------------------------------------

    def shard(self) -> None:
        """Apply FSDP2 sharding when the data-parallel settings ask for it (else nothing). Every rank
        calls this once, after the ranks' weights (and a resumed optimiser state) are the same; the
        optimiser is rebuilt over the shards and keeps the state it had."""
        if not self._fsdp or self._sharded:
            return
        loaded = self.optimizer.state_dict()
        defaults = self.optimizer.defaults
        fsdp.shard_model(self.model)
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=defaults["lr"],
            weight_decay=defaults["weight_decay"],
        )
        if loaded["state"]:
            fsdp.load_full_optimizer_state(self.model, self.optimizer, loaded)
        self._sharded = True

    def _gather(self, purpose: GatherPurpose) -> dict[str, Any]:
        """The sharded policy's full state, on rank 0 (a collective: the leader orders the others
        to join, `join_gather`)."""
        dp = self.data_parallel
        assert dp is not None
        if dp.is_leader:
            dp.send(LeaderOrder(kind="gather", gather=purpose))
        with dp.collective():
            state: dict[str, Any] = {"model": fsdp.full_model_state(self.model)}
            if purpose == "checkpoint":
                state["optimizer"] = fsdp.full_optimizer_state(self.model, self.optimizer)
        return state

    def join_gather(self, purpose: GatherPurpose) -> None:
        """A follower's part in the leader's `engine_state` / `state_dict` of a sharded policy."""
        self._gather(purpose)

    def engine_state(self) -> dict[str, torch.Tensor]:
        """Weights in the base model's names, as the engine loads them: one shared LoRA adapter is
        merged in; per-role adapters are not (the engine applies each call's own) and come as
        `lora/<role>/<module path>.lora_A|lora_B|scale` (`reinforge.engine.adapters`). Sharded, the
        weights are gathered (on the CPU) with every rank taking part."""
        if self._sharded:
            return dict(self._gather("engine")["model"])
        if self.lora is None:
            return {k: v.detach() for k, v in self.model.state_dict().items()}
        peft_model: Any = self.model
        if not self.roles:
            state = merged_lora_state(peft_model)
            if state is not None:
                return state
            merged = copy.deepcopy(peft_model).merge_and_unload()
            return {k: v.detach() for k, v in merged.state_dict().items()}
        from peft.tuners.lora import LoraLayer

        inner: torch.nn.Module = peft_model.get_base_model()
        state = {
            k.replace(".base_layer.", "."): v.detach()
            for k, v in inner.state_dict().items()
            if ".lora_" not in k
        }
        for path, layer in inner.named_modules():
            if not isinstance(layer, LoraLayer):
                continue
            module: Any = layer
            for role in self.roles:
                if role in module.lora_A:
                    state[lora_key(role, path, "lora_A")] = module.lora_A[role].weight.detach()
                    state[lora_key(role, path, "lora_B")] = module.lora_B[role].weight.detach()
                    state[lora_key(role, path, "scale")] = torch.tensor(float(module.scaling[role]))
        return state

    def all_parameters(self) -> list[torch.nn.Parameter]:
        """Every parameter of the policy, trained or frozen (the value head's included): what must
        be equal on every rank of a data-parallel run."""
        heads = list(self.value_head.parameters()) if self.value_head is not None else []
        return list(self.model.parameters()) + heads

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint stores; sharded, gathered with every rank taking part (same layout)."""
        if self._sharded:
            return {**self._gather("checkpoint"), "value_head": None}
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "value_head": self.value_head.state_dict() if self.value_head is not None else None,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self._sharded:
            raise RuntimeError("load a checkpoint before `shard`: every rank loads the whole state")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        for group in self.optimizer.param_groups:  # loading restores the saving optimiser's flag
            group["fused"] = self.optimizer.defaults["fused"]
        if self.value_head is not None:
            if state.get("value_head") is None:
                raise InvalidRequestError("the checkpoint has no value head, but the algorithm is PPO")
            self.value_head.load_state_dict(state["value_head"])

    # ---- PPO's critic ----------------------------------------------------------------------------

    @torch.no_grad()
    def values(self, transitions: Sequence[Transition]) -> list[float]:
        """The value head's estimate for each transition's state (its last prompt token)."""
        if self.value_head is None:
            raise InvalidRequestError(f"{type(self.algorithm).__name__} has no value head")
        out = [0.0] * len(transitions)
        for role, members in self._by_role(transitions, with_base=True):
            with self._serving(role):
                for part in micro_batches([transitions[i] for i in members], self.micro_batch_tokens):
                    indices = [members[j] for j in part]
                    batch = collate_transitions([transitions[i] for i in indices], self.pad_token_id)
                    batch = batch.to(self.device)
                    with self.placement.forward_context():
                        lp = compute_token_logprobs(
                            self.model,
                            batch.input_ids,
                            batch.attention_mask,
                            batch.response_mask,
                            with_hidden_states=True,
                        )
                    assert lp.hidden_states is not None
                    values = self.value_head(lp.hidden_states.float(), batch.prompt_lengths - 1)
                    for row, i in enumerate(indices):
                        out[i] = float(values[row])
        return out

    # ---- per-role adapters -----------------------------------------------------------------------

    def _by_role(
        self, transitions: Sequence[Transition], *, with_base: bool = False
    ) -> list[tuple[str | None, list[int]]]:
        """Indices of `transitions` per adapter, in `roles` order (None: every transition when there
        are no per-role adapters; with `with_base`, the transitions of roles without an adapter)."""
        if not self.roles:
            return [(None, list(range(len(transitions))))]
        parts: list[tuple[str | None, list[int]]] = []
        for role in self.roles:
            members = [i for i, t in enumerate(transitions) if t.agent_name == role]
            if members:
                parts.append((role, members))
        if with_base:
            rest = [i for i, t in enumerate(transitions) if t.agent_name not in self._role_params]
            if rest:
                parts.append((None, rest))
        return parts

    @contextmanager
    def _serving(self, role: str | None) -> Iterator[None]:
        """The model as `role` runs: its adapter active, or (a role without one) the plain base."""
        peft_model: Any = self.model
        if not self.roles:
            yield
        elif role is None:
            with peft_model.disable_adapter():
                yield
        else:
            peft_model.set_adapter(role)
            yield

    # ---- the update ------------------------------------------------------------------------------

    @contextmanager
    def _reference_model(self) -> Iterator[torch.nn.Module]:
        if self._reference is not None:
            yield self._reference
            return
        with self.model.disable_adapter():  # type: ignore[operator]
            yield self.model

    def set_learning_rate(self, learning_rate: float) -> None:
        """The learning rate of the next updates (a schedule sets it before each step)."""
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate

    def update(
        self, transitions: Sequence[Transition], returns: Sequence[float] | None = None
    ) -> dict[str, float]:
        """One optimiser step per epoch over `transitions` (advantages filled); returns metrics.

        `returns` are PPO's value targets, aligned with `transitions`. With per-role adapters, only
        the transitions of roles that have one are trained (`update/transitions_without_adapter`
        counts the others). With `data_parallel`, rank 0 first sends the batch to the other ranks.
        """
        if self.device.type == "cuda":  # the trainer calls this from worker threads: their own GPU
            torch.cuda.set_device(self.device)
        dp = self.data_parallel
        if dp is None:
            return self._update(transitions, returns)
        if dp.is_leader:
            dp.send(
                LeaderOrder(
                    kind="update",
                    transitions=list(transitions),
                    returns=list(returns) if returns is not None else None,
                    learning_rate=float(self.optimizer.param_groups[0]["lr"]),
                )
            )
        with dp.collective():
            return self._update(transitions, returns)

    def _update(self, transitions: Sequence[Transition], returns: Sequence[float] | None) -> dict[str, float]:
        dp = self.data_parallel
        kept = [i for i, t in enumerate(transitions) if any(t.response_mask)]
        without_adapter = 0
        if self.roles:
            with_adapter = [i for i in kept if transitions[i].agent_name in self._role_params]
            without_adapter = len(kept) - len(with_adapter)
            kept = with_adapter
        trained = [transitions[i] for i in kept]
        role_metrics = {"update/transitions_without_adapter": float(without_adapter)} if self.roles else {}
        if not trained:
            return {"update/skipped": 1.0, **role_metrics}
        if any(t.advantage is None for t in trained):
            raise InvalidRequestError("every transition needs an advantage before the policy update")
        if self.value_head is not None and (returns is None or len(returns) != len(transitions)):
            raise InvalidRequestError("PPO's update needs one value target (return) per transition")
        targets = [returns[i] for i in kept] if returns is not None else None
        parts = self._by_role(trained)
        # Each role's loss aggregates within the role, weighted by its share of the transitions
        # (one part, weight 1, without per-role adapters).
        scales = [0.0] * len(trained)
        for _, members in parts:
            share = len(members) / len(trained)
            within = loss_scales([trained[i] for i in members], self.algorithm)
            for i, scale in zip(members, within, strict=True):
                scales[i] = scale * share
        total_tokens = float(sum(sum(t.response_mask) for t in trained))
        # Rows whose every token has zero loss and zero gradient need no forward (module docstring).
        pg_only = self.algorithm.kl_coef == 0 and self.value_head is None
        groups: list[tuple[str | None, list[int]]] = []
        skipped = 0
        flat: set[str | None] = set()
        for role, members in parts:
            active = [i for i in members if not (pg_only and trained[i].advantage == 0.0)]
            skipped += len(members) - len(active)
            if not active:
                flat.add(role)
            if dp is not None:  # this rank's share of the rows; the scales stay the whole batch's
                active = [active[j] for j in dp.my_share([transition_length(trained[i]) for i in active])]
            groups += [
                (role, [active[j] for j in g])
                for g in micro_batches([trained[i] for i in active], self.micro_batch_tokens)
            ]
        # What this step moves: the adapters of the roles it has transitions of (others keep no
        # gradient, so AdamW skips them: no momentum, no weight decay), or every parameter.
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        if self.roles:
            params = [p for role, _ in parts if role is not None for p in self._role_params[role]]
            if self.value_head is not None:
                params += list(self.value_head.parameters())
        old: dict[int, torch.Tensor] = {}
        old_values: dict[int, torch.Tensor] = {}
        sums: dict[str, float] = {}
        weights: dict[str, float] = {}
        idle = 0
        if self._sharded and dp is not None:  # passes to add to match the busiest rank (before any)
            idle = max(int(n) for n in dp.gather_objects(len(groups))) - len(groups)
        self.model.train()
        grad_norm = 0.0
        for epoch in range(self.epochs_per_batch):
            self.optimizer.zero_grad(set_to_none=True)
            for g, (role, indices) in enumerate(groups):
                with self._serving(role):
                    metrics = self._micro_step(trained, indices, scales, targets, g, epoch, old, old_values)
                tokens = metrics.get("tokens", 0.0)
                for key, value in metrics.items():
                    if key in _PEAKS:
                        sums[key] = max(sums.get(key, value), value)
                        continue
                    if key == "tokens" or key in _ADDITIVE:
                        # Already scaled parts of the batch's loss: they add up across micro-batches.
                        sums[key] = sums.get(key, 0.0) + value
                        continue
                    # Everything else: token-weighted means over the micro-batches.
                    sums[key] = sums.get(key, 0.0) + value * tokens
                    weights[key] = weights.get(key, 0.0) + tokens
            self._idle_passes(trained, idle)
            for role in flat:
                # Every row of this part was skipped: its gradient is zero, and AdamW still takes its
                # step (momentum moves the weights even on a zero gradient), as after a forward.
                for p in params if role is None else self._role_params[role]:
                    p.grad = torch.zeros_like(p)
            if dp is not None and not self._sharded:  # sharded: summed by FSDP's reduce-scatter
                dp.all_reduce_gradients(params)
            if self.max_grad_norm is not None:
                grad_norm = float(fsdp.as_full(torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)))
            else:
                norms = [p.grad.norm() for p in params if p.grad is not None]
                grad_norm = float(fsdp.as_full(torch.norm(torch.stack(norms))))
            if not math.isfinite(grad_norm):
                self.optimizer.zero_grad(set_to_none=True)
                raise InvalidRequestError("the policy gradient is not finite; lower the learning rate")
            self.optimizer.step()
        self.model.eval()
        micro_batch_count = float(len(groups))
        if dp is not None:  # the diagnostics of every rank's rows, as one process would report them
            sums, weights, micro_batch_count = _merge_rank_metrics(
                dp.gather_objects((sums, weights, micro_batch_count))
            )
        epochs = self.epochs_per_batch
        out = {
            k: (v if k in _PEAKS else v / weights[k] if weights.get(k) else v / epochs)
            for k, v in sums.items()
        }
        out["update/grad_norm"] = grad_norm
        out["tokens"] = total_tokens
        out["update/micro_batches"] = micro_batch_count
        out["update/transitions"] = float(len(trained))
        out["update/rows_without_signal"] = float(skipped)
        out.update(role_metrics)
        for role, members in parts:
            if role is not None:
                out[f"update/transitions/{role}"] = float(len(members))
        return out

    def _idle_passes(self, trained: Sequence[Transition], passes: int) -> None:
        """Sharded: `passes` forward and backward passes with a zero loss, so that this rank makes as
        many as the busiest one (each pass's gathers and reduce-scatters are collectives)."""
        if passes <= 0:
            return
        batch = collate_transitions([trained[0]], self.pad_token_id).to(self.device)
        for _ in range(passes):
            (self._logprobs(self.model, batch).logprobs.sum() * 0.0).backward()

    def _logprobs(
        self, model: torch.nn.Module, batch: TokenBatch, with_entropy: bool = False
    ) -> TokenLogprobs:
        """Token logprobs of `batch` (float32, under the placement's autocast), each shared prompt
        encoded once when that saves work."""
        with self.placement.forward_context():
            if self.share_prompts and self.value_head is None:
                shared = shared_prefix_logprobs(
                    model,
                    batch,
                    temperature=self.temperature,
                    top_p=self.top_p,
                    top_k=self.top_k,
                    with_entropy=with_entropy,
                )
                if shared is not None:
                    return shared
            return compute_token_logprobs(
                model,
                batch.input_ids,
                batch.attention_mask,
                batch.response_mask,
                temperature=self.temperature,
                top_p=self.top_p,
                top_k=self.top_k,
                with_entropy=with_entropy,
                with_hidden_states=self.value_head is not None,
            )

    def _micro_step(
        self,
        trained: Sequence[Transition],
        indices: list[int],
        scales: Sequence[float],
        targets: Sequence[float] | None,
        group: int,
        epoch: int,
        old: dict[int, torch.Tensor],
        old_values: dict[int, torch.Tensor],
    ) -> dict[str, float]:
        batch = collate_transitions([trained[i] for i in indices], self.pad_token_id).to(self.device)
        lp = self._logprobs(self.model, batch, with_entropy=True)
        # π_old is the policy before this update: the first epoch's own forward pass, so no extra one.
        if epoch == 0:
            old[group] = lp.logprobs.detach()
        ref = None
        if self.algorithm.kl_coef > 0:
            with torch.no_grad(), self._reference_model() as reference:
                ref = self._logprobs(reference, batch).logprobs
        scale = torch.tensor([scales[i] for i in indices], dtype=torch.float32, device=self.device)
        loss, metrics = policy_loss(
            lp.logprobs,
            batch.behaviour_logprobs,
            batch.advantages,
            batch.response_mask,
            self.algorithm,
            old_logprobs=old[group],
            ref_logprobs=ref,
            scales=scale,
            entropy=lp.entropy,
        )
        if self.value_head is not None and isinstance(self.algorithm, PPO):
            assert lp.hidden_states is not None and targets is not None
            values = self.value_head(lp.hidden_states.float(), batch.prompt_lengths - 1)
            if epoch == 0:
                old_values[group] = values.detach()
            v_loss, v_metrics = value_loss(
                values,
                torch.tensor([targets[i] for i in indices], dtype=torch.float32, device=self.device),
                self.algorithm,
                old_values=old_values[group],
                scales=torch.full((len(indices),), 1.0 / len(trained), device=self.device),
            )
            loss = loss + v_loss
            metrics.update(v_metrics)
        loss.backward()
        return metrics


def _merge_rank_metrics(
    per_rank: Sequence[tuple[dict[str, float], dict[str, float], float]],
) -> tuple[dict[str, float], dict[str, float], float]:
    """The ranks' metric sums and weights (and micro-batch counts) added up."""
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    count = 0.0
    for rank_sums, rank_weights, rank_count in per_rank:
        for key, value in rank_sums.items():
            sums[key] = max(sums.get(key, value), value) if key in _PEAKS else sums.get(key, 0.0) + value
        for key, value in rank_weights.items():
            weights[key] = weights.get(key, 0.0) + value
        count += rank_count
    return sums, weights, count
