"""Child process for the durability tests: adds span batches and acknowledges each on stdout after
`add_spans` returned, then keeps adding until it is killed."""

from __future__ import annotations

import asyncio
import sys

from reinforge.store import SqlStore
from reinforge.types import Span


async def main(url: str, schema: str | None) -> None:
    store = await SqlStore.open(url, schema=schema)
    batch_no = 0
    while True:
        spans = [
            Span(
                span_id=f"{batch_no:08x}{i:08x}",
                rollout_id="r",
                attempt_id="a",
                name="llm",
                attributes={"i": i},
            )
            for i in range(20)
        ]
        await store.add_spans(spans)
        print(f"ack {batch_no}", flush=True)
        batch_no += 1


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None))
