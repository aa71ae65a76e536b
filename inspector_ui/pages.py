"""Server-rendered pages."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.templating import Jinja2Templates

router = APIRouter()
templates = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))


@router.get("/")
def index(request: Request):
    turns = request.app.state.reader.turns(limit=100)
    return templates.TemplateResponse(request, "index.html", {"turns": turns})
