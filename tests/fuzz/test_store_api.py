"""The store server against its own OpenAPI document: schemathesis, then the token on every route.

Bars (issue 21): no server error, no schema mismatch either way (every request the document calls
valid is accepted, every one it calls invalid is refused), 401 on every route without the token.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.fuzz.schemathesis_run import run_schemathesis
from tests.fuzz.servers import TOKEN, store_server

from reinforge.net.background import BackgroundServer

MAX_EXAMPLES = 10
"""Per operation and phase; sized so the whole run stays within the folder's CI budget."""
STORE_OPERATIONS = 16
DASHBOARD_DATA = "^/dashboard/api/"
"""The dashboard's data routes are fuzzed once their document lists every status they answer
(today a missing rollout's 404 is not listed); the token test below covers them already."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    with store_server(tmp_path_factory.mktemp("store")) as served:
        yield served


def test_store_api_matches_its_schema(server: BackgroundServer, tmp_path: Path) -> None:
    report = run_schemathesis(
        server.url + "/openapi.json",
        tmp_path,
        max_examples=MAX_EXAMPLES,
        headers={"Authorization": f"Bearer {TOKEN}"},
        exclude_path_regex=DASHBOARD_DATA,
    )
    assert report.failures == [] and report.errors == [], report.explain()
    assert report.exit_code == 0, report.explain()
    assert report.operations_tested == STORE_OPERATIONS + 1  # and /health
    assert report.phases == {
        "examples": "skip",  # the document carries no examples
        "coverage": "success",
        "fuzzing": "success",
        "stateful": "success",
    }, report.explain()
    assert report.generated > 400
    print(f"RESULT store_fuzz_cases={report.generated}")


def _operations(schema: dict[str, object]) -> list[tuple[str, str]]:
    paths = schema["paths"]
    assert isinstance(paths, dict)
    return [(method.upper(), path) for path, item in paths.items() for method in item]


def test_every_store_route_but_health_needs_the_token(server: BackgroundServer) -> None:
    schema = httpx.get(server.url + "/openapi.json").json()
    operations = _operations(schema)
    assert len([op for op in operations if op[1].startswith("/store/")]) == STORE_OPERATIONS
    with httpx.Client(base_url=server.url) as client:
        for method, path in operations:
            concrete = path.format(rollout_id="r1", attempt_id="a1", version="0")
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
                response = client.request(method, concrete, headers=headers, json={})
                if path == "/health":
                    assert response.status_code == 200
                    continue
                assert response.status_code == 401, (method, path, headers, response.text)
                if path.startswith("/store/"):
                    assert response.headers["www-authenticate"] == "Bearer"
                    assert response.json()["error"]["type"] == "AuthenticationError"
            security = schema["paths"][path][method.lower()].get("security")
            assert (security is None) == (path == "/health"), (method, path)
        # The dashboard page is static (its script asks for the token); its data routes are not.
        page = client.get("/dashboard")
        assert page.status_code == 200 and TOKEN not in page.text
