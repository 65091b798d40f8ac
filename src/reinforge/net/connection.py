"""One keep-alive HTTP/1.1 client connection on asyncio, its replies parsed by httptools (the C
parser uvicorn uses).

A connection carries one exchange at a time. When a reply is whole it hands itself back to its
`ConnectionOwner` (to be reused or closed); a reply's body may still be arriving after its head
(server-sent events), so the body is a `ResponseBody` the reader drains as chunks come.
"""

from __future__ import annotations

import asyncio
from typing import Protocol, cast

import httptools


class ConnectionBroken(ConnectionError):
    """The connection failed or closed before a whole reply arrived, or the reply was malformed."""


class ResponseBody:
    """A reply's body as it arrives: chunks so far, whether it is whole, and why it ended early."""

    __slots__ = ("chunks", "done", "error", "waiter")

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.done = False
        self.error: ConnectionBroken | None = None
        self.waiter: asyncio.Future[None] | None = None
        """Set by a reader waiting for the next chunk; resolved when one comes or the body ends."""

    def feed(self, data: bytes) -> None:
        self.chunks.append(data)
        self._wake()

    def finish(self, error: ConnectionBroken | None = None) -> None:
        if not self.done:
            self.done, self.error = True, error
            self._wake()

    def take(self) -> bytes:
        chunks, self.chunks = self.chunks, []
        return b"".join(chunks)

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


Head = tuple[int, list[tuple[bytes, bytes]], ResponseBody]
"""A reply's status, its raw headers and its body (whole, or still arriving)."""


class ConnectionOwner(Protocol):
    def release(self, conn: Connection, reusable: bool) -> None:
        """`conn` has finished its exchange (or died): keep it for the next one, or let it go."""


class Connection(asyncio.Protocol):
    """One connection to one origin; `send` writes a request and resolves `head` with the reply's."""

    def __init__(self, owner: ConnectionOwner) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.owner = owner
        self.head: asyncio.Future[Head] | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: ResponseBody | None = None
        self.closed = False
        self.busy = True
        """Between taking an exchange and its reply being whole (or the connection dying)."""
        self.got_bytes = False
        """Whether the server sent anything for the exchange in flight."""

    def send(self, wire: bytes, head: asyncio.Future[Head]) -> None:
        assert self.transport is not None
        self.got_bytes = False
        self.head = head
        self.transport.write(wire)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()
        self._release(False)

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(f"malformed HTTP response: {exc}")
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(f"connection closed before the response was complete ({exc})")
        self._release(False)

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # an interim response (100 Continue): its final one follows
            self.headers = []
            return
        self.body = ResponseBody()
        if self.head is not None and not self.head.done():
            self.head.set_result((status, self.headers, self.body))

    def on_body(self, data: bytes) -> None:
        if self.body is not None:
            self.body.feed(data)

    def on_message_complete(self) -> None:
        if self.parser.get_status_code() < 200:
            return
        # Read here: the parser resets its keep-alive state for the next message afterwards.
        keep_alive = self.parser.should_keep_alive()
        if self.body is not None:
            self.body.finish()
        self.head, self.body, self.headers = None, None, []
        # The reply is whole (its bytes are buffered in its body): the connection can serve another.
        self._release(keep_alive and not self.closed)

    def _fail(self, message: str) -> None:
        error = ConnectionBroken(message)
        if self.head is not None and not self.head.done():
            self.head.set_exception(error)
        if self.body is not None:
            self.body.finish(error)
            self.body = None

    def _release(self, reusable: bool) -> None:
        if self.busy:
            self.busy = False
            self.owner.release(self, reusable)
