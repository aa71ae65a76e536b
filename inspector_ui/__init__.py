"""The inspector: tooltap's own pages and JSON API, everything under /_tooltap/."""

from __future__ import annotations

from contextlib import asynccontextmanager, nullcontext
from http import HTTPStatus
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler, request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from proxy.store.db import make_engine
from proxy.store.read import Reader

STATIC = Path(__file__).parent / "static"


def create_inspector(tooltap, lifespan=None) -> FastAPI:
    from . import api, live, mcp_api, mcp_pages, pages, schemas_page
    from .queries import Queries
    from .security import Guard

    @asynccontextmanager
    async def lifespan_then_close(app: FastAPI):
        async with lifespan(app) if lifespan else nullcontext():
            yield
        # Its own connections last: on SQLite the last one closed moves the write-ahead
        # log into the file, which then holds every turn on its own.
        app.state.reader.close()

    app = FastAPI(title="tooltap", lifespan=lifespan_then_close, docs_url=None, redoc_url=None,
                  openapi_url="/_tooltap/api/openapi.json")
    app.state.tooltap = tooltap
    app.state.reader = Reader(make_engine(tooltap.settings.db_url))
    app.state.queries = Queries(app.state.reader)
    app.include_router(live.router, prefix="/_tooltap/api")
    app.include_router(mcp_api.router, prefix="/_tooltap/api")
    app.include_router(api.router, prefix="/_tooltap/api")
    app.include_router(pages.router, prefix="/_tooltap")
    app.include_router(schemas_page.router, prefix="/_tooltap")
    app.include_router(mcp_pages.router, prefix="/_tooltap")
    app.mount("/_tooltap/static", StaticFiles(directory=str(STATIC)), name="static")
    app.add_exception_handler(StarletteHTTPException, _error_page)
    app.add_exception_handler(RequestValidationError, _invalid_address)
    app.add_middleware(HeadAsGet)
    # Outermost: every response (pages, API, live, static, errors) gets the headers and
    # the token check.
    app.add_middleware(Guard, token=tooltap.settings.ui_token)
    return app


class HeadAsGet:
    """HEAD (`curl -I`, link checkers, monitors) answered as the GET of the same address,
    head only. FastAPI's routes take GET alone (a Starlette Route adds HEAD, an APIRoute
    does not); here one place serves every route, mount and error alike, and a HEAD
    never reaches a POST handler.

    The answer is whole once its head is sent: the server then answers the app's next
    `receive()` with a disconnect (ASGI), so an endless response (the live stream) stops
    as for a client gone, and whatever the app still sends is dropped here."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "HEAD":
            return await self.app(scope, receive, send)
        answered = False

        async def send_head(message):
            nonlocal answered
            if answered or message["type"] != "http.response.start":
                return
            answered = True
            await send(message)  # GET's headers, Content-Length included (RFC 9110 9.3.2)
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        # The server keeps its own scope, still HEAD: it sends no body bytes either way.
        await self.app({**scope, "method": "GET"}, receive, send_head)


def _wants_page(request: Request) -> bool:
    path = request.url.path
    return not path.startswith(("/_tooltap/api/", "/_tooltap/static/")) and \
        "text/html" in request.headers.get("accept", "")


async def _invalid_address(request: Request, exc: RequestValidationError):
    """An address a page cannot be made of (`/turns/abc`, `?after=x`): a page saying which
    part, for a browser; the API's detailed JSON otherwise."""
    if not _wants_page(request):
        return await request_validation_exception_handler(request, exc)
    parts = "; ".join(f"{e['loc'][-1]}={e.get('input')!r}: {e['msg']}" for e in exc.errors())
    return await _error_page(request, StarletteHTTPException(422, f"not an address of the inspector ({parts})"))


async def _error_page(request: Request, exc: StarletteHTTPException):
    """A page's error as a page, for a browser: a JSON body there read as a broken page,
    and, having no icon, made the browser ask for /favicon.ico, which is forwarded
    upstream and recorded as a turn. The API and the static files answer as before."""
    if not _wants_page(request):
        return await http_exception_handler(request, exc)
    from .pages import templates

    try:
        reason = HTTPStatus(exc.status_code).phrase
    except ValueError:
        reason = ""
    return templates.TemplateResponse(request, "error.html", {
        "status": exc.status_code, "reason": reason, "detail": exc.detail}, status_code=exc.status_code,
        headers=getattr(exc, "headers", None))
