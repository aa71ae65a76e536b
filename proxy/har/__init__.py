"""HAR (HTTP Archive 1.2): stored sessions out for browser devtools and mitmproxy
(`export.py`), captures taken elsewhere in, stored as if they had passed through tooltap
(`load.py`).

HAR keeps a response body as its decoded text, so a body the upstream compressed goes
out decompressed (its Content-Encoding header kept, as browsers and mitmproxy write it)
and comes in as the decompressed bytes. What HAR has no field for (the session, chunk
timing, tooltap's status of the turn) travels in each entry's `_tooltap` object, a custom
field as the format allows: tooltap's own export comes back whole.
"""

from __future__ import annotations


class HarError(ValueError):
    """A file that is not a HAR tooltap can read (the message says why)."""


TOOLTAP_FIELD = "_tooltap"
