"""``Guarded`` on uvicorn's httptools protocol (llhttp, in C), the HTTP/1.1 ``serve`` runs where
``httptools`` is installed; its own module because uvicorn's protocol imports ``httptools``."""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from search.server.connections import MAX_BODY, MAX_HEAD, Guarded


class GuardedHttpTools(Guarded, HttpToolsProtocol):
    """``Guarded`` on uvicorn's httptools protocol (llhttp, in C), with the bounds llhttp lacks:
    a request whose line and headers pass ``MAX_HEAD`` bytes is answered 431 and closed, as h11
    refuses one; and a body's bytes as sent are bounded too, not only the body they carry (which
    ``read_body`` counts): llhttp reads a chunk-size line (its extensions, its leading zeros) and
    the trailers after the last chunk however long they are, and uvicorn keeps every trailer. So
    past ``MAX_HEAD`` bytes of such framing with no chunk or body between, or past ``MAX_BODY``
    and ``MAX_HEAD`` bytes of a body as sent, the request is answered 413 and closed."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.head = 0  # bytes of the next request so far, until its head is read; -1: read
        self.unanswered = 0  # requests received whole and not yet answered (pipelined: several)
        self.sent = 0  # bytes of the body being received, as sent (framing and trailers too)
        self.framing = 0  # of those, bytes since the last chunk header or piece of body
        self.events = 0  # chunk headers and pieces of body read (llhttp's callbacks)

    def data_received(self, data: bytes) -> None:
        body, events = self.head < 0, self.events
        if body:
            self.sent += len(data)
        else:
            self.head += len(data)
        super().data_received(data)
        if self.transport.is_closing():
            return
        stalled = body and self.head < 0 and self.events == events  # framing alone, all of it
        self.framing = self.framing + len(data) if stalled else 0
        if self.head > MAX_HEAD:
            self.answer(431, f"request head over {MAX_HEAD} bytes")
        elif self.framing > MAX_HEAD:
            self.refuse_body(f"a chunk-size line or trailers over {MAX_HEAD} bytes")
        elif self.sent > MAX_BODY + MAX_HEAD:
            self.refuse_body(f"request body over {MAX_BODY} bytes (as sent, with its framing)")

    def refuse_body(self, message: str) -> None:
        """413 for a body past a bound, unless the request was answered already (its
        content-length said it was too large): then the connection is only closed."""
        if self.cycle.response_started:
            self.transport.close()
        else:
            self.answer(413, message)

    def on_headers_complete(self) -> None:
        self.head, self.sent, self.framing = -1, 0, 0
        super().on_headers_complete()

    def on_chunk_header(self) -> None:
        self.events += 1

    def on_body(self, body: bytes) -> None:
        self.events += 1
        super().on_body(body)

    def on_message_complete(self) -> None:
        self.head = 0
        if not self.cycle.response_complete:  # else answered before its body ended (a 413)
            self.unanswered += 1
        super().on_message_complete()

    def on_response_complete(self) -> None:
        self.unanswered = max(0, self.unanswered - 1)
        super().on_response_complete()

    def receiving(self) -> bool:
        return self.unanswered == 0

    def begun(self) -> tuple[bool, str | None]:
        return self.head != 0, self.scope["path"] if self.head < 0 else None
