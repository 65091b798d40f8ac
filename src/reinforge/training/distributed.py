"""Data-parallel policy updates over torch.distributed, with one leader.

Rank 0, the leader, runs everything a training run has besides the update's arithmetic: the store,
gateway, engine, runners, logging, checkpoints and weight publishing. The other ranks hold a copy of
the policy and its optimiser and take part in the update only. Each step the leader sends the step's
transitions (Python objects, over a gloo group, even when gradients go over NCCL); every rank
computes the loss scales over the WHOLE batch (`loss_scales`), so each rank's share of the gradient
is already normalised by the global token and sequence counts and the shares add up to the
single-process gradient. One bucketed all-reduce (a sum) per optimiser step follows the local
gradient accumulation, and every rank steps its own optimiser on identical gradients: the weights
stay identical everywhere without ever being sent after the start.

Why not DDP: it all-reduces inside every backward pass, wants every parameter used in every forward
(per-role adapters and the skipped zero-advantage rows break that), and wraps the module (peft's
methods, the engine's weight names). One all-reduce after accumulation is what DDP's `no_sync` does,
without any of that.

With `sharding = "fsdp2"` the policy is sharded instead (`reinforge.training.fsdp`): the sum is
FSDP's reduce-scatter, and the full weights exist only when gathered, a collective, so the leader
orders the followers to join each gathering (for the engine, for a checkpoint) as it orders updates.

Processes come from a launcher: `torchrun` (or `reinforge train --nproc N`, which runs torchrun's
module on this machine), which sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, Protocol

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict

from reinforge.errors import InvalidRequestError
from reinforge.training.config import DistributedSettings
from reinforge.training.device import Placement
from reinforge.types import Transition

LAUNCHED_NPROC_ENV = "REINFORGE_LAUNCHED_NPROC"
"""Set by `launch_local` in the processes it starts: the process count asked for. (It cannot travel
as `--nproc`: torch's launcher would take that for an abbreviation of its own `--nproc-per-node`.)"""

_BUCKET_BYTES = 64 * 2**20
"""Gradients are summed in buckets of about this size: few collective calls, a bounded extra copy."""


GatherPurpose = Literal["engine", "checkpoint"]
"""Why a sharded policy's full state is gathered: weights for the engine, or weights and the
optimiser state for a checkpoint."""


class LeaderOrder(BaseModel):
    """What the leader tells the other ranks: start (resuming from `checkpoint` when it names one),
    update on `transitions` at `learning_rate`, join the gathering of the sharded (FSDP2) policy's
    full state for `gather`, or stop."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["start", "update", "gather", "stop"]
    checkpoint: str | None = None
    gather: GatherPurpose | None = None
    transitions: list[Transition] = []
    returns: list[float] | None = None
    learning_rate: float = 0.0


class FollowerPolicy(Protocol):
    """What a non-leader rank drives: the `Policy`, seen from here."""

    def set_learning_rate(self, learning_rate: float) -> None: ...

    def update(
        self, transitions: Sequence[Transition], returns: Sequence[float] | None = None
    ) -> dict[str, float]: ...

    def join_gather(self, purpose: GatherPurpose) -> None: ...


@dataclass
class LaunchedWorld:
    """This process's place among the training processes, as the launcher's environment says."""

    rank: int
    world_size: int
    local_rank: int


def launched_world() -> LaunchedWorld | None:
    """The launcher's RANK / WORLD_SIZE / LOCAL_RANK, or None when this is a lone process."""
    size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if size <= 1:
        return None
    rank = int(os.environ.get("RANK", "0"))
    return LaunchedWorld(rank=rank, world_size=size, local_rank=int(os.environ.get("LOCAL_RANK", rank)))


def is_follower() -> bool:
    """True in a launched process other than rank 0 (it prints and writes nothing of the run's)."""
    world = launched_world()
    return world is not None and world.rank != 0


def shard_by_tokens(lengths: Sequence[int], world_size: int) -> list[list[int]]:
    """Indices of `lengths` split into `world_size` shares of about equal total length: the longest
    row goes to the least-loaded share first (ties: the lower rank), each share in input order.
    Deterministic, so every rank computes the same split from the same batch."""
    if world_size < 1:
        raise InvalidRequestError(f"world_size must be positive, got {world_size}")
    shares: list[list[int]] = [[] for _ in range(world_size)]
    loads = [0] * world_size
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        shares[rank].append(i)
        loads[rank] += lengths[i]
    return [sorted(share) for share in shares]


class DataParallel:
    """This process's membership of the training process group (see the module docstring)."""

    def __init__(
        self,
        world: LaunchedWorld,
        backend: str,
        timeout: timedelta,
        *,
        owns_group: bool,
        sharding: Literal["replicate", "fsdp2"] = "replicate",
    ) -> None:
        self.rank = world.rank
        self.world_size = world.world_size
        self.local_rank = world.local_rank
        self.backend = backend
        self.sharding = sharding
        """"replicate": whole copies and one gradient all-reduce; "fsdp2": `reinforge.training.fsdp`."""
        self._owns_group = owns_group
        self.broken = False
        """An update failed on this rank midway: the others may be waiting in a collective this
        rank will never join, so it must not send or wait on anything more (its exit ends the run:
        the launcher stops the other processes)."""
        # Orders are pickled Python objects: a gloo group carries them on the CPU whatever the
        # gradients' backend, and needs no GPU synchronisation while the leader collects rollouts.
        self._orders = dist.new_group(backend="gloo", timeout=timeout)

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    # ---- orders (leader -> followers) ------------------------------------------------------------

    def send(self, order: LeaderOrder) -> None:
        """Leader only: every other rank's `receive` returns `order`."""
        if not self.is_leader:
            raise RuntimeError("only rank 0 sends orders")
        if self.broken:
            raise RuntimeError("an update failed midway: the other ranks cannot take new orders")
        dist.broadcast_object_list([order], src=0, group=self._orders)

    def receive(self) -> LeaderOrder:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0, group=self._orders)
        order = box[0]
        if not isinstance(order, LeaderOrder):
            raise RuntimeError(f"rank {self.rank} received {type(order).__name__} instead of an order")
        return order

    # ---- the update's collectives ----------------------------------------------------------------

    @contextmanager
    def collective(self) -> Iterator[None]:
        """Around one update's collectives: an exception inside marks the group `broken`."""
        try:
            yield
        except BaseException:
            self.broken = True
            raise

    def my_share(self, lengths: Sequence[int]) -> list[int]:
        """Indices of the rows (of these lengths) this rank computes."""
        return shard_by_tokens(lengths, self.world_size)[self.rank]

    def broadcast_parameters(self, tensors: Sequence[torch.Tensor]) -> None:
        """Make every rank's `tensors` the leader's (at the start: LoRA's random initialisation,
        anything a rank loaded differently)."""
        with torch.no_grad():
            for tensor in tensors:
                dist.broadcast(tensor.data, src=0)

    def all_reduce_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Sum `params`' gradients over the ranks. A parameter no rank computed a gradient for keeps
        none (AdamW then skips it, as in one process); one that only some ranks reached gets zeros
        from the others."""
        if not params:
            return
        device = params[0].device
        reached = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=device)
        dist.all_reduce(reached, op=dist.ReduceOp.MAX)
        used = [p for p, flag in zip(params, reached.tolist(), strict=True) if flag]
        for p in used:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in used if p.grad is not None]
        for bucket in _buckets(grads):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            dist.all_reduce(flat)
            offset = 0
            for g in bucket:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()

    def gather_objects(self, value: Any) -> list[Any]:
        """Every rank's `value`, in rank order (small things: the update's metric sums)."""
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value, group=self._orders)
        return out

    def close(self) -> None:
        """Leave the group (and tear it down when this object created it and it is not `broken`)."""
        if self._owns_group and not self.broken and dist.is_initialized():
            dist.destroy_process_group()


def _buckets(grads: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Consecutive gradients of one dtype, about `_BUCKET_BYTES` a bucket."""
    buckets: list[list[torch.Tensor]] = []
    size = 0
    for g in grads:
        nbytes = g.numel() * g.element_size()
        if not buckets or buckets[-1][0].dtype != g.dtype or size + nbytes > _BUCKET_BYTES:
            buckets.append([])
            size = 0
        buckets[-1].append(g)
        size += nbytes
    return buckets


def join_data_parallel(settings: DistributedSettings, placement: Placement) -> DataParallel | None:
    """Join the launched training processes (None: this is the only one).

    Raises when `settings.nproc` asks for processes nobody launched, or disagrees with the launcher.
    """
    world = launched_world()
    if world is None:
        if settings.nproc > 1:
            raise InvalidRequestError(
                f"distributed.nproc = {settings.nproc} needs its processes launched: run "
                f"`reinforge train --nproc {settings.nproc} ...`, or `torchrun --nproc-per-node "
                f"{settings.nproc} your_script.py` around Trainer.fit"
            )
        return None
    if settings.nproc not in (1, world.world_size):
        raise InvalidRequestError(
            f"distributed.nproc = {settings.nproc}, but the launcher started {world.world_size} processes"
        )
    backend = settings.backend
    if backend == "auto":
        backend = "nccl" if placement.device.type == "cuda" else "gloo"
    if backend == "nccl" and placement.device.type != "cuda":
        raise InvalidRequestError("distributed.backend = 'nccl' needs compute.device on CUDA")
    timeout = timedelta(minutes=settings.timeout_minutes)
    owns = not dist.is_initialized()
    if owns:
        if placement.device.type == "cuda":
            torch.cuda.set_device(placement.device)
        dist.init_process_group(
            backend=backend, timeout=timeout, rank=world.rank, world_size=world.world_size
        )
    return DataParallel(world, backend, timeout, owns_group=owns, sharding=settings.sharding)


def follow_leader(policy: FollowerPolicy, data_parallel: DataParallel) -> int:
    """A follower's whole part in a fit: run each update (and, with FSDP2, each gathering of the
    full state) the leader orders until it says stop. Returns the number of updates done."""
    updates = 0
    while True:
        order = data_parallel.receive()
        if order.kind == "stop":
            return updates
        if order.kind == "gather" and order.gather is not None:
            with data_parallel.collective():
                policy.join_gather(order.gather)
            continue
        if order.kind != "update":
            raise RuntimeError(f"rank {data_parallel.rank} got a {order.kind!r} order in the middle of a run")
        policy.set_learning_rate(order.learning_rate)
        policy.update(order.transitions, order.returns)
        updates += 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch_local(nproc: int, module_args: Sequence[str]) -> int:
    """Run `python -m reinforge <module_args>` in `nproc` processes on this machine, the way
    `torchrun --nproc-per-node <nproc>` does (torch's own launcher module; rendezvous on a free port
    of 127.0.0.1). Returns the launcher's exit code: non-zero when any process failed, in which case
    it has stopped the others."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc-per-node={nproc}",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        "-m",
        "reinforge",
        *module_args,
    ]
    env = {**os.environ, LAUNCHED_NPROC_ENV: str(nproc)}
    return subprocess.run(command, check=False, env=env).returncode
