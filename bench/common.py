"""Shared helpers for the benchmark scripts: ports, processes, /proc, statistics, output."""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RESULTS = BENCH / "results"


LENGTH_BANDS = ((0, 20), (90, 110), (180, 200))  # turn numbers compared as a session grows


def length_bands(turns: int) -> list[tuple[int, int]]:
    """LENGTH_BANDS that a session of `turns` turns reaches."""
    return [(lo, min(hi, turns)) for lo, hi in LENGTH_BANDS if lo < turns]


def py_spy() -> str:
    """py-spy: $PY_SPY, on the PATH, or beside this interpreter (a virtualenv not activated)."""
    beside = str(Path(sys.executable).parent)
    found = os.environ.get("PY_SPY") or shutil.which("py-spy") or shutil.which("py-spy", path=beside)
    if not found:
        sys.exit("py-spy not found: pip install py-spy (or set PY_SPY to its path)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process {proc.args!r} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port} after {timeout}s")


def tooltap_cmd() -> list[str]:
    """`tooltap` as installed beside this interpreter (a Python script, so the process we
    start is tooltap itself, not a shim), else `python -m proxy`."""
    script = Path(sys.executable).parent / "tooltap"
    if script.exists():
        return [sys.executable, str(script)]
    return [sys.executable, "-m", "proxy"]


def captured(body: bytes, chunks, path: str = "/chat/completions"):
    """One Chat Completions turn as the hot path captures it: `body` sent, the event
    stream's `chunks` answered. The TurnRecord the writer is handed."""
    from proxy import apis
    from proxy.capture import Capture, TurnRecord

    api = apis.by_name("openai.chat")
    cap = Capture(TurnRecord(started_at=time.time(), method="POST", path=path, upstream="http://upstream",
                             request_headers=[("content-type", "application/json"),
                                              ("authorization", "Bearer sk-bench")],
                             request_body=body, api=api.name), api)
    cap.response_started(200, [("content-type", "text/event-stream")], "text/event-stream")
    for chunk in chunks:
        cap.feed(chunk)
    return cap.finish()


def start_upstream(port: int, *args: str) -> subprocess.Popen:
    """bench/upstream.py, listening on `port`."""
    proc = subprocess.Popen([sys.executable, str(BENCH / "upstream.py"), "--port", str(port), *args],
                            stdout=subprocess.DEVNULL)
    try:
        wait_port(port, proc)
    except BaseException:
        proc.kill()
        raise
    return proc


def start_tooltap(upstream_url: str, db_path: Path, port: int, variant: list[str] | None = None) -> subprocess.Popen:
    """`tooltap serve` (or, with `variant` args, bench/variant.py) as a subprocess."""
    env = {**os.environ, "TOOLTAP_SHUTDOWN_GRACE": "3"}
    env.pop("TOOLTAP_UPSTREAM", None)
    env.pop("TOOLTAP_DB", None)
    cmd = [sys.executable, str(BENCH / "variant.py"), *variant] if variant else [*tooltap_cmd(), "serve"]
    proc = subprocess.Popen(
        [*cmd, "--upstream", upstream_url, "--db", f"sqlite:///{db_path}",
         "--port", str(port), "--log-level", "warning"],
        cwd=db_path.parent, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    wait_port(port, proc)
    return proc


def stop(proc: subprocess.Popen, sig: int = signal.SIGINT, timeout: float = 30.0) -> int:
    """Ask a process we started to stop (SIGINT: tooltap flushes its writer), then make sure."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return proc.returncode


def proc_status(pid: int, field: str) -> int:
    """A /proc/PID/status field in kB (VmRSS, VmHWM)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def reset_peak_rss(pid: int) -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False if not allowed."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """User + system CPU time of a process (or of one of its threads), from /proc's stat."""
    with open(f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def writer_backlog(health_url: str) -> int:
    """Turns tooltap's writer has not stored yet, from `/_tooltap/api/health` (0 when no
    writer runs: a variant that drops the turns)."""
    import urllib.request

    with urllib.request.urlopen(health_url, timeout=10) as r:
        return json.loads(r.read()).get("writer", {}).get("backlog", 0)


def writer_processes(pid: int) -> list[int]:
    """tooltap's writer processes: the children of `pid` that multiprocessing spawned
    (not its resource tracker), found by a scan of /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    spawned = b"spawn_main" in f.read()
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
            if parent == pid and spawned:
                found.append(int(entry))
    return found


def thread_cpu_seconds(pid: int) -> float:
    """CPU time of a process's threads to the nanosecond (/proc/PID/task/*/schedstat),
    where /proc/PID/stat counts 10 ms ticks; falls back to those. A thread that ended is
    not counted: for processes whose threads last as long as the measurement."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return cpu_seconds(pid)
    return total / 1e9


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * p
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def machine() -> dict:
    return {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "git": _git_head()}


def _git_head() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                              text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def write_results(name: str, data: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = RESULTS / f"{name}-{stamp}.json"
    path.write_text(json.dumps(data, indent=2))
    (RESULTS / f"{name}-latest.json").write_text(json.dumps(data, indent=2))
    return path


def table(rows: list[list], header: list[str]) -> str:
    cells = [[str(c) for c in header]] + [[c if isinstance(c, str) else f"{c}" for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    line = lambda r: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
    out = [line(cells[0]), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)
