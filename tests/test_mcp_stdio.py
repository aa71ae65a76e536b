"""`tooltap mcp`: a real MCP server (the official SDK) wrapped, driven by the SDK's own
stdio client and by raw bytes; what passes is exact, what is recorded is complete."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
import time

import httpx
import pytest

from tests.mcp_support import (
    INITIALIZE, INITIALIZED, TASK_PROGRESS, WASHINGTON, WEATHER, Driven, jsonrpc, recorded, sdk_conversation,
    env, with_db, wrapped,
)

from proxy.mcp import read
from proxy.store.db import DatabaseUnavailable, open_database


def test_sdk_client_through_the_wrapper(tmp_path):
    db = f"sqlite:///{tmp_path / 'tooltap.db'}"

    async def body(session):
        tools = await session.list_tools()
        result = await session.call_tool("get_forecast", {**WASHINGTON, "task_progress": TASK_PROGRESS})
        return tools, result

    tools, result = sdk_conversation(wrapped(db, *WEATHER), body)
    forecast = tools.tools[[t.name for t in tools.tools].index("get_forecast")]
    assert forecast.input_schema["additionalProperties"] is False
    assert result.is_error is False and result.content[0].text.startswith("\nToday:\nTemperature: 68°F")

    # Made by the wrapper: its owner's alone (SQLite gives its WAL the same mode).
    assert stat.S_IMODE(os.stat(tmp_path / "tooltap.db").st_mode) == 0o600
    msgs = recorded(db)
    # Named by the server's own answer to initialize; every message, in order, with its direction.
    assert {m["server"] for m in msgs} == {"weather"}
    assert [(m["direction"], m["kind"], m["method"]) for m in msgs] == [
        ("to_server", "request", "initialize"), ("from_server", "response", "initialize"),
        ("to_server", "notification", "notifications/initialized"),
        ("to_server", "request", "tools/list"), ("from_server", "response", "tools/list"),
        ("to_server", "request", "tools/call"), ("from_server", "response", "tools/call"),
    ]
    call = msgs[5]
    assert call["tool"] == "get_forecast"
    assert call["json"]["params"]["arguments"]["task_progress"] == TASK_PROGRESS  # the server got it
    assert json.loads(call["raw"]) == call["json"]
    assert msgs[6]["jsonrpc_id"] == call["jsonrpc_id"] and msgs[6]["is_error"] is False
    assert all(a["at"] <= b["at"] for a, b in zip(msgs, msgs[1:]))

    def check(db_):
        sets = read.tool_sets(db_, "weather")
        assert len(sets) == 1 and {t["name"] for t in sets[0]["tools"]} >= {"get_forecast", "get_alerts"}
        (conn,) = read.connections(db_, "weather")
        assert conn["exit_code"] == 0 and conn["transport"] == "stdio" and "mcp_weather_server.py" in conn["command"]
        (server,) = read.servers(db_)
        assert server == {**server, "name": "weather", "messages": 7, "calls": 1, "errors": 0}
        (mc,) = read.calls(db_, server="weather")
        assert mc.undeclared == ["task_progress"] and mc.latency_ms > 0
        assert mc.result_text == result.content[0].text
    with_db(db, check)


def _conversation(argv) -> tuple[bytes, int, bytes]:
    """One request at a time, each answer awaited, so the output is deterministic; the
    last call crashes the server."""
    d = Driven(argv)
    steps = [
        (jsonrpc(INITIALIZE), 1),
        (jsonrpc(INITIALIZED), 0),
        # a line split across writes, CRLF, key order and spacing as an agent might send them
        (b'{"id": 2, "jsonrpc":"2.0",', None),
        (b' "method": "tools/list"}\r\n', 2),
        (jsonrpc({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                  "params": {"name": "get_forecast", "arguments": {**WASHINGTON, "task_progress": TASK_PROGRESS}}}), 3),
        (jsonrpc({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
                  "params": {"name": "get_radar", "arguments": {"megabytes": 5}}}), 4),
        (b"this line is not JSON\n", None),
        (jsonrpc({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "crash", "arguments": {}}}), None),
    ]
    for data, lines in steps:
        if lines is None:
            d.send(data)
            time.sleep(0.05)
        else:
            d.send(data)
            if lines:
                d.wait_for(lines)
    code = d.proc.wait(60)
    d.finish()
    return bytes(d.out), code, bytes(d.err)


def test_byte_exact_against_an_unwrapped_run_and_the_crash_exit_code(tmp_path, make_tooltap):
    db = f"sqlite:///{tmp_path / 'tooltap.db'}"
    direct_out, direct_code, direct_err = _conversation(WEATHER)
    out, code, err = _conversation(wrapped(db, *WEATHER))

    assert direct_code == 3 and code == 3  # the server's exit code, passed on
    assert out == direct_out  # every byte the server wrote, as an unwrapped run gets it
    assert len(out) > 5 << 20  # the 5 MB result went through whole
    assert b"crashing on purpose" in direct_err and err == direct_err  # stderr as well

    msgs = recorded(db)
    to_server = [m for m in msgs if m["direction"] == "to_server"]
    assert [m["raw"] for m in to_server] == [
        jsonrpc(INITIALIZE)[:-1].decode(), jsonrpc(INITIALIZED)[:-1].decode(),
        '{"id": 2, "jsonrpc":"2.0", "method": "tools/list"}\r',  # one message, though written in two
        jsonrpc({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                 "params": {"name": "get_forecast", "arguments": {**WASHINGTON, "task_progress": TASK_PROGRESS}}})[:-1].decode(),
        jsonrpc({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
                 "params": {"name": "get_radar", "arguments": {"megabytes": 5}}})[:-1].decode(),
        "this line is not JSON",
        jsonrpc({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "crash", "arguments": {}}})[:-1].decode(),
    ]
    garbage = to_server[5]
    assert garbage["kind"] == "invalid" and garbage["note"] == "not JSON" and garbage["json"] is None
    from_server = [m for m in msgs if m["direction"] == "from_server"]
    assert "".join(m["raw"] + "\n" for m in from_server).encode() == out  # the server's lines, exactly
    radar = next(m for m in from_server if m["jsonrpc_id"] == 4)
    assert radar["size"] > 5 << 20 and radar["method"] == "tools/call"

    def check(db_):
        (conn,) = read.connections(db_, "weather")
        assert conn["exit_code"] == 3 and "crashing on purpose" in conn["stderr_tail"]
        calls = {c.tool: c for c in read.calls(db_, server="weather")}
        # the call the server died on says so; answered ones say nothing of the kind
        assert calls["crash"].unanswered == "the server exited with code 3 before answering"
        assert calls["crash"].to_json()["unanswered"] == calls["crash"].unanswered
        assert calls["get_forecast"].unanswered is None and calls["get_forecast"].result_message_id
    with_db(db, check)
    assert (read.exit_words(3), read.exit_words(-9), read.exit_words(None)) == ("3", "killed (SIGKILL)", None)
    page = httpx.get(f"{make_tooltap(db_url=db).url}/_tooltap/mcp/weather").text
    assert page.count('data-testid="unanswered">the server exited with code 3 before answering<') == 1


CAT = [sys.executable, "-c", "import os\nwhile d := os.read(0, 65536): os.write(1, d)"]


def test_echo_is_exact_for_any_bytes_and_splits(tmp_path):
    """Whatever the agent writes, split anywhere (inside a UTF-8 character, between CR
    and LF), comes back unchanged through a server that echoes it; each line is one
    message, a batch is kept as one, and a last line without a newline is kept too."""
    db = f"sqlite:///{tmp_path / 'tooltap.db'}"
    lines = [
        jsonrpc({"jsonrpc": "2.0", "id": "a", "method": "ping"}),
        jsonrpc({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                 "params": {"name": "say", "arguments": {"text": "華盛頓\u2028line sep ☃"}}}),
        b'[{"jsonrpc":"2.0","id":8,"method":"ping"},{"jsonrpc":"2.0","method":"notifications/x"}]\r\n',
        b"\xff\xfe not utf-8 at all\n",
        b'{"jsonrpc":"2.0","id":9,"result":{}}',  # no newline: the stream ends here
    ]
    data = b"".join(lines)
    d = Driven(wrapped(db, *CAT, name="echo"))
    for cut in range(0, len(data), 13):  # 13-byte writes: splits fall everywhere
        d.send(data[cut:cut + 13])
    assert d.finish() == 0
    assert bytes(d.out) == data

    msgs = recorded(db, "echo")
    sent = [m for m in msgs if m["direction"] == "to_server"]
    back = [m for m in msgs if m["direction"] == "from_server"]
    assert len(sent) == len(back) == 5
    assert [m["kind"] for m in sent] == ["request", "request", "batch", "invalid", "response"]
    assert sent[1]["json"]["params"]["arguments"]["text"] == "華盛頓\u2028line sep ☃"
    assert len(sent[2]["json"]) == 2
    assert sent[4]["note"] == "no newline at the end of the stream"
    assert [m["size"] for m in sent] == [len(line.rstrip(b"\n")) for line in lines]


def test_signals_go_to_the_server_and_its_end_is_ours(tmp_path):
    db = f"sqlite:///{tmp_path / 'tooltap.db'}"
    handles = ("import signal, sys, time\n"
               "def bye(n, f):\n    sys.stderr.write(f'got {n}\\n'); sys.stderr.flush(); sys.exit(7)\n"
               "signal.signal(signal.SIGTERM, bye)\nprint('ready', flush=True)\ntime.sleep(60)\n")
    d = Driven(wrapped(db, sys.executable, "-c", handles, name="sig"))
    d.wait_for(1)
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(30) == 7  # the server handled it and chose its exit code
    d.finish()
    assert b"got 15" in d.err

    d = Driven(wrapped(db, sys.executable, "-c", "print('ready', flush=True)\nimport time; time.sleep(60)", name="sig"))
    d.wait_for(1)
    d.proc.send_signal(signal.SIGINT)  # Python dies of an unhandled KeyboardInterrupt by SIGINT itself
    assert d.proc.wait(30) == -signal.SIGINT
    d.finish()

    d = Driven(wrapped(db, sys.executable, "-c", "import os, signal\nprint('ready', flush=True)\n"
                       "signal.signal(signal.SIGTERM, signal.SIG_DFL)\nimport time; time.sleep(60)", name="sig"))
    d.wait_for(1)
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(30) == -signal.SIGTERM  # killed by it: so is the wrapper
    d.finish()
    codes = with_db(db, lambda db_: sorted(c["exit_code"] for c in read.connections(db_, "sig")))
    assert codes == [-15, -2, 7]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_server_that_ignores_sigterm_dies_with_a_killed_wrapper(tmp_path):
    """The SDK's shutdown: SIGTERM, then SIGKILL for a wrapper whose server did not exit.
    The server must not outlive it (it runs in a process group of its own)."""
    db = f"sqlite:///{tmp_path / 'tooltap.db'}"
    stubborn = ("import os, signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "print(os.getpid(), flush=True)\ntime.sleep(60)\n")
    d = Driven(wrapped(db, sys.executable, "-c", stubborn, name="stubborn"))
    server = int(d.wait_for(1).split()[0])
    d.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    os.kill(server, 0)  # still there: it ignores SIGTERM
    d.proc.kill()
    d.proc.wait(30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(server, 0)
        except ProcessLookupError:
            break
        try:  # reaped by init once it is gone; a zombie still answers kill(0)
            with open(f"/proc/{server}/stat") as f:
                if f.read().split(") ")[1].startswith("Z"):
                    break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        os.kill(server, signal.SIGKILL)
        raise AssertionError("the server outlived its killed wrapper")


def test_a_signal_while_the_wrapper_is_still_starting_goes_to_the_server():
    """Between starting the server and settling down to wait for it, the wrapper opens
    its database (seconds on a busy machine): a signal then must reach the server too,
    not kill the wrapper alone and leave the server running."""
    script = ("import os, signal, sys\n"
              "from proxy.mcp.relay import Relay\n"
              "relay = Relay([sys.executable, '-c', 'import time; time.sleep(30)'], lambda *a: None,\n"
              "              stdin=os.open(os.devnull, os.O_RDONLY))\n"
              "relay.start()\n"
              "os.kill(os.getpid(), signal.SIGTERM)  # before wait()\n"
              "print(relay.wait(), flush=True)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=20, env=env())
    assert done.returncode == 0 and done.stdout.strip() == b"-15", (done.returncode, done.stderr[-500:])


def test_a_command_that_does_not_exist(tmp_path):
    d = Driven(wrapped(f"sqlite:///{tmp_path / 'tooltap.db'}", "no-such-mcp-server-here"))
    assert d.finish() == 127
    assert d.err.decode().strip().splitlines() == ["tooltap mcp: cannot run 'no-such-mcp-server-here': command not found"]
    d = Driven(wrapped(f"sqlite:///{tmp_path / 'missing' / 'tooltap.db'}", *CAT))
    assert d.finish() == 2
    assert "does not exist" in d.err.decode() and "Traceback" not in d.err.decode()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_database_unreachable_spools_and_a_later_run_stores_it(tmp_path):
    spool = tmp_path / "spool"
    down = f"postgresql+psycopg://tooltap:x@127.0.0.1:{_closed_port()}/tooltap"
    data = jsonrpc({"jsonrpc": "2.0", "id": 1, "method": "ping"}) + b"garbage\n"
    d = Driven(wrapped(down, *CAT, name="echo", spool=str(spool)))
    d.send(data)
    assert d.finish() == 0
    assert bytes(d.out) == data  # the conversation never noticed
    _said_once(d.err.decode().splitlines(), "cannot open the database postgresql+psycopg://tooltap:***@", spool)
    assert len(list(spool.iterdir())) == 1 and _spooled(spool) == 4

    # The database is back (here: another one): the next wrapper adopts what waited.
    db = f"sqlite:///{tmp_path / 'tooltap.db'}"
    d = Driven(wrapped(db, *CAT, name="echo2", spool=str(spool)))
    assert d.finish() == 0
    assert not list(spool.glob("*.jsonl")) and not list(spool.glob("*.replaying"))
    msgs = recorded(db, "echo")
    for direction in ("to_server", "from_server"):
        assert [m["kind"] for m in msgs if m["direction"] == direction] == ["request", "invalid"]


def test_a_read_only_folder_spools_to_the_cache_and_a_later_run_stores_it(tmp_path):
    """--db in a folder that cannot be written (a read-only mount; root ignores modes):
    the spool beside it cannot be either, so the messages wait in the user's cache folder
    for that database, where the next recorder finds them. (They were lost, the log
    saying they were being spooled.)"""
    ro, cache = tmp_path / "ro", tmp_path / "cache"
    ro.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], capture_output=True)
    assert mounted.returncode == 0, f"this test mounts a read-only tmpfs (root needed): {mounted.stderr!r}"
    try:
        db = f"sqlite:///{ro / 'tooltap.db'}"
        data = jsonrpc({"jsonrpc": "2.0", "id": 1, "method": "ping"})
        d = Driven(wrapped(db, *CAT, name="echo"), env={"XDG_CACHE_HOME": str(cache)})
        d.send(data)
        assert d.finish() == 0 and bytes(d.out) == data
        err = d.err.decode()
        assert "LOST" not in err and "spooling to " + str(cache / "tooltap") in err, err
        (folder,) = (cache / "tooltap").iterdir()
        assert _spooled(folder) == 2
        subprocess.run(["mount", "-o", "remount,rw", str(ro)], check=True)
        assert Driven(wrapped(db, *CAT, name="drain"), env={"XDG_CACHE_HOME": str(cache)}).finish() == 0
        assert not list(folder.iterdir())
        assert [m["direction"] for m in recorded(db, "echo")] == ["to_server", "from_server"]  # (cat echoes)
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=True)


def _said_once(lines: list[str], problem: str, spool) -> None:
    """The wrapper's own stderr lines: the problem named on one of them, when a write
    first fails (or at the exit, when that is the first); at the exit, where the messages wait."""
    assert 1 <= len(lines) <= 2 and all(line.startswith("tooltap mcp: ") for line in lines), lines  # no traceback
    assert sum(problem in line for line in lines) == 1, lines
    assert f"wait in {spool}" in lines[-1]


def _spooled(spool) -> int:
    """How many messages wait in the spool; none set aside as refused for good (`.failed`)."""
    files = list(spool.iterdir())
    assert files and not [f.name for f in files if f.name.endswith(".failed")], files
    return sum(f.read_text().count('"op": "msg"') for f in files)


def test_a_file_that_is_not_a_database_is_said_once_and_its_messages_wait(tmp_path):
    """--db names a file that is not SQLite: the agent still gets its tools, byte for
    byte; stderr says so once, in `serve`'s words, with no traceback; every message waits
    in the spool (the database is unusable: no record is refused) and is stored by the
    next wrapper once the file is a database."""
    path = tmp_path / "tooltap.db"
    path.write_bytes(b"junk\n")
    db = f"sqlite:///{path}"
    spool = tmp_path / "tooltap.db.mcp-spool"
    with pytest.raises(DatabaseUnavailable) as serve_says:
        open_database(db)
    assert "not a SQLite database" in str(serve_says.value)

    direct_out, direct_code, direct_err = _conversation(WEATHER)
    out, code, err = _conversation(wrapped(db, *WEATHER))
    assert (code, out) == (direct_code, direct_out)
    assert b"Traceback" not in err and direct_err in err  # the server's stderr passed, whole
    _said_once(err.replace(direct_err, b"").decode().splitlines(), str(serve_says.value), spool)
    assert path.read_bytes() == b"junk\n"
    assert _spooled(spool) == 11  # 7 to the server, 4 answers

    path.unlink()
    open_database(db).dispose()  # a real database in its place
    assert Driven(wrapped(db, *CAT, name="drain")).finish() == 0
    assert not list(spool.iterdir())
    msgs = recorded(db, "weather")
    assert [m["direction"] for m in msgs].count("to_server") == 7
    assert "".join(m["raw"] + "\n" for m in msgs if m["direction"] == "from_server").encode() == out
    (conn,) = with_db(db, lambda db_: read.connections(db_, "weather"))
    assert conn["exit_code"] == 3


# `python -m proxy` as run where the Postgres driver is not installed.
WITHOUT_PSYCOPG = [sys.executable, "-c", "import runpy, sys; sys.modules['psycopg'] = None; "
                   "runpy.run_module('proxy', run_name='__main__', alter_sys=True)"]


def test_postgres_without_its_driver_says_what_to_install_and_spools(tmp_path):
    spool = tmp_path / "spool"
    argv = wrapped(f"postgresql+psycopg://tooltap:x@127.0.0.1:{_closed_port()}/tooltap", *CAT,
                   name="echo", spool=str(spool))
    assert argv[:3] == [sys.executable, "-m", "proxy"]
    data = jsonrpc({"jsonrpc": "2.0", "id": 1, "method": "ping"}) + b"garbage\n"
    d = Driven(WITHOUT_PSYCOPG + argv[3:])
    d.send(data)
    assert d.finish() == 0
    assert bytes(d.out) == data
    _said_once(d.err.decode().splitlines(), "Postgres needs its driver: pip install 'psycopg[binary]'", spool)
    assert _spooled(spool) == 4


def test_a_locked_database_never_slows_the_relay(tmp_path):
    """SQLite locked by another writer for the whole run: answers come back at once, the
    messages wait in the spool and reach the database when it is free."""
    path = tmp_path / "tooltap.db"
    db = f"sqlite:///{path}"
    Driven(wrapped(db, *CAT, name="warmup")).finish()  # create and migrate
    lock = sqlite3.connect(path, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    d = Driven(wrapped(db, *CAT, name="locked"))
    times = []
    for i in range(20):
        t0 = time.perf_counter()
        d.send(jsonrpc({"jsonrpc": "2.0", "id": i, "method": "ping"}))
        d.wait_for(i + 1)
        times.append(time.perf_counter() - t0)
    assert sorted(times)[10] < 0.25  # median round trip: not held up by the 2 s busy wait
    lock.execute("ROLLBACK")
    lock.close()
    assert d.finish() == 0
    stored = recorded(db, "locked")
    spooled = list((tmp_path / "tooltap.db.mcp-spool").glob("*.jsonl"))
    if len(stored) < 40:  # what the lock kept out waits for the next recorder
        assert spooled
        Driven(wrapped(db, *CAT, name="warmup")).finish()
        stored = recorded(db, "locked")
    assert len(stored) == 40
    assert [m["jsonrpc_id"] for m in stored if m["direction"] == "to_server"] == list(range(20))


def _stderr_says(d: Driven, text: bytes, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in d.err:
        assert time.monotonic() < deadline, f"stderr never said {text!r}: {bytes(d.err)[-1000:]!r}"
        time.sleep(0.02)


@pytest.mark.parametrize("ending", ["agent closes stdin", "server exits after a failed write"])
def test_a_locked_database_does_not_hold_the_exit_up(tmp_path, ending):
    """The agent waits on the wrapper's exit. With SQLite locked by another program all
    along, the wrapper ends within a moment of its server (whether the lock holds up a
    write at that moment or already kept one out), leaving what the lock kept out in the
    spool; the next wrapper stores all of it once the lock is gone."""
    path = tmp_path / "tooltap.db"
    db = f"sqlite:///{path}"
    spool = tmp_path / "tooltap.db.mcp-spool"
    stamp = tmp_path / "server-exit"
    # The server's exit time, taken by the shell that runs it (`date`: a millisecond, not a Python start).
    server = ["sh", "-c", f'"$@"; code=$?; date +%s.%N > {shlex.quote(str(stamp))}; exit $code', "sh", *WEATHER]
    Driven(wrapped(db, *CAT, name="warmup")).finish()  # create and migrate
    lock = sqlite3.connect(path, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        d = Driven(wrapped(db, *server))
        d.send(jsonrpc(INITIALIZE))
        d.wait_for(1)
        d.send(jsonrpc(INITIALIZED) + jsonrpc({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
        d.wait_for(2)
        d.send(jsonrpc({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                        "params": {"name": "get_forecast", "arguments": WASHINGTON}}))
        d.wait_for(3)
        if ending == "agent closes stdin":  # early: the recorder's first write is still waiting on the lock
            d.proc.stdin.close()
        else:  # once a write gave up on the lock; the agent's side stays open
            _stderr_says(d, b"recording to")
            d.send(jsonrpc({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
                            "params": {"name": "crash", "arguments": {}}}))
        code = d.proc.wait(30)
        exited = time.time()
        d.finish()
        assert exited - float(stamp.read_text()) < 1.0  # was 2 to 4.5 s: busy waits after the server was gone
        assert not recorded(db, "weather")  # read through the lock (WAL): nothing stored yet
    finally:
        lock.execute("ROLLBACK")
        lock.close()

    assert code == (0 if ending == "agent closes stdin" else 3)
    out = bytes(d.out)
    assert [json.loads(line)["id"] for line in out.splitlines()] == [1, 2, 3]  # the server's answers, nothing of ours
    err = d.err.decode()
    assert f"wait in {spool}" in err.splitlines()[-1]  # said at the end, on stderr
    assert list(spool.iterdir())  # kept, not lost

    assert Driven(wrapped(db, *CAT, name="drain")).finish() == 0  # the next wrapper stores what waited
    assert not list(spool.iterdir())
    msgs = recorded(db, "weather")
    expected = [("to_server", "initialize"), ("from_server", "initialize"),
                ("to_server", "notifications/initialized"), ("to_server", "tools/list"),
                ("from_server", "tools/list"), ("to_server", "tools/call"), ("from_server", "tools/call")]
    if ending != "agent closes stdin":
        expected.append(("to_server", "tools/call"))  # the crash: no answer
    assert [(m["direction"], m["method"]) for m in msgs] == expected
    assert "".join(m["raw"] + "\n" for m in msgs if m["direction"] == "from_server").encode() == out
    (conn,) = with_db(db, lambda db_: read.connections(db_, "weather"))
    assert conn["exit_code"] == code


def test_two_wrappers_share_one_database(tmp_path):
    db = f"sqlite:///{tmp_path / 'tooltap.db'}"
    Driven(wrapped(db, *CAT, name="warmup")).finish()
    a, b = Driven(wrapped(db, *CAT, name="a")), Driven(wrapped(db, *CAT, name="b"))
    for i in range(200):
        a.send(jsonrpc({"jsonrpc": "2.0", "id": i, "method": "ping"}))
        b.send(jsonrpc({"jsonrpc": "2.0", "id": i, "method": "ping"}))
    assert a.finish() == 0 and b.finish() == 0
    for name in ("a", "b"):
        got = recorded(db, name)
        assert len(got) == 400
        assert [m["jsonrpc_id"] for m in got if m["direction"] == "to_server"] == list(range(200))
    assert os.path.exists(tmp_path / "tooltap.db")


def _backends():
    from tests.conftest import postgres_url

    return ["sqlite"] + (["postgres"] if postgres_url() else [])


@pytest.mark.parametrize("backend", _backends())
def test_tool_sets_are_stored_once_per_change(tmp_path, backend):
    """Each distinct tools/list answer is one tool set, seen as often as it came; on
    SQLite and on Postgres."""
    if backend == "postgres":
        from sqlalchemy import create_engine, text

        from tests.conftest import postgres_url

        db = postgres_url()
        with create_engine(db).begin() as conn:  # a clean schema for this run
            conn.execute(text("DROP SCHEMA public CASCADE; CREATE SCHEMA public"))
    else:
        db = f"sqlite:///{tmp_path / 'tooltap.db'}"
    one = [{"name": "a", "inputSchema": {"type": "object"}}]
    two = one + [{"name": "b", "inputSchema": {"type": "object", "properties": {"x": {"type": "string"}}}}]
    lines = b""
    for i, tools in enumerate([one, one, two], start=1):  # the echo answers every request with itself
        lines += jsonrpc({"jsonrpc": "2.0", "id": i, "method": "tools/list"})
        lines += jsonrpc({"jsonrpc": "2.0", "id": i, "result": {"tools": tools}})
    d = Driven(wrapped(db, *CAT, name="lister"))
    d.send(lines)
    assert d.finish() == 0 and bytes(d.out) == lines
    sets = with_db(db, lambda db_: read.tool_sets(db_, "lister"))
    assert [(s["tool_count"], s["seen"]) for s in sets] == [(1, 2), (2, 1)]
    assert sets[1]["tools"] == two


def test_help_names_the_environment_the_wrapper_honours(tmp_path):
    """`tooltap mcp --help` names TOOLTAP_DB and TOOLTAP_MCP_SPOOL, and the wrapper, given
    neither option, records where they say."""
    from click.testing import CliRunner

    from proxy.cli import main

    shown = " ".join(CliRunner().invoke(main, ["mcp", "--help"]).output.split())
    assert "[env var: TOOLTAP_DB;" in shown and "[env var: TOOLTAP_MCP_SPOOL]" in shown
    spool, data = tmp_path / "spool", jsonrpc({"jsonrpc": "2.0", "id": 1, "method": "ping"})
    down = f"postgresql+psycopg://tooltap:x@127.0.0.1:{_closed_port()}/tooltap"
    argv = [sys.executable, "-m", "proxy", "mcp", "--name", "echo", "--", *CAT]
    d = Driven(argv, env={"TOOLTAP_DB": down, "TOOLTAP_MCP_SPOOL": str(spool)})
    d.send(data)
    assert d.finish() == 0 and bytes(d.out) == data
    assert _spooled(spool) == 2  # the database the variable named is down: the spool it named holds them
    db = f"sqlite:///{tmp_path / 'tooltap.db'}"
    d = Driven(argv, env={"TOOLTAP_DB": db, "TOOLTAP_MCP_SPOOL": str(spool)})
    assert d.finish() == 0
    assert [m["method"] for m in recorded(db, "echo")] == ["ping", "ping"]  # the spool adopted into that database


def test_a_name_made_from_the_command_holds_no_key():
    """A server that never names itself is named from its command; a key written in it
    is a fingerprint there too, as in the stored command."""
    from proxy.mcp.cli import fallback_name
    from proxy.secrets import fingerprint

    token = "ghp_" + "abcdefghij" * 4
    assert fallback_name(["bash", "-c", f"GITHUB_TOKEN={token} true"]) == f"GITHUB_TOKEN={fingerprint(token)} true"
    assert fallback_name(["bash", "-c", "API_KEY=plain-value-1 node x.js"]).startswith(
        f"API_KEY={fingerprint('plain-value-1')} node")
    assert fallback_name(["sh", "-c", f"run --with {token}"]) == f"run --with {fingerprint(token)}"
    assert fallback_name(["npx", "-y", "@modelcontextprotocol/server-everything"]) == "server-everything"


def test_a_call_the_client_cancelled_is_not_blamed_on_the_server(tmp_path):
    """By the spec a server does not answer a call its client cancelled: that call says so,
    the call the server died on says that, and neither is claimed past the window read."""
    from proxy.mcp.store import Connection, Recorder

    db = f"sqlite:///{tmp_path / 'tooltap.db'}"
    open_database(db).dispose()
    recorder = Recorder(db, tmp_path / "spool")
    recorder.start()
    run, at = Connection("run-cancel", "stdio", name="slow", started_at=time.time() - 10), time.time() - 10
    for n, message in enumerate([
            {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "wait", "arguments": {"s": 60}}},
            {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "crunch", "arguments": {}}},
            {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1, "reason": "user"}}]):
        recorder.record(run, "to_server", json.dumps(message).encode(), at=at + n)
    recorder.ended(run, -signal.SIGTERM)
    recorder.close()

    def check(db_):
        calls = {c.tool: c for c in read.calls(db_, server="slow")}
        assert calls["wait"].unanswered == "cancelled by the client"
        assert calls["crunch"].unanswered == "the server was killed (SIGTERM) before answering"
        # read up to a moment before the run ended: an answer could still have come after it
        assert read.calls(db_, server="slow", until=at + 5)[1].unanswered is None
    with_db(db, check)
