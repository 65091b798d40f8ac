"""Time `DirectSender.send`: N POSTs to a raw keep-alive server (its own process) on 127.0.0.1.

Run it once per checkout to compare two versions (docs/benchmarks-spine.md, "One send path per client"):

    PYTHONPATH=src python benchmarks/send_path_ab.py 2000

Prints the best of three runs: wall time and the client's own CPU time per request (the second is
steadier on a shared machine).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import sys
import time

import httpx

from reinforge.net.keepalive_transport import DirectSender, KeepAliveTransport

BODY = b'{"ok":true,"items":[1,2,3]}'
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
    len(BODY),
    BODY,
)


def _serve(ports: multiprocessing.Queue[int]) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                if length:
                    await reader.readexactly(length)
                writer.write(ANSWER)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        ports.put(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    asyncio.run(main())


async def _bench(base_url: str, n: int) -> tuple[float, float]:
    headers = {"Content-Type": "application/json", "Authorization": "Bearer t"}
    sender = DirectSender(KeepAliveTransport(), headers, httpx.Timeout(10))
    url = httpx.URL(base_url + "/store/counters")
    for _ in range(200):
        await sender.send("POST", url, b'{"a":1}')
    wall = cpu = float("inf")
    for _ in range(3):
        started, cpu_started = time.perf_counter(), time.process_time()
        for _ in range(n):
            reply = await sender.send("POST", url, b'{"a":1}')
            assert reply.status_code == 200
        wall = min(wall, time.perf_counter() - started)
        cpu = min(cpu, time.process_time() - cpu_started)
    await sender.transport.aclose()
    return wall / n * 1e6, cpu / n * 1e6


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    ports: multiprocessing.Queue[int] = multiprocessing.Queue()
    server = multiprocessing.Process(target=_serve, args=(ports,), daemon=True)
    server.start()
    try:
        wall, cpu = asyncio.run(_bench(f"http://127.0.0.1:{ports.get()}", n))
        print(f"DirectSender.send: {wall:.1f} us/request wall, {cpu:.1f} us client CPU (best of 3)")
    finally:
        server.terminate()
        server.join()


if __name__ == "__main__":
    main()
