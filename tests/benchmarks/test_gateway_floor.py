"""benchmarks/baselines/forwarding_proxy.py, the floor `gateway_bench.py --floor` measures: what it
forwards comes back byte for byte, on one keep-alive connection, and a client's early bytes wait for
its upstream connection instead of being lost."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
BASELINES = BENCHMARKS / "baselines"

_spec = importlib.util.spec_from_file_location("_agl", BENCHMARKS / "_agl.py")
assert _spec is not None and _spec.loader is not None
_agl = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_agl)  # the benchmarks' own free_port and wait_http


def _serve(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, *args], stdout=subprocess.DEVNULL)


@pytest.fixture
def upstream_and_proxy() -> Iterator[tuple[str, str]]:
    up_port, proxy_port = _agl.free_port(), _agl.free_port()
    procs = [_serve(str(BASELINES / "fast_upstream.py"), str(up_port))]
    try:
        _agl.wait_http(f"http://127.0.0.1:{up_port}/health", timeout=30, proc=procs[0])
        procs.append(_serve(str(BASELINES / "forwarding_proxy.py"), str(up_port), str(proxy_port)))
        _agl.wait_http(f"http://127.0.0.1:{proxy_port}/health", timeout=30, proc=procs[1])
        yield f"http://127.0.0.1:{up_port}", f"http://127.0.0.1:{proxy_port}"
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)


def test_the_proxy_returns_the_upstreams_reply_unchanged(upstream_and_proxy: tuple[str, str]) -> None:
    direct_url, proxy_url = upstream_and_proxy
    body = {"model": "policy", "messages": [{"role": "user", "content": "2 + 2?"}], "max_tokens": 16}
    with httpx.Client(base_url=direct_url) as direct, httpx.Client(base_url=proxy_url) as proxied:
        expected = direct.post("/v1/chat/completions", json=body)
        replies = [proxied.post("/v1/chat/completions", json=body) for _ in range(3)]
    assert expected.status_code == 200
    assert expected.json()["choices"][0]["message"]["content"] == "The answer is 4."
    assert [r.content for r in replies] == [expected.content] * 3
    assert [r.status_code for r in replies] == [200] * 3


def test_bytes_sent_on_connect_are_forwarded_once_the_upstream_is_open(
    upstream_and_proxy: tuple[str, str],
) -> None:
    _, proxy_url = upstream_and_proxy
    port = int(proxy_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        # Two requests in one write, the moment the connection opens: both are answered, in order.
        request = b"GET /health HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n"
        sock.sendall(request * 2)
        received = b""
        deadline = time.monotonic() + 10
        while received.count(b"HTTP/1.1 200") < 2 and time.monotonic() < deadline:
            received += sock.recv(65536)
    assert received.count(b"HTTP/1.1 200") == 2
