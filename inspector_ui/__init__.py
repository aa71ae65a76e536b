"""The inspector: tooltap's own pages and JSON API, everything under /_tooltap/."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from proxy.store.db import make_engine
from proxy.store.read import Reader

STATIC = Path(__file__).parent / "static"


def create_inspector(tooltap, lifespan=None) -> FastAPI:
    from . import api, live, mcp_api, mcp_pages, pages, schemas_page
    from .queries import Queries
    from .security import Guard

    app = FastAPI(title="tooltap", lifespan=lifespan, docs_url=None, redoc_url=None,
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
    # Outermost: every response (pages, API, live, static, errors) gets the headers and
    # the token check.
    app.add_middleware(Guard, token=tooltap.settings.ui_token)
    return app
