"""`reinforge runner`: run an agent on rollouts from a store until stopped.

    REINFORGE_GATEWAY_SECRET="$SECRET" reinforge runner --store http://127.0.0.1:8765 \\
        --gateway http://127.0.0.1:8765/gateway --agent mypkg.agents:solve --concurrency 8

Pass the secrets in the environment (or let `reinforge store serve`'s join command read them from the
run folder), not as `--gateway-secret`/`--store-token`: a command line is visible to every user of
the machine (`ps`).

Ctrl-C / SIGTERM stops leasing and lets running attempts finish; a second one stops them at once (the
store retries them). With `--exit-with-parent PID` the runner also stops at once when its parent dies
(a trainer killed with SIGKILL leaves no runner processes behind).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import time
from typing import Annotated

import typer
from pydantic import ValidationError

from reinforge._event_loop import run_on_fast_loop
from reinforge._heap import freeze_startup_heap
from reinforge.cli_errors import exit_on_error
from reinforge.errors import InvalidRequestError, ReinforgeError
from reinforge.runner.agent import Agent, load_agent
from reinforge.runner.command import CommandAgent
from reinforge.runner.ray_runners import RayRunners, RayRunnerSettings
from reinforge.runner.runner import DEFAULT_MODEL, Runner, RunnerStats
from reinforge.store.http.client import HttpStoreClient
from reinforge.types import RolloutMode

PARENT_CHECK_S = 1.0
"""How often a runner started with --exit-with-parent checks that its parent is alive."""
RAY_STOP_GRACE_S = 30.0
"""How long Ray runner actors get to finish their running attempts after Ctrl-C / SIGTERM."""


def _gateway_url(gateway: str | None, store: str) -> str:
    if gateway:
        return gateway
    if store.startswith(("http://", "https://")):
        return store.rstrip("/") + "/gateway"  # the trainer mounts the gateway beside the store
    raise ReinforgeError("--gateway is required unless --store is an http(s) store serving /gateway")


async def _serve(
    runner: Runner, max_rollouts: int | None, parent_pid: int | None = None
) -> tuple[RunnerStats, bool]:
    """Run until done or signalled; also says whether a second signal forced the stop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    forced = False

    def on_signal() -> None:
        nonlocal forced
        if stop.is_set():
            forced = True
            runner.stop_now()  # the second signal: stop the running attempts too
        stop.set()

    async def watch_parent(pid: int) -> None:
        """A parent that died (this process was handed to another one) stops it as two signals do."""
        nonlocal forced
        while os.getppid() == pid:
            await asyncio.sleep(PARENT_CHECK_S)
        logging.getLogger(__name__).warning("parent process %d is gone; stopping", pid)
        forced = True
        stop.set()
        if isinstance(runner.store, HttpStoreClient):  # its store went with the parent: don't wait for it
            runner.store.stop_retrying()
        runner.stop_now(report_once=True)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    watcher = asyncio.create_task(watch_parent(parent_pid)) if parent_pid is not None else None
    try:
        return await runner.run(max_rollouts=max_rollouts, stop=stop), forced
    finally:
        if watcher is not None:
            watcher.cancel()
        await runner.store.close()


def _run_on_ray(
    settings: RayRunnerSettings,
    address: str,
    count: int,
    cpus_per_runner: float,
    id_prefix: str,
    parent_pid: int | None,
) -> None:
    """Start the actors, replace dead ones, and stop them on Ctrl-C / SIGTERM (a second one: at once)."""
    signals: list[int] = []
    previous = {
        sig: signal.signal(sig, lambda n, _: signals.append(n)) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    actors = RayRunners(settings, count, address=address, cpus_per_actor=cpus_per_runner, id_prefix=id_prefix)
    try:
        actors.start()
        typer.echo(f"runner actors started on Ray ({address}): {', '.join(actors.runner_ids)}")
        while not signals and not actors.finished():
            if parent_pid is not None and os.getppid() != parent_pid:
                signals.extend([signal.SIGTERM, signal.SIGTERM])
                break
            actors.check()
            time.sleep(PARENT_CHECK_S / 2)
        # A first signal lets the running attempts finish; a second (or a dead parent) stops them.
        t = actors.stop(RAY_STOP_GRACE_S, now=len(signals) > 1)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    typer.echo(
        f"runner done: leased {t.leased}, succeeded {t.succeeded}, failed {t.failed} "
        f"(timed out {t.timed_out}), stopped {t.stopped}; {count} Ray actors, {t.replaced} replaced"
    )
    if len(signals) > 1:
        raise typer.Exit(130)


def runner_command(
    store: Annotated[
        str,
        typer.Option("--store", envvar="REINFORGE_STORE", help="Store URL (http(s)://, sqlite:///, ...)."),
    ],
    agent: Annotated[
        str | None, typer.Option("--agent", help="In-process agent as package.module:function (or class).")
    ] = None,
    agent_cmd: Annotated[
        str | None,
        typer.Option("--agent-cmd", help="Any command, run once per attempt (see docs/agents.md)."),
    ] = None,
    gateway: Annotated[
        str | None,
        typer.Option(
            "--gateway", envvar="REINFORGE_GATEWAY_URL", help="Gateway URL; default <store>/gateway."
        ),
    ] = None,
    gateway_secret: Annotated[
        str | None,
        typer.Option("--gateway-secret", envvar="REINFORGE_GATEWAY_SECRET", help="Signs attempt tokens."),
    ] = None,
    store_token: Annotated[
        str | None, typer.Option("--store-token", envvar="REINFORGE_STORE_TOKEN", help="HTTP store's token.")
    ] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", "-n", min=1, help="Attempts run at once.")] = 1,
    max_rollouts: Annotated[
        int | None, typer.Option("--max-rollouts", min=1, help="Exit after this many rollouts.")
    ] = None,
    timeout_s: Annotated[
        float | None, typer.Option("--timeout", min=0.001, help="Seconds one attempt may take.")
    ] = None,
    lease_seconds: Annotated[float, typer.Option("--lease-seconds", min=0.1)] = 60.0,
    mode: Annotated[
        RolloutMode | None, typer.Option("--mode", help="Only train or only val rollouts.")
    ] = None,
    model: Annotated[
        str, typer.Option("--model", help="Model name when resources name none.")
    ] = DEFAULT_MODEL,
    runner_id: Annotated[str | None, typer.Option("--runner-id")] = None,
    pass_env: Annotated[
        list[str] | None,
        typer.Option("--pass-env", help="Extra variable a command agent inherits (repeatable)."),
    ] = None,
    log_level: Annotated[str, typer.Option("--log-level")] = "warning",
    instrument_frameworks: Annotated[
        bool,
        typer.Option(
            "--instrument-frameworks/--no-instrument-frameworks",
            help="Record LangChain/LangGraph, Agents SDK, AutoGen and Anthropic SDK tool and agent runs.",
        ),
    ] = True,
    exit_with_parent: Annotated[
        int | None,
        typer.Option(
            "--exit-with-parent",
            metavar="PID",
            help="Stop (as on a second Ctrl-C) once process PID, this one's parent, has died.",
        ),
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray",
            metavar="ADDRESS",
            help="Run the runners as actors on this Ray cluster (auto, HOST:PORT, ray://HOST:PORT, local).",
        ),
    ] = None,
    num_runners: Annotated[
        int, typer.Option("--num-runners", min=1, help="With --ray: runner actors, each -n at once.")
    ] = 1,
    ray_cpus: Annotated[
        float, typer.Option("--ray-cpus-per-runner", min=0, help="With --ray: CPUs Ray reserves per actor.")
    ] = 1.0,
) -> None:
    """Lease rollouts from the store and run the agent on them, N at a time."""
    from reinforge.store.factory import open_store

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with exit_on_error():
        if (agent is None) == (agent_cmd is None):
            raise ReinforgeError("give exactly one of --agent module:function or --agent-cmd '...'")
        if not gateway_secret:
            raise ReinforgeError("--gateway-secret (or REINFORGE_GATEWAY_SECRET) is required")
        gateway_url = _gateway_url(gateway, store)
        if ray_address is not None:
            if not store.startswith(("http://", "https://")):
                raise ReinforgeError("--ray needs an http(s) --store: the actors reach it over the network")
            try:
                ray_settings = RayRunnerSettings.model_validate(
                    {
                        "store_url": store,
                        "store_token": store_token,
                        "gateway_url": gateway_url,
                        "gateway_secret": gateway_secret,
                        "agent": agent,
                        "agent_cmd": agent_cmd,
                        "pass_env": pass_env or [],
                        "concurrency": concurrency,
                        "model": model,
                        "timeout_s": timeout_s,
                        "lease_seconds": lease_seconds,
                        "mode": mode,
                        "max_rollouts": max_rollouts,
                        # The actors import the agent as this process would (on this machine's paths).
                        "python_path": [os.getcwd(), *(p for p in sys.path if p)],
                        "instrument_frameworks": instrument_frameworks,
                    }
                )
            except ValidationError as e:
                raise InvalidRequestError(f"bad runner options for --ray: {e}") from e
            prefix = runner_id or f"ray-{socket.gethostname()}-{os.getpid()}"
            _run_on_ray(ray_settings, ray_address, num_runners, ray_cpus, prefix, exit_with_parent)
            return
        the_agent: Agent | CommandAgent
        if agent_cmd is not None:
            the_agent = CommandAgent(agent_cmd, timeout_s, pass_env=pass_env or ())
        else:
            assert agent is not None
            sys.path.insert(0, os.getcwd())  # `--agent mymodule:fn` from the current folder, as uvicorn does
            the_agent = load_agent(agent)

        # The agent and its libraries live as long as this process: out of the full collections
        # that each leased attempt's allocations would otherwise trigger every few seconds.
        freeze_startup_heap()

        async def main() -> tuple[RunnerStats, bool]:
            opened = await open_store(store, store_token)
            runner = Runner(
                opened,
                the_agent,
                gateway_url,
                gateway_secret,
                concurrency=concurrency,
                runner_id=runner_id,
                mode=mode,
                lease_seconds=lease_seconds,
                timeout_s=timeout_s,
                model=model,
                instrument_frameworks=instrument_frameworks,
            )
            return await _serve(runner, max_rollouts, exit_with_parent)

        # Python agents run on uvloop (cheaper sockets and callbacks for their HTTP calls); command
        # agents on asyncio's loop, whose process spawning costs a fifth of uvloop's.
        stats, forced = asyncio.run(main()) if agent_cmd is not None else run_on_fast_loop(main)
    typer.echo(
        f"runner done: leased {stats.leased}, succeeded {stats.succeeded}, failed {stats.failed} "
        f"(timed out {stats.timed_out}), stopped {stats.stopped}"
    )
    if forced:
        # Sync agents' threads can't be interrupted and the interpreter would wait for them at exit;
        # their attempts are already reported, so leave now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
