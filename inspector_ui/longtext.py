"""Long captured text on pages: the start of it, and a link to the whole.

A 20 MB request rendered whole makes a page no browser loads in a minute; a page shows
the first CLIP characters of any one text and says how much more there is."""

from __future__ import annotations

from fastapi.responses import Response
from markupsafe import Markup, escape

from .bidi import marked

CLIP = 64 * 1024  # characters of one text shown on a page


def clip(text, href: str | None = None, limit: int = CLIP) -> Markup:
    """`text` escaped, cut at `limit` characters with a note (and a link to the whole)."""
    text = "" if text is None else str(text)
    if len(text) <= limit:
        return escape(text)
    more = f"… {len(text) - limit:,} more characters not shown"
    link = Markup(' · <a class="clip-link" href="{}">{}</a>').format(href, "the whole text") if href else ""
    return escape(text[:limit]) + Markup('<span class="clip-note">{}{}</span>').format(more, link)


def whole(text: str, filename: str) -> Response:
    """The whole of a clipped text, where its link leads: plain text the browser shows (every
    inspector response is nosniff, so captured HTML stays text), bidirectional controls
    marked as on the pages. A lone surrogate is written as its escape, as json_bytes does."""
    return Response(marked(text).encode("utf-8", "backslashreplace"), media_type="text/plain; charset=utf-8",
                    headers={"content-disposition": f'inline; filename="{filename}"'})
