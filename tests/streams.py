"""Helpers for the wire-API tests: feed a stream's bytes through the real SSE decoder."""

from __future__ import annotations

from proxy.sse import SSEDecoder


def assemble_cut(api, raw: bytes, cuts=()):
    """Feed `raw` through an SSEDecoder in pieces cut at `cuts`, then close the stream;
    return `api`'s assembler."""
    decoder, asm = SSEDecoder(), api.new_assembler()
    pos = 0
    for cut in sorted(cuts) + [len(raw)]:
        for event in decoder.feed(raw[pos:cut]):
            asm.feed(event)
        pos = cut
    for event in decoder.close():
        asm.feed(event)
    return asm
