"""Small ASGI helpers shared by tooltap's own ASGI apps (not the forwarder's hot path,
which reads the body with its own shutdown and time-out rules)."""

from __future__ import annotations


async def read_body(receive) -> tuple[bytes, bool]:
    """The whole request body, and whether it all arrived (False: the client hung up)."""
    parts = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(parts), False
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(parts), True
