"""A stand-in for the Hugging Face Hub's file API, served from local folders on a thread, so a test
downloads a model by name (``HF_ENDPOINT``) without the internet. It answers what
``huggingface_hub.snapshot_download`` asks (read in its source, 2.4): the model's info
(``/api/models/REPO[/revision/REV]``: its ``sha`` and ``siblings``), its file tree
(``/api/models/REPO/tree/REV``) and each file (``/REPO/resolve/REV/FILE``, HEAD and GET, with the
``X-Repo-Commit``, ``ETag`` and ``Content-Length`` headers it reads). An unknown repository or
revision gets the 404 and ``X-Error-Code`` the Hub sends. Every request is logged (``requests``),
so a test sees what was downloaded."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

ROUTES = (
    ("info", re.compile(r"/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?")),
    ("tree", re.compile(r"/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)")),
    ("file", re.compile(r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)")),
)


class Repo:
    """A folder served as one commit of a repository (the commit: a digest of its files)."""

    def __init__(self, folder: Path):
        self.files = {
            path.relative_to(folder).as_posix(): path.read_bytes()
            for path in sorted(folder.rglob("*"))
            if path.is_file()
        }
        digest = hashlib.sha1()
        for name, data in self.files.items():
            digest.update(name.encode() + b"\0" + hashlib.sha1(data).digest())
        self.commit = digest.hexdigest()


class FakeHub:
    """The stand-in's repositories (``serve(name, folder)``) and what it was asked."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[str] = []

    def serve(self, name: str, folder: Path) -> str:
        """Serve ``folder`` as the repository ``name``; its commit."""
        self.repos[name] = Repo(folder)
        return self.repos[name].commit

    def downloaded(self) -> list[str]:
        """The files fetched with GET, as ``REPO/FILE``."""
        found = (re.fullmatch(r"GET /(.+?/.+?)/resolve/[^/]+/(.+)", r) for r in self.requests)
        return [f"{m[1]}/{m[2]}" for m in found if m]

    def answer(self, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
        self.requests.append(f"{method} {path}")
        for kind, pattern in ROUTES:
            matched = pattern.fullmatch(path)
            if matched:
                return self._answer(kind, {k: unquote(v or "main") for k, v in matched.groupdict().items()})
        return 404, {"X-Error-Code": "EntryNotFound"}, b'{"error": "no such route"}'

    def _answer(self, kind: str, asked: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        repo = self.repos.get(asked["repo"])
        if repo is None:
            return 404, {"X-Error-Code": "RepoNotFound"}, b'{"error": "Repository not found"}'
        if asked["rev"] not in ("main", repo.commit):
            return 404, {"X-Error-Code": "RevisionNotFound"}, b'{"error": "Invalid rev id"}'
        commit = {"X-Repo-Commit": repo.commit}
        if kind == "info":
            siblings = [{"rfilename": name} for name in repo.files]
            body = {"id": asked["repo"], "modelId": asked["repo"], "sha": repo.commit, "siblings": siblings}
            return 200, commit, json.dumps(body).encode()
        if kind == "tree":
            tree = [
                {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                for name, data in repo.files.items()
            ]
            return 200, commit, json.dumps(tree).encode()
        data = repo.files.get(asked["file"])
        if data is None:
            return 404, {"X-Error-Code": "EntryNotFound", **commit}, b'{"error": "Entry not found"}'
        return 200, {**commit, "ETag": f'"{hashlib.sha256(data).hexdigest()}"'}, data


@contextmanager
def fake_hub() -> Iterator[tuple[FakeHub, str]]:
    """A running stand-in and its address (for ``HF_ENDPOINT``), stopped on leaving."""
    hub = FakeHub()

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, with_body: bool) -> None:
            status, headers, body = hub.answer(self.command, urlsplit(self.path).path)
            self.send_response(status)
            kind = "application/json" if body[:1] in (b"{", b"[") else "application/octet-stream"
            for key, value in {"Content-Type": kind, **headers, "Content-Length": str(len(body))}.items():
                self.send_header(key, value)
            self.end_headers()
            if with_body:
                self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
            self._reply(True)

        def do_HEAD(self) -> None:  # noqa: N802
            self._reply(False)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
