"""The gateway against its own OpenAPI document (`GET /openapi.json`), and its keys on every route.

The document's `attempt_id` is pinned to a running attempt (and the attempt's key sent), so that
generated calls get past the key check and reach the body parsers and the backend; negative cases
still vary it. Every route runs every check, `positive_data_acceptance` included: the document
states each value the gateway refuses (echo, suffix, n>1 with a stream, batched prompts, a message
without a known role...), so whatever it calls valid is served.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.fuzz.schemathesis_run import FuzzReport, run_schemathesis
from tests.fuzz.servers import GatewayUnderTest, gateway_server

CALLS = r"/v1/(chat/completions|completions|responses|messages)$"
ONE_PREFIX_CALLS = r"^/r/\{attempt_id\}/v1/(chat/completions|completions|responses|messages)$"
"""The four formats under the per-attempt URL, fuzzed in every phase; under the other three prefixes
(the same handlers, the attempt named by the key or with an agent name) they get the fuzzing phase."""
OTHER_PREFIX_CALLS = (
    r"^/(r/\{attempt_id\}/agents/\{agent_name\}/|agents/\{agent_name\}/|)"
    r"v1/(chat/completions|completions|responses|messages)$"
)


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayUnderTest]:
    from reinforge.models import build_tokenizer

    tokenizer = build_tokenizer(["The answer is 4.", "hello world", "what is 2 + 2?"] * 10, vocab_size=300)
    with gateway_server(tokenizer) as served:
        yield served


def _pinned_document(gateway: GatewayUnderTest, folder: Path) -> Path:
    document = httpx.get(gateway.server.url + "/openapi.json").json()
    for item in document["paths"].values():
        for operation in item.values():
            for parameter in operation.get("parameters", []):
                if parameter["name"] == "attempt_id":
                    parameter["schema"] = {"type": "string", "enum": [gateway.attempt_id]}
    path = folder / "gateway-openapi.json"
    path.write_text(json.dumps(document))
    return path


def _assert_clean(report: FuzzReport) -> None:
    assert report.failures == [] and report.errors == [], report.explain()
    assert report.exit_code == 0, report.explain()
    assert report.phases["fuzzing"] == "success"
    assert report.phases.get("stateful", "skip") in ("success", "skip")


def test_gateway_routes_match_their_schema(gateway: GatewayUnderTest, tmp_path: Path) -> None:
    document = _pinned_document(gateway, tmp_path)
    headers = {"Authorization": f"Bearer {gateway.key}"}
    common: dict[str, Any] = {"headers": headers, "base_url": gateway.server.url}
    rest = run_schemathesis(str(document), tmp_path, max_examples=10, exclude_path_regex=CALLS, **common)
    _assert_clean(rest)
    calls = run_schemathesis(
        str(document), tmp_path, max_examples=8, include_path_regex=ONE_PREFIX_CALLS, **common
    )
    _assert_clean(calls)
    others = run_schemathesis(
        str(document),
        tmp_path,
        max_examples=3,
        include_path_regex=OTHER_PREFIX_CALLS,
        phases="fuzzing",
        **common,
    )
    _assert_clean(others)
    assert (rest.operations_tested, calls.operations_tested, others.operations_tested) == (10, 4, 12)
    assert gateway.server.url  # the server answered every case (a 5xx fails `not_a_server_error`)
    cases = rest.generated + calls.generated + others.generated
    print(f"RESULT gateway_fuzz_cases={cases} operations=26")


def test_every_attempt_route_needs_the_attempt_key(gateway: GatewayUnderTest) -> None:
    document = httpx.get(gateway.server.url + "/openapi.json").json()
    keyed = 0
    with httpx.Client(base_url=gateway.server.url) as client:
        for path, item in document["paths"].items():
            for method, operation in item.items():
                concrete = path.format(attempt_id=gateway.attempt_id, agent_name="solver")
                if not operation["security"]:
                    continue  # /health, the shared /v1/models, the batched /finish (a token per item)
                keyed += 1
                for headers in ({}, {"Authorization": "Bearer rf-wrong"}, {"x-api-key": "rf-wrong"}):
                    response = client.request(method.upper(), concrete, headers=headers, json={})
                    assert response.status_code == 401, (method, path, headers, response.text)
                # The agent's key can't end its own attempt: finishing needs the runner's token.
                if path.endswith("/finish"):
                    agent_key = {"Authorization": f"Bearer {gateway.key}"}
                    response = client.request(method.upper(), concrete, headers=agent_key, json={})
                    assert response.status_code == 401
        # Shared URLs name the attempt by the key alone: a wrong one names none.
        for prefix in ("/v1", "/agents/solver/v1"):
            response = client.post(
                prefix + "/chat/completions", headers={"Authorization": "Bearer x"}, json={}
            )
            assert response.status_code == 401
    assert keyed == 22
