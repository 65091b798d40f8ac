"""The runner: lease rollouts from the store, run the agent on each, report the outcome.

One `Runner` runs up to `concurrency` attempts at once on one event loop (sync agents in a thread
pool). For each attempt it heartbeats the lease, stops the agent when the store cancels or supersedes
the attempt, enforces the timeout, and finishes it through the gateway: one request carries the
attempt's own spans (tool spans, reported final rewards; see `AttemptSpanBuffer`), and the gateway
finishes the attempt only once every span of it is in the store. The store does the retrying: a
failed retryable attempt, or a lease that expired because a runner died, is leased again.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import socket
import traceback
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast

from reinforge.access import attempt_token
from reinforge.errors import (
    InvalidRequestError,
    NotFoundError,
    ReinforgeError,
    StaleAttemptError,
    StoreUnavailableError,
)
from reinforge.retry import Backoff
from reinforge.runner.agent import Agent, AgentFunction, RolloutResult, as_agent
from reinforge.runner.command import AgentProcessError, CommandAgent
from reinforge.runner.frameworks import instrument_frameworks as hook_frameworks
from reinforge.runner.gateway_client import GatewayClient
from reinforge.runner.llm import LLM
from reinforge.runner.resources import ResourcesCache, model_from_resources
from reinforge.runner.span_budget import DEFAULT_MAX_SPANS_PER_ATTEMPT, SpanBudget
from reinforge.semconv import AIR_TIMEOUT, ATTR_AIR_SIGNAL, ATTR_STEP_KIND
from reinforge.store.http.client import HttpStoreClient
from reinforge.store.protocol import Store
from reinforge.tracing import (
    AttemptContext,
    AttemptSpanBuffer,
    SpanWriter,
    attempt_scope,
    get_tracer,
    install_global_tracer_provider,
    instrument_threads,
    reward_value,
)
from reinforge.types import AttemptOutcome, AttemptStatus, LeasedRollout, RolloutMode, Span, new_id

log = logging.getLogger(__name__)

DEFAULT_MODEL = "reinforge-policy"
FINISH_RETRY_S = 120.0
"""How long a runner keeps retrying an unavailable gateway/store to finish one attempt; after that
the lease expires and the store retries the rollout."""
_LEASE_ANSWER_GRACE_S = 5.0
"""How much longer than its long poll a stopping runner waits for an HTTP lease's answer."""
SPAN_TIMEOUT = "reinforge.timeout"
"""Written when an attempt times out; it carries the `timeout` AIR signal."""


@dataclass
class RunnerStats:
    """What a runner has done, added up over its `run` calls."""

    leased: int = 0
    succeeded: int = 0
    failed: int = 0
    timed_out: int = 0
    stopped: int = 0
    """Attempts abandoned because the store cancelled or superseded them."""
    errors: list[str] = field(default_factory=list)


class FlushError(ReinforgeError):
    """The spans of an attempt could not be confirmed in the store; the attempt is failed (retryably)
    rather than finished with missing data."""

    http_status = 503


class _Superseded(Exception):
    """The store no longer considers this attempt running (cancelled, or its lease expired)."""


@dataclass
class _AttemptState:
    superseded: bool = False


class Runner:
    """Runs `agent` on rollouts leased from `store`; its LLM calls go to the gateway at `gateway_url`.

    `gateway_secret` signs each attempt's token (see `reinforge.access.attempt_token`); the agent
    only ever sees its own attempt's token. `timeout_s` bounds one attempt when the agent sets none.
    `on_lease` sees each leased batch before its agents start (a co-located gateway primes its cache).
    `instrument_frameworks` records in-process agents' framework telemetry (LangChain/LangGraph, the
    Agents SDK, AutoGen, the Anthropic SDK) as tool and agent steps; see `reinforge.runner.frameworks`.
    """

    def __init__(
        self,
        store: Store,
        agent: Agent | CommandAgent | AgentFunction,
        gateway_url: str,
        gateway_secret: str,
        *,
        concurrency: int = 1,
        runner_id: str | None = None,
        mode: RolloutMode | None = None,
        lease_seconds: float = 60.0,
        heartbeat_seconds: float | None = None,
        poll_seconds: float = 2.0,
        timeout_s: float | None = None,
        retry_on_timeout: bool = False,
        model: str = DEFAULT_MODEL,
        drain_timeout_s: float | None = None,
        lease_batch_wait_s: float = 0.005,
        on_lease: Callable[[list[LeasedRollout]], None] | None = None,
        instrument_frameworks: bool = True,
        max_spans_per_attempt: int = DEFAULT_MAX_SPANS_PER_ATTEMPT,
    ) -> None:
        if max_spans_per_attempt < 1:
            raise InvalidRequestError(
                f"max_spans_per_attempt must be at least 1, got {max_spans_per_attempt}"
            )
        if concurrency < 1:
            raise InvalidRequestError(f"concurrency must be at least 1, got {concurrency}")
        if lease_seconds <= 0 or poll_seconds < 0:
            raise InvalidRequestError("lease_seconds must be positive and poll_seconds non-negative")
        if not gateway_secret:
            raise InvalidRequestError("the runner needs the gateway secret to sign attempt tokens")
        self.store = store
        self.agent: Agent | CommandAgent = agent if isinstance(agent, CommandAgent) else as_agent(agent)
        self.gateway_url = gateway_url.rstrip("/")
        self._secret = gateway_secret
        self.concurrency = concurrency
        self.runner_id = runner_id or f"{socket.gethostname()}-{os.getpid()}-{new_id()[:8]}"
        self.mode = mode
        self.lease_seconds = lease_seconds
        self.heartbeat_seconds = heartbeat_seconds or min(lease_seconds / 3, 5.0)
        self.poll_seconds = poll_seconds
        self.timeout_s = timeout_s
        self.retry_on_timeout = retry_on_timeout
        self.model = model
        self.drain_timeout_s = drain_timeout_s
        self.lease_batch_wait_s = lease_batch_wait_s
        self.on_lease = on_lease
        # A command agent runs in its own process: hooks in this one would see nothing of it.
        self.instrument_frameworks = instrument_frameworks and not isinstance(self.agent, CommandAgent)
        self.max_spans_per_attempt = max_spans_per_attempt
        self.stats = RunnerStats()
        self._resources = ResourcesCache(store)
        self._writer: SpanWriter | None = None
        self._gateway: GatewayClient | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._active: set[asyncio.Task[None]] = set()
        self._report_tries = 6

    async def run(self, max_rollouts: int | None = None, stop: asyncio.Event | None = None) -> RunnerStats:
        """Lease and run rollouts until `max_rollouts` have been run or `stop` is set, then wait for the
        attempts in flight (up to `drain_timeout_s`) and return."""
        instrument_threads()
        install_global_tracer_provider()  # frameworks are hooked as each attempt starts (`_run_attempt`)
        stop = stop or asyncio.Event()
        self._writer = await SpanWriter(self.store).start()
        self._gateway = GatewayClient(self.gateway_url, self._secret)
        self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="reinforge-agent")
        active = self._active = set()
        stop_wait = asyncio.create_task(stop.wait())
        try:
            await self._lease_loop(active, stop, stop_wait, max_rollouts)
        finally:
            stop_wait.cancel()
            await self._drain(active)
            await self._writer.close()
            await self._gateway.aclose()
            self._pool.shutdown(wait=False, cancel_futures=True)
        return self.stats

    def stop_now(self, *, report_once: bool = False) -> None:
        """Stop the running attempts too (call after setting the stop event): each is reported failed
        and retryable, so the store gives its rollout to another runner. With `report_once` a report
        that fails is not retried (when the store most likely died with the trainer that served it):
        the leases then expire and the store retries those rollouts all the same."""
        if report_once:
            self._report_tries = 1
        for task in list(self._active):
            task.cancel()

    async def _lease_loop(
        self,
        active: set[asyncio.Task[None]],
        stop: asyncio.Event,
        stop_wait: asyncio.Task[Any],
        max_rollouts: int | None,
    ) -> None:
        lease_retry = Backoff(0.1, max_s=5.0).start()
        loop = asyncio.get_running_loop()
        # Lease for several free slots at once when attempts end in quick succession (one store call
        # instead of several), but never leave a slot idle longer than `lease_batch_wait_s`.
        batch = max(1, self.concurrency // 8)
        batch_deadline: float | None = None
        leased_here = 0  # `max_rollouts` counts this run; `stats` adds up over runs
        while not stop.is_set() and (max_rollouts is None or leased_here < max_rollouts):
            free = self.concurrency - len(active)
            if free == 0:
                await asyncio.wait({*active, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
                continue
            if free < batch and active:
                now = loop.time()
                batch_deadline = batch_deadline or now + self.lease_batch_wait_s
                if now < batch_deadline:
                    waiting = {*active, stop_wait}
                    wait_s = batch_deadline - now
                    await asyncio.wait(waiting, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
                    continue
            batch_deadline = None
            want = free if max_rollouts is None else min(free, max_rollouts - leased_here)
            lease = asyncio.create_task(
                self.store.lease_rollouts(
                    self.runner_id, want, self.lease_seconds, wait_seconds=self.poll_seconds, mode=self.mode
                )
            )
            await asyncio.wait({lease, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
            if not lease.done() and isinstance(self.store, HttpStoreClient):
                # Stopping while a lease is in flight over HTTP: the server may grant it after we stop
                # listening, and those rollouts would wait out their whole lease before a retry. Let
                # the long poll end (it is short) and run what it brings, as a graceful stop does.
                await asyncio.wait({lease}, timeout=self.poll_seconds + _LEASE_ANSWER_GRACE_S)
            if not lease.done():
                # In-process stores give up the wait without leasing.
                lease.cancel()
                break
            try:
                leased = lease.result()
            except StoreUnavailableError as e:
                delay = lease_retry.failed() or 0.0  # the lease back-off has no budget: never None
                log.warning("leasing failed (%s); retrying in %.1fs", e, delay)
                await asyncio.sleep(delay)
                continue
            lease_retry.succeeded()
            if leased and self.on_lease is not None:
                self.on_lease(leased)
            if leased:
                await self._resources.prefetch([lr.rollout for lr in leased])
            for lr in leased:
                self.stats.leased += 1
                leased_here += 1
                task = asyncio.create_task(self._run_attempt(lr), name=f"attempt-{lr.attempt.attempt_id}")
                active.add(task)
                task.add_done_callback(active.discard)

    async def _drain(self, active: set[asyncio.Task[None]]) -> None:
        if not active:
            return
        _, pending = await asyncio.wait(set(active), timeout=self.drain_timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)

    async def _run_attempt(self, leased: LeasedRollout) -> None:
        rollout, attempt = leased.rollout, leased.attempt
        attempt_id = attempt.attempt_id
        try:
            resources = await self._resources.get(rollout.resources_version)
        except ReinforgeError as e:
            error = f"could not fetch resources version {rollout.resources_version}: {e}"
            await self._finish(attempt_id, AttemptOutcome(status=AttemptStatus.failed, error=error))
            return
        llm = LLM.for_attempt(
            self.gateway_url,
            attempt_id,
            attempt_token(self._secret, attempt_id),
            model_from_resources(resources.resources, self.model),
            resources.resources,
            resources.version,
        )
        if self.agent.name is not None:
            llm = llm.for_agent(self.agent.name)
        assert self._writer is not None
        if self.instrument_frameworks:
            hook_frameworks()  # the frameworks the agent has imported by now (cheap once all are hooked)
        spans = AttemptSpanBuffer(self._writer)
        budget = SpanBudget(spans, self.max_spans_per_attempt)
        ctx = AttemptContext(
            rollout_id=rollout.rollout_id,
            attempt_id=attempt_id,
            sink=budget,
            agent_name=self.agent.name,
            resources=resources.resources,
            resources_version=resources.version,
            framework_telemetry=self.instrument_frameworks,
        )
        with attempt_scope(ctx):  # the agent's task copies the context, so its spans are the attempt's
            work = asyncio.create_task(self._invoke(rollout.task, llm, rollout.rollout_id, attempt_id))
        state = _AttemptState()
        # The lease is kept alive until the finish is reported (flushing can take a while too).
        heartbeat = asyncio.create_task(self._heartbeat(attempt_id, work, state))
        try:
            await self._complete(work, ctx, state, spans, budget)
        finally:
            heartbeat.cancel()

    async def _complete(
        self,
        work: asyncio.Task[float | None],
        ctx: AttemptContext,
        state: _AttemptState,
        spans: AttemptSpanBuffer,
        budget: SpanBudget,
    ) -> None:
        attempt_id = ctx.attempt_id
        try:
            outcome = await self._outcome(work, ctx, state)
            overrun = budget.overrun_error()
            if overrun is not None and outcome.status is AttemptStatus.succeeded:
                # The episode was cut short of its record: it must not be trained on as it stands.
                outcome = AttemptOutcome(status=AttemptStatus.failed, error=overrun, retryable=False)
        except _Superseded:
            self.stats.stopped += 1
            log.info("attempt %s was cancelled or superseded; its agent was stopped", attempt_id)
            await self._flush(attempt_id, spans.take(), strict=False)
            return
        except asyncio.CancelledError:
            # The runner is shutting down past its drain timeout: give the rollout back for a retry.
            work.cancel()
            await asyncio.wait({work})  # a command agent's process group is killed by then
            await asyncio.shield(
                self._finish(
                    attempt_id,
                    AttemptOutcome(status=AttemptStatus.failed, error="the runner stopped", retryable=True),
                    spans.take(),
                )
            )
            raise
        held = spans.take()
        if spans.passed:
            # Some spans went through the shared writer (a long or busy attempt): they must be in the
            # store before the finish; the held rest travels with it.
            assert self._writer is not None
            try:
                await self._writer.flush()
            except Exception as e:  # whatever went wrong, the attempt must not finish with data missing
                outcome = AttemptOutcome(
                    status=AttemptStatus.failed,
                    error=f"could not flush the attempt's spans: {e}",
                    retryable=True,
                )
        await self._finish(attempt_id, outcome, held)

    async def _invoke(self, task: dict[str, Any], llm: LLM, rollout_id: str, attempt_id: str) -> float | None:
        """Run the agent once; returns the reward it produced directly (None when it emitted it)."""
        agent = self.agent
        if isinstance(agent, CommandAgent):
            result = await agent.run(task, llm, rollout_id=rollout_id, attempt_id=attempt_id)
            if result.exit_code != 0:
                raise AgentProcessError(
                    f"agent command exited with status {result.exit_code}; stderr tail:\n{result.stderr_tail}"
                )
            return result.reward
        value: RolloutResult
        if agent.is_async:
            value = await cast(Awaitable[RolloutResult], agent.rollout(task, llm))
        else:
            loop = asyncio.get_running_loop()
            value = cast(
                RolloutResult,
                await loop.run_in_executor(
                    self._pool, contextvars.copy_context().run, agent.rollout, task, llm
                ),
            )
        if value is None:
            return None
        try:
            return reward_value(value)
        except InvalidRequestError as e:
            raise InvalidRequestError(f"the agent returned {value!r}; return a number or None ({e})") from e

    async def _outcome(
        self,
        work: asyncio.Task[float | None],
        ctx: AttemptContext,
        state: _AttemptState,
    ) -> AttemptOutcome:
        timeout = self.agent.timeout_s if self.agent.timeout_s is not None else self.timeout_s
        done, _ = await asyncio.wait({work}, timeout=timeout)
        if not done:
            work.cancel()
            await asyncio.wait({work})
            if not state.superseded:
                self.stats.timed_out += 1
                with attempt_scope(ctx):
                    get_tracer().start_span(
                        SPAN_TIMEOUT, attributes={ATTR_STEP_KIND: "custom", ATTR_AIR_SIGNAL: AIR_TIMEOUT}
                    ).end()
                return AttemptOutcome(
                    status=AttemptStatus.failed,
                    error=f"timed out: the agent did not finish within {timeout}s",
                    retryable=self.retry_on_timeout,
                )
        if state.superseded:
            raise _Superseded
        if work.cancelled():
            raise asyncio.CancelledError
        exc = work.exception()
        if exc is not None:
            # A wrong return type will not fix itself on a retry; anything else might.
            retryable = not isinstance(exc, InvalidRequestError)
            return AttemptOutcome(status=AttemptStatus.failed, error=_error_text(exc), retryable=retryable)
        # The returned reward (None: none returned); the gateway's finish applies the one precedence
        # rule over it and the final rewards the agent reported (`reinforge.gateway.finishing`).
        return AttemptOutcome(status=AttemptStatus.succeeded, reward=work.result())

    async def _heartbeat(self, attempt_id: str, work: asyncio.Task[Any], state: _AttemptState) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_seconds)
            try:
                await self.store.heartbeat(attempt_id, self.lease_seconds)
            except (StaleAttemptError, NotFoundError):
                state.superseded = True
                work.cancel()
                return
            except StoreUnavailableError as e:
                log.warning("heartbeat for %s failed (%s); the lease holds until it expires", attempt_id, e)

    async def _flush(self, attempt_id: str, held: list[Span], *, strict: bool) -> None:
        """Every span of an attempt that will not be finished in the store: ours through the writer,
        the gateway's through its `/flush`."""
        assert self._writer is not None and self._gateway is not None
        for span in held:
            self._writer.submit(span)
        try:
            # Both at once: they write to the store independently.
            await asyncio.gather(self._writer.flush(), self._gateway.flush(attempt_id))
        except Exception as e:
            if strict:
                raise
            log.warning("flushing spans of %s failed: %s", attempt_id, e)

    async def _finish(
        self, attempt_id: str, outcome: AttemptOutcome, spans: list[Span] | None = None
    ) -> None:
        """Finish through the gateway: one request stores `spans` and the gateway's spans of the
        attempt, then finishes it (a succeeded outcome without a returned reward takes the last final
        reward the agent reported).

        When the gateway refuses the request outright (a wrong secret, a bad span), the attempt is
        failed in the store directly, retryably: it must not end as if its data were complete.
        """
        assert self._gateway is not None
        gateway = self._gateway

        async def through_gateway() -> None:
            await gateway.finish(attempt_id, outcome, spans or ())

        try:
            await self._report(attempt_id, outcome, through_gateway)
        except ReinforgeError as e:
            log.error("the gateway refused to finish attempt %s: %s", attempt_id, e)
            failed = AttemptOutcome(
                status=AttemptStatus.failed,
                error=f"could not flush the attempt's spans through the gateway: {e}",
                retryable=True,
            )

            async def in_store() -> None:
                await self.store.finish_attempt(attempt_id, failed)

            await self._report(attempt_id, failed, in_store)

    async def _report(
        self, attempt_id: str, outcome: AttemptOutcome, send: Callable[[], Awaitable[None]]
    ) -> None:
        """Send a finish, retrying while the store or gateway is unavailable; count the result."""
        # A hung gateway times out each try: `within_s` bounds the total.
        retry = Backoff(0.1, tries=self._report_tries, within_s=FINISH_RETRY_S).start()
        while True:
            try:
                await send()
            except (StaleAttemptError, NotFoundError) as e:
                self.stats.stopped += 1
                log.info("attempt %s finished too late: %s", attempt_id, e)
                return
            except StoreUnavailableError as e:
                delay = retry.failed()
                if delay is None:
                    break
                log.warning("finishing %s failed (%s); retrying", attempt_id, e)
                await asyncio.sleep(delay)
                continue
            if outcome.status == AttemptStatus.succeeded:
                self.stats.succeeded += 1
            else:
                self.stats.failed += 1
                if outcome.error:
                    self.stats.errors.append(outcome.error[-2000:])
            return
        log.error(
            "could not finish attempt %s; its lease will expire and the store will retry it", attempt_id
        )


def _error_text(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(exc))
    return text[-65536:]
