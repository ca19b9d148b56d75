"""The HTTP API (FastAPI + uvicorn, the ``serve`` extra): the engine over JSON, for applications.

The model loads once and one worker thread owns it: every text to embed (queries of /search and
/search/batch, sentences of /similar) goes through a micro-batcher that hands whatever is waiting
(up to ``max_batch`` texts) to that thread as one batch, embedded in passes of similar length, so
throughput grows with load instead of queries queueing one by one for the CPU. A batch's FAISS
and SQLite work runs on one lookup thread, never on the event loop.

``POST /v1/embeddings`` (OpenAI's shape) and ``POST /encode`` (bert-as-service's) give the
vectors the index's queries get, through the same batcher and bounds; served with no index
(``create_app(None, encoding=...)``, ``semsearch serve --model ...``) they are all it serves.

``GET /`` is a search page for people (``search/static``: plain HTML/CSS/JS over this API, served
with a policy that lets it load nothing from elsewhere); ``GET /fields`` gives it the stored
fields' values and ranges to filter on.

A new index version written by ``add``/``delete``/``index`` is picked up between requests (checked
at most every ``reload_every`` seconds, or at once with ``POST /reload``). A request takes one
snapshot of the engine (index, embedder, transform) and uses it throughout, so it always works on
one complete version.

Bounds: a body is at most ``MAX_BODY`` bytes however it is sent (chunked too), and the texts of
one request may cost the model at most ``MAX_REQUEST_TOKENS`` tokens. When a client hangs up, its
request is cancelled and its texts, if still queued, are dropped without costing any model time.

Errors: every error answer is ``{"error": "<one line>"}``, Starlette's and uvicorn's own too (404,
405, HTTP h11 cannot read), and ``/openapi.json`` documents them as ``Error``; on
``/v1/embeddings`` it is OpenAI's ``{"error": {"message", "type", "param", "code"}}``
(``OpenAIError``), whose message OpenAI's clients show (``errors``, for every handler). Input the server
cannot read or that breaks a limit (bad JSON, a missing or out-of-range field, text that is not
valid Unicode, a bad filter, too much text) is 400; a body over ``MAX_BODY`` is 413; a conflict with
the index is 409; an index that cannot serve is 503 (each error class's ``http_status``), as are
index files that fail under the running server (removed, garbled: OSError, the catalog's DatabaseError).

Connections (``serve``, ``GuardedH11``): a whole request within ``REQUEST_TIMEOUT``, idle
keep-alive for ``KEEP_ALIVE``, at most ``MAX_CONNECTIONS`` open.

Modules, one job each (none imports ``app``, so there is no circle):

    app          create_app: the routes and error handlers (a new endpoint goes here)
    schema       request models, their bounds, ``Error`` and the OpenAPI schema
    errors       the error answer's shape, per route (OpenAI's on /v1/embeddings)
    batching     the micro-batcher, the token budget of a request and its parts
    live         the engine being served and its reloading (a snapshot per request)
    scans        /duplicates: one scan at a time, answers kept per version
    encode       /v1/embeddings and /encode, and the app that serves vectors alone
    connections  body limit, request deadline, connection cap, client hang-ups
    page         the search page and its static files under their policy
    serving      the listening socket and uvicorn
"""

from search.server.app import create_app
from search.server.serving import listen, serve

__all__ = ["create_app", "listen", "serve"]
