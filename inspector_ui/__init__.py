"""The inspector: tooltap's own pages and JSON API, everything under /_tooltap/."""

from __future__ import annotations

from fastapi import FastAPI

from proxy.store.db import make_engine
from proxy.store.read import Reader


def create_inspector(tooltap, lifespan=None) -> FastAPI:
    from . import api, pages

    app = FastAPI(title="tooltap", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url="/_tooltap/api/openapi.json")
    app.state.tooltap = tooltap
    app.state.reader = Reader(make_engine(tooltap.settings.db_url))
    app.include_router(api.router, prefix="/_tooltap/api")
    app.include_router(pages.router, prefix="/_tooltap")
    return app
