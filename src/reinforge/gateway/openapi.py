"""The gateway's OpenAPI document, built from its route table and the body models it validates with.

Why by hand: the gateway's routes are a `RouteTable` served without FastAPI's routing, so nothing
generates a document for them. Each path and method below is taken from the table itself (a route
added there and missing here fails `document_for`), and each request body from the pydantic model
that route parses it with, so the document says what the server enforces. Clients generated from it
and fuzzers (tests/fuzz) read it at `GET /openapi.json`, which needs no key: it is the API's
description, the same for every deployment, and holds nothing of any run.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from reinforge.finish_wire import FinishBody, FinishManyBody
from reinforge.gateway.anthropic_bodies import MessagesBody
from reinforge.gateway.openai_bodies import ChatCompletionBody, CompletionBody, ResponsesBody, RewardBody
from reinforge.net.routes import RouteTable

OPENAPI_PATH = "/openapi.json"

_REF = "#/components/schemas/{model}"
_BODIES: dict[str, type[BaseModel]] = {
    "/chat/completions": ChatCompletionBody,
    "/completions": CompletionBody,
    "/responses": ResponsesBody,
    "/messages": MessagesBody,
}
_OPENAI_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
_ANTHROPIC_ERROR = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}
_ANY_OBJECT: dict[str, Any] = {"type": "object"}
_ANY_BODY = {"required": True, "content": {"application/json": {"schema": _ANY_OBJECT}}}
_PREFIXES = ("", "/r/{attempt_id}", "/r/{attempt_id}/agents/{agent_name}", "/agents/{agent_name}")
_WHY = {
    "400": "Malformed JSON, or a body or parameter the gateway refuses (the message names it)",
    "401": "Missing key, or a key that is not this attempt's",
    "404": "Unknown attempt",
    "409": "The attempt is not running (finished, cancelled, superseded) or its rollout was dropped",
    "413": "Body over the gateway's limit",
    "415": "A Content-Type or Content-Encoding the route does not read",
    "429": "The attempt has made its max_calls_per_attempt calls",
    "503": "The gateway or its store is unavailable (retry later)",
}


def _errors(codes: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        code: {"description": _WHY[code], "content": {"application/json": {"schema": schema}}}
        for code in codes.split()
    }


def _otlp_errors(codes: str) -> dict[str, Any]:
    """OTLP answers an error in the encoding of the request (a google.rpc.Status)."""
    content = {"application/x-protobuf": {}, "application/json": {"schema": _ANY_OBJECT}}
    return {code: {"description": _WHY[code], "content": content} for code in codes.split()}


def _json_body(model: type[BaseModel]) -> dict[str, Any]:
    return {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": _REF.format(model=model.__name__)}}},
    }


def _path_parameters(path: str) -> list[dict[str, Any]]:
    params = []
    for name in ("attempt_id", "agent_name"):
        if "{" + name + "}" in path:
            schema = {"type": "string", "minLength": 1, "pattern": "^[^/\\x00]+$"}
            params.append({"name": name, "in": "path", "required": True, "schema": schema})
    return params


def _call_operation(path: str, suffix: str) -> dict[str, Any]:
    anthropic = suffix == "/messages"
    errors = _ANTHROPIC_ERROR if anthropic else _OPENAI_ERROR
    answer = {
        "description": "The answer; with `stream: true`, server-sent events",
        "content": {
            "application/json": {"schema": _ANY_OBJECT},
            "text/event-stream": {"schema": {}},  # events of the format's own stream
        },
    }
    return {
        "summary": f"{'Anthropic' if anthropic else 'OpenAI'} {suffix.lstrip('/')} for one attempt",
        "parameters": _path_parameters(path),
        "security": [{"AttemptKey": []}, {"AttemptApiKey": []}],
        "requestBody": _json_body(_BODIES[suffix]) if suffix in _BODIES else _ANY_BODY,
        "responses": {"200": answer, **_errors("400 401 404 409 413 429 503", errors)},
    }


def _operation(method: str, path: str) -> dict[str, Any]:
    """The operation of one route of the table."""
    for suffix in _BODIES:
        if path.endswith("/v1" + suffix):
            return _call_operation(path, suffix)
    params = _path_parameters(path)
    head, v1, suffix = path.rpartition("/v1")
    if method == "POST" and v1 and suffix not in ("/traces", "") and head in _PREFIXES:
        return _call_operation(path, suffix)  # a format added without a body model here
    if path.endswith("/v1/models"):
        listing = {
            "type": "object",
            "required": ["object", "data"],
            "properties": {"data": {"type": "array"}},
        }
        # The per-attempt URL checks the key; the shared ones name no attempt and need none.
        keyed = "{attempt_id}" in path
        security: list[dict[str, list[str]]] = [{"AttemptKey": []}, {"AttemptApiKey": []}] if keyed else []
        return {
            "summary": "The served model",
            "parameters": params,
            "security": security,
            "responses": {
                "200": {"description": "One model", "content": {"application/json": {"schema": listing}}},
                **(_errors("401", _OPENAI_ERROR) if keyed else {}),
            },
        }
    if path.endswith("/v1/traces"):
        body = {
            "required": True,
            "content": {
                "application/x-protobuf": {"schema": {"type": "string", "format": "binary"}},
                "application/json": {"schema": _ANY_OBJECT},
            },
        }
        return {
            "summary": "OTLP/HTTP traces of the attempt's agent (ExportTraceServiceRequest)",
            "parameters": params,
            "security": [{"AttemptKey": []}, {"AttemptApiKey": []}],
            "requestBody": body,
            "responses": {
                "200": {
                    "description": "ExportTraceServiceResponse (partial_success counts refused spans)",
                    "content": {"application/x-protobuf": {}, "application/json": {"schema": _ANY_OBJECT}},
                },
                **_otlp_errors("400 401 404 409 413 415 429 503"),
            },
        }
    if path.endswith("/reward"):
        done = {"type": "object", "required": ["span_id", "reward", "final"]}
        return {
            "summary": "Report a reward for the attempt (final by default)",
            "parameters": params,
            "security": [{"AttemptKey": []}, {"AttemptApiKey": []}],
            "requestBody": _json_body(RewardBody),
            "responses": {
                "200": {"description": "Recorded", "content": {"application/json": {"schema": done}}},
                **_errors("400 401 404 409 413 429 503", _OPENAI_ERROR),
            },
        }
    if path.endswith("/flush"):
        return {
            "summary": "Return once every span recorded for the attempt is in the store",
            "parameters": params,
            "security": [{"AttemptKey": []}],
            "responses": {
                "200": {"description": "Flushed", "content": {"application/json": {"schema": _ANY_OBJECT}}},
                **_errors("401 503", _OPENAI_ERROR),
            },
        }
    if path.endswith("/finish"):
        many = not params
        return {
            "summary": "End attempts (the runner's call, with its finish token)",
            "parameters": params,
            "security": [] if many else [{"FinishToken": []}],  # a batch carries a token per item
            "requestBody": _json_body(FinishManyBody if many else FinishBody),
            "responses": {
                "200": {
                    "description": "Per item status" if many else "The rollout",
                    "content": {"application/json": {"schema": _ANY_OBJECT}},
                },
                **_errors("400 401 404 409 413 503" if not many else "400 413 503", _OPENAI_ERROR),
            },
        }
    if path == "/health":
        return {
            "summary": "Liveness and load (no key; reveals no attempt)",
            "security": [],
            "responses": {
                "200": {"description": "Up", "content": {"application/json": {"schema": _ANY_OBJECT}}}
            },
        }
    raise ValueError(f"the gateway's OpenAPI document does not describe {method} {path}")


def document_for(table: RouteTable) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the gateway served by `table`."""
    models: list[type[BaseModel]] = [*_BODIES.values(), RewardBody, FinishBody, FinishManyBody]
    _, defs = models_json_schema([(m, "validation") for m in models], ref_template=_REF)
    paths: dict[str, dict[str, Any]] = {}
    for route in table.routes:
        if route.path == OPENAPI_PATH or route.method == "HEAD":
            continue  # the document itself, and the base URLs' connection warm-up (no operation)
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route.method, route.path)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "reinforge gateway",
            "version": "1",
            "description": (
                "OpenAI- and Anthropic-compatible endpoints for one attempt of a rollout: the base URL "
                "is <gateway>/r/<attempt_id>/v1 and the key is the attempt's token."
            ),
        },
        "paths": paths,
        "components": {
            "schemas": defs.get("$defs", {}),
            "securitySchemes": {
                "AttemptKey": {"type": "http", "scheme": "bearer", "description": "The attempt's token"},
                "AttemptApiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
                "FinishToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The runner's finish token",
                },
            },
        },
    }
