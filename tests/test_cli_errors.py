"""A user's mistake or the machine's state gives one clear line and a non-zero exit,
never a traceback; read commands never create a database."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

CLI = [sys.executable, "-m", "proxy"]


def run(*args: str, cwd=None, code: str | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", code, *args] if code else [*CLI, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=cwd)


def assert_one_line_error(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode not in (0, None), r
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, r.stderr
    for needle in needles:
        assert needle in errors[0], (needle, r.stderr)
    assert "inspector at" not in r.stdout  # the banner only once the port and database are ready


@pytest.fixture
def busy_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_serve_on_a_busy_port_says_so_before_anything_else(tmp_path, busy_port):
    r = run("serve", "--upstream", "http://127.0.0.1:9", "--port", str(busy_port),
            "--db", str(tmp_path / "t.db"))
    assert_one_line_error(r, f"port {busy_port}", "already in use", "--port")
    assert not (tmp_path / "t.db").exists()


def test_the_port_suggested_instead_of_a_busy_one_is_free(tmp_path):
    held = []
    for base in range(20000, 30000, 7):  # two ports in a row, both taken
        pair = [socket.socket(), socket.socket()]
        try:
            for i, s in enumerate(pair):
                s.bind(("127.0.0.1", base + i))
                s.listen()
        except OSError:
            for s in pair:
                s.close()
            continue
        held = pair
        break
    try:
        r = run("serve", "--upstream", "http://127.0.0.1:9", "--port", str(base), "--db", str(tmp_path / "t.db"))
        assert_one_line_error(r, f"port {base}", "already in use")
        suggested = int(r.stderr.split("--port ")[-1].split()[0])
        assert suggested > base + 1
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", suggested))  # free, as said
    finally:
        for s in held:
            s.close()


def test_demo_picks_another_port_only_when_none_was_asked_for(busy_port):
    r = run("demo", "--port", str(busy_port))
    assert_one_line_error(r, f"port {busy_port}", "already in use")


@pytest.mark.parametrize("db, needle", [
    ("bogus://x", "unsupported database URL"),
    ("/nonexistent/dir/x.db", "folder /nonexistent/dir does not exist"),
    ("TEXTFILE", "not a SQLite database"),
    ("DIR", "it is a folder"),
])
def test_serve_with_a_database_it_cannot_use(tmp_path, db, needle):
    text = tmp_path / "notes.txt"
    text.write_text("hello\n" * 100)
    db = {"TEXTFILE": str(text), "DIR": str(tmp_path)}.get(db, db)
    r = run("serve", "--upstream", "http://127.0.0.1:9", "--db", db, "--port", "1")
    assert_one_line_error(r, needle)


def test_postgres_without_its_driver_says_what_to_install(tmp_path):
    # The dev extras install psycopg; hide it as a plain `pip install .` would lack it.
    code = ("import sys; sys.modules['psycopg'] = None; sys.argv[0] = 'tooltap'; "
            "from proxy.cli import main; main()")
    r = run("serve", "--upstream", "http://127.0.0.1:9", "--db", "postgresql://u:secret@127.0.0.1:1/x", code=code)
    assert_one_line_error(r, "pip install 'tooltap[postgres]'")
    assert "secret" not in r.stderr


@pytest.mark.parametrize("args, needle", [
    (["--upstream", "http://127.0.0.1:notaport"], "port is not a number"),
    (["--upstream", "_tooltap=http://127.0.0.1:9"], "reserved"),
    (["--upstream", "a=http://127.0.0.1:9", "--upstream", "a=http://127.0.0.1:10"], "more than one upstream"),
    (["--upstream", "http://127.0.0.1:9", "--port", "99999"], "99999"),
    (["--upstream", "http://127.0.0.1:9", "--read-timeout", "-5"], "--read-timeout"),
    (["--upstream", "http://127.0.0.1:9", "--spool", "/nonexistent/dir/spool.jsonl"], "does not exist"),
    (["--upstream", "http://127.0.0.1:9", "--otlp-endpoint", "nope"], "bad OTLP endpoint 'nope'"),
    (["--upstream", "http://bob:hunter2@127.0.0.1:9/v1"], "give http://127.0.0.1:9/v1 and let the agent"),
    (["--upstream", "http://127.0.0.1:9", "--connect-timeout", "0"], "--connect-timeout"),
    (["--upstream", "http://127.0.0.1:9", "--otlp-endpoint", "http://h:x/"], "bad OTLP endpoint"),
])
def test_serve_validates_its_options_at_start(tmp_path, args, needle):
    r = run("serve", *args, "--db", str(tmp_path / "t.db"))
    assert_one_line_error(r, needle)
    assert not (tmp_path / "t.db").exists()


@pytest.mark.parametrize("args", [
    ["schemas", "list"], ["redecode"], ["schemas", "show", "session:abc"],
    ["replay", "session", "abc", "--recorded"], ["replay", "tools", "abc"], ["export", "abc", "--pytest", "out"],
])
def test_read_commands_never_create_a_database(tmp_path, args):
    r = run(*args, cwd=tmp_path)
    assert_one_line_error(r, "no tooltap database")
    assert list(tmp_path.iterdir()) == []


def test_a_read_command_given_a_folder_says_so(tmp_path):
    r = run("stats", "--db", str(tmp_path), cwd=tmp_path)
    assert_one_line_error(r, "it is a folder")


def test_schemas_errors_on_odd_input(tmp_path):
    db = tmp_path / "t.db"
    from proxy.store.db import open_database

    open_database(str(db))
    r = run("schemas", "diff", "turn:99999999999999999999", "turn:1", "--db", str(db))
    assert_one_line_error(r, "not found")
    deep = tmp_path / "deep.json"
    deep.write_text('{"name": "t", "parameters": ' + '{"type": "object", "properties": {"a": ' * 5000
                    + "{}" + "}}" * 5000 + "}")
    r = run("schemas", "convert", "--to", "gemini", str(deep))
    assert_one_line_error(r)


@pytest.mark.parametrize("args, needles", [
    (["serve", "--uptream", "http://127.0.0.1:9"], ["'--uptream'", "Did you mean '--upstream'", "serve --help"]),
    (["serv"], ["'serv'", "Did you mean 'serve'", "proxy --help"]),
    (["replay", "session"], ["Missing argument", "replay session --help"]),
    (["prune", "--older-than", "3x"], ["'3x' is not an age", "prune --help"]),
])
def test_a_command_line_mistake_is_one_line_without_the_usage_above_it(args, needles):
    r = run(*args)
    assert r.returncode == 2
    assert_one_line_error(r, *needles)
    assert r.stderr.strip().count("\n") == 0, r.stderr  # click would print its usage and a hint first


def test_a_bare_group_shows_its_help_and_every_summary_whole():
    for group in ([], ["replay"], ["schemas"], ["otel"]):
        r = run(*group)
        assert r.returncode == 0 and r.stdout.startswith("Usage:") and not r.stderr, r  # click: stderr, exit 2
        listing = r.stdout.split("Commands:")[1]
        assert not [line for line in listing.splitlines() if line.endswith("...")], listing  # cut at 80 columns


def test_ctrl_c_exits_130_with_one_line(tmp_path):
    """Not click's "Aborted!" and 1, which for replay is the code of a turn that differs."""
    import os
    import signal
    import time

    fifo = tmp_path / "slow.har"
    os.mkfifo(fifo)  # the import waits at its open for a writer that never comes
    # As from a terminal: a shell without job control (CI's) starts background commands
    # with SIGINT ignored, and that is inherited.
    p = subprocess.Popen([*CLI, "import", str(fifo), "--db", f"sqlite:///{tmp_path}/t.db"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 30
    while True:  # until the import has the file open: the command itself is running
        try:
            writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError:  # ENXIO: no reader yet
            assert time.monotonic() < deadline and p.poll() is None
            time.sleep(0.05)
    try:  # held open, never written: the import waits for its bytes
        # Once it is blocked in its read: a signal that lands between the open and the read is
        # only seen by Python after the read returns (CPython checks for signals between
        # bytecodes and when a system call is interrupted), which here would be never.
        time.sleep(0.5)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    finally:
        os.close(writer)
    assert p.returncode == 130
    assert err.splitlines() == ["Interrupted (Ctrl-C): stopped before it finished; what it had already stored is kept."]
    assert "Aborted" not in out + err
