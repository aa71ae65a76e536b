"""Where tooltap's added time to first byte goes, stage by stage.

    python bench/breakdown.py [--requests 400] [--chunks 200] [--size 200]

One upstream (bench/upstream.py) and three proxies in front of it, each started by
bench/variant.py with `--stages`, which logs per request when it reached the app, when
the upstream request was sent and answered, and when the first body chunk was handed to
the server:

  raw       raw_proxy.py: asyncio protocols and httptools relaying bytes (a Python proxy's floor;
            time to first byte only, it logs no stages)
  bare      bare_proxy.py: uvicorn + tooltap's upstream client and nothing else (the layers' floor)
  no-store  tooltap with its turns dropped instead of journaled (no journal thread)
  tooltap   tooltap as it runs (journal thread, writer process)

A sequential client (raw asyncio, one keep-alive connection per target) interleaves
direct and the three, and notes when it sent each request and when the first body
chunk arrived. perf_counter is one clock for every process here, so the proxy's stage
times and the client's line up. Reports the mean of each stage, in ms (means add up to
the mean time to first byte; medians of the parts would not), and the TTFB median.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import BENCH, free_port, machine, median, stop, table, wait_port, write_results

PROXIES = {"bare": ["--bare"], "no-store": ["--sink", "drop"], "tooltap": []}
STAGES = [
    ("client sends -> proxy app called", "uvicorn reads and parses the request, starts the ASGI task"),
    ("app called -> upstream request starts", "the proxy reads the body and prepares (capture, redaction)"),
    ("upstream request -> its headers", "the client sends, the upstream answers, the client parses"),
    ("headers -> first chunk handed to uvicorn", "response start, first chunk read, captured"),
    ("first chunk handed over -> client has it", "uvicorn writes, the client reads"),
]


def request_bytes(body: bytes, path: str) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
            f"authorization: Bearer sk-bench-not-a-secret\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body


async def _read_chunk(reader) -> int:
    size = int((await reader.readline()).split(b";")[0], 16)
    await reader.readexactly(size + 2)
    return size


async def one(reader, writer, data: bytes) -> tuple[float, float]:
    """(sent, first body chunk received), perf_counter; the whole response is read."""
    sent = time.perf_counter()
    writer.write(data)
    await reader.readuntil(b"\r\n\r\n")
    await _read_chunk(reader)
    first = time.perf_counter()
    while await _read_chunk(reader):
        pass
    return sent, first


async def drive(ports: dict[str, int], path: str, requests: int, warmup: int) -> dict[str, list]:
    conns = {name: await asyncio.open_connection("127.0.0.1", port) for name, port in ports.items()}
    out: dict[str, list] = {name: [] for name in ports}
    for i in range(warmup + requests):
        order = list(ports) if i % 2 == 0 else list(reversed(ports))  # ABBA against drift
        for name in order:
            body = json.dumps({"model": "bench-model", "stream": True,
                               "messages": [{"role": "user", "content": f"breakdown {i} {name}"}]}).encode()
            sent, first = await one(*conns[name], request_bytes(body, path))
            if i >= warmup:
                out[name].append((sent, first))
    for _, writer in conns.values():
        writer.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--chunks", type=int, default=200)
    ap.add_argument("--size", type=int, default=200)
    a = ap.parse_args()
    import uvloop

    path = f"/v1/chat/completions?n={a.chunks}&size={a.size}"
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="tooltap-breakdown-") as tmp:
        try:
            up = free_port()
            procs.append(subprocess.Popen([sys.executable, str(BENCH / "upstream.py"), "--port", str(up)],
                                          stdout=subprocess.DEVNULL))
            wait_port(up, procs[-1])
            ports, logs = {"direct": up}, {}
            port = free_port()
            procs.append(subprocess.Popen([sys.executable, str(BENCH / "raw_proxy.py"), "--upstream",
                                           f"http://127.0.0.1:{up}", "--port", str(port)], stdout=subprocess.DEVNULL))
            wait_port(port, procs[-1])
            ports["raw"] = port
            for name, args in PROXIES.items():
                port, logs[name] = free_port(), Path(tmp) / f"{name}.stages"
                procs.append(subprocess.Popen(
                    [sys.executable, str(BENCH / "variant.py"), *args, "--stages", str(logs[name]),
                     "--upstream", f"http://127.0.0.1:{up}", "--db", f"sqlite:///{tmp}/{name}.db",
                     "--port", str(port)], cwd=tmp, stdout=subprocess.DEVNULL))
                wait_port(port, procs[-1], timeout=120)
                ports[name] = port
            seen = uvloop.run(drive(ports, path, a.requests, warmup=30))
        finally:
            for proc in reversed(procs):
                stop(proc)
        stages = {name: [json.loads(line) for line in logs[name].read_text().splitlines()][-a.requests:]
                  for name in PROXIES}

    ms = lambda xs: round(median(xs) * 1e3, 3)  # noqa: E731
    mean_ms = lambda xs: round(sum(xs) / len(xs) * 1e3, 3)  # noqa: E731
    ttfb = {name: [first - sent for sent, first in seen[name]] for name in ports}
    rows = [["time to first byte, median", *[ms(ttfb[n]) for n in ports]],
            ["time to first byte, mean", *[mean_ms(ttfb[n]) for n in ports]],
            ["added to direct, mean", "", *[round(mean_ms(ttfb[n]) - mean_ms(ttfb["direct"]), 3)
                                            for n in ports if n != "direct"]]]
    result = {"machine": machine(), "params": vars(a), "ttfb_ms": {n: {"median": ms(ttfb[n]), "mean": mean_ms(ttfb[n])}
                                                                   for n in ports}, "stages_ms": {}}
    for k, (label, _) in enumerate(STAGES):
        row = [label + ", mean", "", ""]
        for name in PROXIES:
            pairs = list(zip(seen[name], stages[name]))
            if k == 0:
                values = [s[0] - c[0] for c, s in pairs]
            elif k == len(STAGES) - 1:
                values = [c[1] - s[4] for c, s in pairs]
            else:
                values = [s[k] - s[k - 1] for _, s in pairs]
            result["stages_ms"].setdefault(name, {})[label] = {"mean": mean_ms(values), "median": ms(values)}
            row.append(mean_ms(values))
        rows.append(row)
    print(table(rows, ["ms", *ports]))
    print()
    for label, what in STAGES:
        print(f"  {label}: {what}")
    print(f"\nresults: {write_results('breakdown', result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
