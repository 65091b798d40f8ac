"""Kill a writing process with SIGKILL and check that every batch it acknowledged is in the store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from reinforge.store import SqlStore
from reinforge.types import SpanQuery

CHILD = Path(__file__).with_name("_durability_child.py")


def write_until_killed(url: str, schema: str | None, acks_wanted: int) -> int:
    """Run the child until it acknowledged `acks_wanted` batches, SIGKILL it; return the ack count."""
    # -P: the script's folder holds a test package named `http`, which must not shadow the stdlib's.
    args = [sys.executable, "-P", str(CHILD), url] + ([schema] if schema else [])
    child = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    acked = 0
    try:
        for line in child.stdout:
            if line.startswith("ack "):
                acked = int(line.split()[1]) + 1
            if acked >= acks_wanted:
                break
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    return acked


async def assert_acked_spans_present(store: SqlStore, acked: int) -> None:
    ids: set[str] = set()
    offset: int | None = 0
    while offset is not None:
        page = await store.query_spans(SpanQuery(limit=1000, offset=offset))
        ids.update(s.span_id for s in page.items)
        offset = page.next_offset
    missing = [f"{b:08x}{i:08x}" for b in range(acked) for i in range(20) if f"{b:08x}{i:08x}" not in ids]
    assert not missing, f"{len(missing)} acknowledged spans lost, e.g. {missing[:3]}"
