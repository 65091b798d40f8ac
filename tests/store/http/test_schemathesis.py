"""Property-based fuzzing of the live server from its own OpenAPI document: no 5xx, ever.

Schemathesis generates valid and invalid bodies, paths and parameters for every operation (a
bounded number per operation) and sends them over real HTTP to a server on SQLite.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from reinforge.net.background import BackgroundServer
from reinforge.store.http.server import create_store_app
from reinforge.store.protocol import Store

from .conftest import TOKEN

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    from reinforge.store.factory import open_store

    db = Path(tmp_path_factory.mktemp("fuzz")) / "store.db"

    async def factory() -> Store:
        return await open_store(f"sqlite:///{db}")

    with BackgroundServer(create_store_app(factory, TOKEN, max_body_bytes=1024 * 1024)) as srv:
        yield srv


def _operations(url: str) -> list[schemathesis.APIOperation]:
    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    return [result.ok() for result in schema.get_all_operations()]


def _has_inputs(operation: schemathesis.APIOperation) -> bool:
    return bool(operation.body) or any(True for _ in operation.iter_parameters())


def _shorten_waits(case: schemathesis.Case) -> None:
    """Valid long-poll waits (up to a minute each) would make the run slow without testing more."""
    if isinstance(case.body, dict):
        for key in ("wait_seconds", "timeout_seconds"):
            value = case.body.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 60:
                case.body[key] = min(value, 0.05)


# Schemathesis' own pytest plugin does not run under pytest 9, so the Hypothesis loop is spelled out.
@pytest.mark.parametrize("mode", [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE])
def test_no_server_errors(live_server: BackgroundServer, mode: schemathesis.GenerationMode) -> None:
    operations = _operations(live_server.url)
    assert len(operations) >= 17
    session = requests.Session()
    for operation in operations:
        if mode is schemathesis.GenerationMode.NEGATIVE and not _has_inputs(operation):
            continue  # nothing to make invalid

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case: schemathesis.Case) -> None:
            _shorten_waits(case)
            case.call_and_validate(
                base_url=live_server.url,
                session=session,
                headers={"Authorization": f"Bearer {TOKEN}"},
                checks=CHECKS,
                timeout=30,
            )

        check()
