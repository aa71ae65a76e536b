"""The benchmark client: a minimal HTTP/1.1 client on raw asyncio streams (uvloop), run in
its own process by overhead.py. The same code talks to the upstream and to tooltap.

Each worker keeps one keep-alive connection per target, as an agent's HTTP pool does.
It sends a streaming chat request (a unique user message each time, so every request is
its own session in tooltap), then reads the chunked body, noting when the first body
chunk arrives (TTFB) and when the terminating chunk arrives (total). Every body is
checked for its length and its final `data: [DONE]`.

    python bench/client.py JSON_SPEC      (prints a JSON result on stdout)
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import socket
import sys
import time

from common import writer_backlog

SYSTEM = "You are a careful coding agent. " * 32  # ~1 KB, sent every request
_counter = itertools.count()


def request_bytes(host: str, port: int, path: str, body: bytes | None = None) -> bytes:
    body = body or json.dumps({
        "model": "bench-model", "stream": True, "stream_options": {"include_usage": True},
        "messages": [{"role": "system", "content": SYSTEM},
                     {"role": "user", "content": f"bench request {os.getpid()}-{next(_counter)}-{time.time_ns()}"}],
    }).encode()
    head = (f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
            f"accept: text/event-stream\r\nauthorization: Bearer sk-bench-not-a-secret\r\n"
            f"content-length: {len(body)}\r\n\r\n")
    return head.encode() + body


class BadResponse(Exception):
    pass


class Conn:
    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.r: asyncio.StreamReader | None = None
        self.w: asyncio.StreamWriter | None = None

    async def open(self) -> "Conn":
        self.r, self.w = await asyncio.open_connection(self.host, self.port, limit=1 << 20)
        self.w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self

    def close(self) -> None:
        if self.w is not None:
            self.w.close()

    async def request(self, path: str, body: bytes | None = None) -> tuple[float, float, int, bytes]:
        """(ttfb seconds, total seconds, body bytes, last 16 body bytes); `body`: the request's
        (default: a small chat request of its own)."""
        if self.w is None:
            await self.open()
        r, w = self.r, self.w
        request = request_bytes(self.host, self.port, path, body)
        t0 = time.perf_counter()
        w.write(request)
        buf = bytearray()
        while True:
            data = await r.read(1 << 20)
            if not data:
                raise BadResponse("connection closed before the headers")
            buf += data
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                break
        t_read = time.perf_counter()
        head = bytes(buf[:end]).decode("latin-1").split("\r\n")
        status = int(head[0].split(" ", 2)[1])
        hdrs = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:])}
        if status != 200:
            raise BadResponse(f"HTTP {status}")
        pos = end + 4
        size_total = 0
        ttfb = None
        tail = b""
        if "content-length" in hdrs:
            need = pos + int(hdrs["content-length"])
            while len(buf) < need:
                data = await r.read(1 << 20)
                if not data:
                    raise BadResponse("connection closed mid-body")
                if ttfb is None:
                    ttfb = time.perf_counter() - t0
                buf += data
            size_total = need - pos
            tail = bytes(buf[max(pos, need - 16):need])
            return ttfb or (t_read - t0), time.perf_counter() - t0, size_total, tail
        if hdrs.get("transfer-encoding", "").lower() != "chunked":
            raise BadResponse("neither content-length nor chunked")
        while True:
            nl = buf.find(b"\r\n", pos)
            if nl >= 0:
                size = int(bytes(buf[pos:nl]).split(b";")[0], 16)
                if size == 0:
                    if len(buf) >= nl + 4:  # no trailers: "0\r\n\r\n"
                        return ttfb, t_read - t0, size_total, tail
                else:
                    stop = nl + 2 + size
                    if len(buf) >= stop + 2:
                        if ttfb is None:
                            ttfb = t_read - t0
                        size_total += size
                        tail = (tail + bytes(buf[max(nl + 2, stop - 16):stop]))[-16:]
                        pos = stop + 2
                        if pos > (1 << 16):
                            del buf[:pos]
                            pos = 0
                        continue
            data = await r.read(1 << 20)
            if not data:
                raise BadResponse("connection closed mid-body")
            t_read = time.perf_counter()
            buf += data


def check(n_bytes: int, tail: bytes, expect_bytes: int | None) -> None:
    """expect_bytes 0: any length (a gateway that rewrites the stream), still ending in [DONE]."""
    if expect_bytes and n_bytes != expect_bytes:
        raise BadResponse(f"body of {n_bytes} bytes, expected {expect_bytes}")
    if expect_bytes is not None and not tail.endswith(b"data: [DONE]\n\n"):
        raise BadResponse(f"body does not end with [DONE]: {tail!r}")


def path_of(spec: dict, name: str) -> str:
    return spec.get("paths", {}).get(name, spec["path"])


def expect_of(spec: dict, name: str) -> int | None:
    return spec.get("expects", {}).get(name, spec.get("expect_bytes"))


async def sequential(spec: dict) -> dict:
    """Concurrency 1, the targets interleaved: ABBA order so drift hits both alike."""
    names = list(spec["targets"])
    conns = {n: await Conn("127.0.0.1", spec["targets"][n]).open() for n in names}
    out = {n: {"ttfb": [], "total": []} for n in names}
    for i in range(spec["warmup"] + spec["requests"]):
        order = names if i % 2 == 0 else names[::-1]
        for n in order:
            ttfb, total, nb, tail = await asyncio.wait_for(conns[n].request(path_of(spec, n)),
                                                           spec.get("timeout", 30))
            check(nb, tail, expect_of(spec, n))
            if i >= spec["warmup"]:
                out[n]["ttfb"].append(ttfb)
                out[n]["total"].append(total)
    for c in conns.values():
        c.close()
    return out


async def load(spec: dict) -> dict:
    """`concurrency` workers for `seconds` per round per target; rounds alternate targets."""
    names = list(spec["targets"])
    conc, secs = spec["concurrency"], spec["round_seconds"]
    out = {n: {"ttfb": [], "total": [], "requests": 0, "bytes": 0, "elapsed": 0.0, "errors": 0,
               "all_requests": 0} for n in names}

    async def worker(conn: Conn, deadline: float, res: dict, name: str) -> None:
        path, expect = path_of(spec, name), expect_of(spec, name)
        while time.perf_counter() < deadline:
            try:
                ttfb, total, nb, tail = await asyncio.wait_for(conn.request(path), spec.get("timeout", 30))
                check(nb, tail, expect)
            except (BadResponse, OSError, asyncio.TimeoutError):
                res["errors"] += 1
                conn.close()
                conn.w = None
                continue
            res["ttfb"].append(ttfb)
            res["total"].append(total)
            res["requests"] += 1
            res["bytes"] += nb
            out[name]["all_requests"] += 1

    for rnd in range(spec["warmup_rounds"] + spec["rounds"]):
        order = names if rnd % 2 == 0 else names[::-1]
        for n in order:
            conns = [await Conn("127.0.0.1", spec["targets"][n]).open() for _ in range(conc)]
            res = out[n] if rnd >= spec["warmup_rounds"] else {"ttfb": [], "total": [], "requests": 0,
                                                                "bytes": 0, "errors": 0}
            t0 = time.perf_counter()
            await asyncio.gather(*(worker(c, t0 + secs, res, n) for c in conns))
            if rnd >= spec["warmup_rounds"]:
                res["elapsed"] += time.perf_counter() - t0
            for c in conns:
                c.close()
            await settle(spec.get("settle_url"))
    return out


async def settle(health_url: str | None, limit: float = 60.0) -> None:
    """Before the next round: wait until tooltap's writer has stored every turn (its health
    says no backlog), so that no path's round pays for the storing of another's."""
    await asyncio.sleep(0.2)
    deadline = time.monotonic() + limit
    while health_url and time.monotonic() < deadline:
        if not await asyncio.to_thread(writer_backlog, health_url):
            return
        await asyncio.sleep(0.05)


async def one(spec: dict) -> dict:
    conn = await Conn("127.0.0.1", spec["port"]).open()
    ttfb, total, nb, tail = await asyncio.wait_for(conn.request(spec["path"]), spec.get("timeout", 120))
    conn.close()
    return {"ttfb": ttfb, "total": total, "bytes": nb}


def main() -> None:
    import uvloop

    spec = json.loads(sys.argv[1])
    fn = {"sequential": sequential, "load": load, "one": one}[spec["mode"]]
    t_cpu = time.process_time()
    result = uvloop.run(fn(spec))
    result["_client_cpu_s"] = time.process_time() - t_cpu
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
