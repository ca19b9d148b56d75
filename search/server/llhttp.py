"""``Guarded`` on uvicorn's httptools protocol (llhttp, in C), the HTTP/1.1 ``serve`` runs where
``httptools`` is installed; its own module because uvicorn's protocol imports ``httptools``."""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from search.server.connections import MAX_HEAD, Guarded, raw_error


class GuardedHttpTools(Guarded, HttpToolsProtocol):
    """``Guarded`` on uvicorn's httptools protocol (llhttp, in C), with the head limit llhttp
    lacks: a request whose line and headers pass ``MAX_HEAD`` bytes is answered
    431 and closed, as h11 refuses one."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.head = 0  # bytes of the next request so far, until its head is read; -1: read
        self.unanswered = 0  # requests received whole and not yet answered (pipelined: several)

    def data_received(self, data: bytes) -> None:
        if self.head >= 0:
            self.head += len(data)
        super().data_received(data)
        if self.head > MAX_HEAD and not self.transport.is_closing():
            self.transport.write(raw_error(431, f"request head over {MAX_HEAD} bytes"))
            self.transport.close()

    def on_headers_complete(self) -> None:
        self.head = -1
        super().on_headers_complete()

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
