"""The HTTP API (FastAPI + uvicorn, the ``serve`` extra): the engine over JSON, for applications,
and a search page for people. docs/architecture.md ("The HTTP server") gives its modules, bounds
and error answers; docs/serving.md how to run it.
"""

from search.server.app import create_app
from search.server.serving import listen, serve

__all__ = ["create_app", "listen", "serve"]
