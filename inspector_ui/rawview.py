"""The raw stream cut at the chunk boundaries the timeline recorded: what arrived when."""

from __future__ import annotations

MAX_CHUNKS = 2000  # beyond this the page shows the first ones and says how many more


def raw_view(body: bytes, timeline: list, duration_ms: float | None) -> dict:
    points = [(int(o), float(ms)) for o, ms in timeline or []]
    chunks = []
    for i, (offset, ms) in enumerate(points[:MAX_CHUNKS]):
        end = points[i + 1][0] if i + 1 < len(points) else len(body)
        piece = body[offset:end]
        chunks.append({"n": i + 1, "offset": offset, "ms": round(ms, 3), "size": len(piece),
                       "text": piece.decode("utf-8", "replace")})
    span = max([ms for _, ms in points] + [duration_ms or 0, 1])
    ticks = [{"x": round(700 * ms / span, 1), "ms": ms} for _, ms in points[:MAX_CHUNKS]]
    return {"chunks": chunks, "more": max(0, len(points) - MAX_CHUNKS), "size": len(body),
            "text": body.decode("utf-8", "replace") if not points else None,
            "ticks": ticks, "span": round(span, 1)}
