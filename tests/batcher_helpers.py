"""What the micro-batcher's tests share: a gate that holds the model thread's first pass, and an
HTTP client on an app in this process."""

from __future__ import annotations

import asyncio
import threading

import pytest

from search.read.encoding import Encoding


class Gate:
    """Holds the first embedding pass in the worker thread until ``release`` is set (the model
    thread embeds a batch's token ids: ``Encoding.embed_tokens``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.entered = threading.Event()
        self.release = threading.Event()
        original = Encoding.embed_tokens

        def gated(encoding: Encoding, ids):
            if not self.release.is_set():
                self.entered.set()
                self.release.wait(60)
            return original(encoding, ids)

        monkeypatch.setattr(Encoding, "embed_tokens", gated)

    async def wait_entered(self) -> None:
        assert await asyncio.to_thread(self.entered.wait, 60)


def client_for(app):
    """An ``httpx.AsyncClient`` that calls ``app`` in this process."""
    import httpx

    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
