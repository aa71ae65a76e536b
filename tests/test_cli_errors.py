"""A user's mistake or the machine's state gives one clear line and a non-zero exit,
never a traceback; read commands never create a database, nor make one tooltap's."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys

import pytest

from tests.conftest import free_port, in_schema, postgres_schema

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
    assert_one_line_error(r, "pip install 'psycopg[binary]' (or '.[postgres]' in tooltap's folder)")
    assert "secret" not in r.stderr


def test_a_database_url_is_shown_without_its_password_and_with_nothing_added():
    from proxy.store.db import shown_url

    assert shown_url("postgresql+psycopg://u:s3cret@db:5432/x") == "postgresql+psycopg://u:***@db:5432/x"
    # a login without a password (peer, .pgpass) is shown as it is: copied, it still works
    assert shown_url("postgresql+psycopg://tooltap@db/x") == "postgresql+psycopg://tooltap@db/x"


@pytest.mark.parametrize("args, needle", [
    (["--upstream", "http://127.0.0.1:notaport"], "port is not a number"),
    (["--upstream", "_tooltap=http://127.0.0.1:9"], "as tooltap's own paths do (/_tooltap, /_mcp)"),
    (["--upstream", "_mcp=http://127.0.0.1:9"], "as tooltap's own paths do (/_tooltap, /_mcp)"),
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


# Commands that read the store (and may migrate it forward), but must never create it.
READERS = [["stats"], ["schemas", "list"], ["prune", "--older-than", "30d", "--dry-run"], ["replay", "tools", "--all"]]


def files_in(folder) -> dict:
    """Each file's bytes and mtime: a change to one, or a -wal or -shm left beside it, shows."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.iterdir()}


def migrated_to(engine, revision: str) -> None:
    """The store as a tooltap of that migration made it."""
    from alembic import command

    from proxy.store.db import alembic_config

    with engine.begin() as conn:
        cfg = alembic_config(engine.url.render_as_string(hide_password=False))
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def revision_of(engine) -> str:
    from sqlalchemy import text

    with engine.connect() as conn:
        return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()


def head() -> str:
    from alembic.script import ScriptDirectory

    from proxy.store.db import alembic_config

    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


@pytest.mark.parametrize("args", READERS)
@pytest.mark.parametrize("kind", ["foreign", "empty"])
def test_a_read_command_refuses_a_database_without_tooltap_data_and_leaves_it_alone(tmp_path, args, kind):
    db = tmp_path / "other.db"
    if kind == "foreign":
        conn = sqlite3.connect(db)
        conn.execute("create table notes (body text)")
        conn.commit()
        conn.close()
    else:
        db.touch()
    before = files_in(tmp_path)
    r = run(*args, "--db", f"sqlite:///{db}", cwd=tmp_path)
    assert r.returncode == 2
    found = "its tables: notes" if kind == "foreign" else "it has no tables"
    assert_one_line_error(r, f"{db} holds no tooltap data ({found})", "give the --db that `tooltap serve` writes to")
    assert r.stderr.count("\n") == 1, r.stderr
    assert files_in(tmp_path) == before


@pytest.mark.parametrize("args", [["serve", "--upstream", "http://127.0.0.1:9", "--port", str(free_port())],
                                  ["import", "capture.har"]])
def test_a_command_that_makes_the_store_refuses_another_programs_sqlite_file(tmp_path, args):
    """serve and import make their store in a new or empty file, not among another
    program's tables."""
    db = tmp_path / "app.db"
    conn = sqlite3.connect(db)
    conn.execute("create table notes (body text)")
    conn.commit()
    conn.close()
    (tmp_path / "capture.har").write_text('{"log": {"version": "1.2", "entries": []}}')
    before = files_in(tmp_path)
    r = run(*args, "--db", f"sqlite:///{db}", cwd=tmp_path)
    assert_one_line_error(r, f"{db} holds another program's tables (notes)", "give tooltap a database of its own")
    assert files_in(tmp_path) == before
    db.unlink()
    db.touch()  # an empty file is where a store is made
    assert run("import", "capture.har", "--db", f"sqlite:///{db}", cwd=tmp_path).returncode == 0


@pytest.mark.parametrize("args", READERS)
def test_a_read_command_reads_a_tooltap_store(tmp_path, args):
    from proxy.store.db import open_database

    db = tmp_path / "t.db"
    open_database(str(db)).dispose()
    r = run(*args, "--db", str(db))
    assert r.returncode == 0 and not r.stderr, r


@pytest.mark.parametrize("args", READERS)
def test_a_read_command_brings_an_older_store_up_to_date(tmp_path, args):
    """An upgraded tooltap migrates its store on the first command that opens it."""
    from proxy.store.db import make_engine

    engine = make_engine(f"sqlite:///{tmp_path / 'old.db'}")
    migrated_to(engine, "0001")
    r = run(*args, "--db", str(tmp_path / "old.db"))
    assert r.returncode == 0 and not r.stderr, r
    assert revision_of(engine) == head()
    engine.dispose()


def test_a_read_command_leaves_a_newer_tooltaps_store_alone(tmp_path):
    from proxy.store.db import open_database

    db = tmp_path / "t.db"
    open_database(str(db)).dispose()
    conn = sqlite3.connect(db)
    conn.execute("update alembic_version set version_num = '9999'")
    conn.commit()
    conn.close()
    before = files_in(tmp_path)
    r = run("stats", "--db", str(db))
    assert r.returncode == 2
    assert_one_line_error(r, f"{db} was written by a newer tooltap (schema 9999): upgrade tooltap")
    assert files_in(tmp_path) == before


def search_path_code(schema: str) -> str:
    """The CLI run with every Postgres connection in `schema`, as conftest's in_schema does
    (a URL cannot say it: tooltap gives the driver its own options)."""
    return ("import sys; from sqlalchemy import event; from sqlalchemy.engine import Engine; "
            f"event.listen(Engine, 'connect', lambda c, _: (c.execute('SET search_path TO {schema}'), c.commit())); "
            "sys.argv[0] = 'tooltap'; from proxy.cli import main; main()")


def test_a_read_command_refuses_postgres_without_tooltap_tables_and_upgrades_an_older_store():
    from sqlalchemy import inspect, text

    from proxy.store.db import make_engine

    schema = f"cli_reader_{os.getpid()}"
    url = postgres_schema(schema)
    engine = in_schema(make_engine(url), schema)
    code = search_path_code(schema)

    def tables() -> set[str]:
        with engine.connect() as conn:
            return set(inspect(conn).get_table_names())

    try:
        r = run("stats", "--db", url, code=code)
        assert r.returncode == 2
        assert_one_line_error(r, "holds no tooltap data (it has no tables)")
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE notes (body text)"))
        for args in READERS:
            r = run(*args, "--db", url, code=code)
            assert r.returncode == 2
            assert_one_line_error(r, "holds no tooltap data (its tables: notes)", "`tooltap serve`")
        assert tables() == {"notes"}
        migrated_to(engine, "0001")
        r = run("stats", "--db", url, code=code)
        assert r.returncode == 0 and not r.stderr, r
        assert revision_of(engine) == head()
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
        engine.dispose()


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
    (["serve", "--read-timeout", "nan"], ["'nan' is not a finite number", "serve --help"]),
    (["serve", "--shutdown-grace", "inf"], ["'inf' is not a finite number", "serve --help"]),
    (["demo", "--live-every", "inf"], ["'inf' is not a finite number", "demo --help"]),
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


def test_every_option_read_from_the_environment_says_which_variable_in_its_help():
    import click
    from click.testing import CliRunner

    from proxy.cli import main

    def commands(group, path):
        for name, cmd in group.commands.items():
            if isinstance(cmd, click.Group):
                yield from commands(cmd, [*path, name])
            else:
                yield [*path, name], cmd

    seen = 0
    for path, cmd in commands(main, []):
        shown = " ".join(CliRunner().invoke(main, [*path, "--help"], terminal_width=200).output.split())
        for param in cmd.params:
            if isinstance(param, click.Option) and param.envvar:
                assert f"env var: {param.envvar}" in shown, (path, param.name)
                seen += 1
    assert seen >= 15
    serve = " ".join(CliRunner().invoke(main, ["serve", "--help"]).output.split())
    assert "env var: TOOLTAP_UPSTREAM" in serve and "--db URL" in serve  # read by its callback, not click


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
    assert err.splitlines() == ["Interrupted (Ctrl-C): stopped before it finished; what it had stored is kept, "
                                "and importing the file again stores the rest."]
    assert "Aborted" not in out + err


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "lots"])
def test_a_tuning_variable_that_is_not_a_finite_number_is_said_and_left_at_its_default(monkeypatch, caplog, value):
    """TOOLTAP_WRITER_MEMORY_MB=nan ended `serve` in a traceback from int()."""
    from proxy.store.process import env_number

    monkeypatch.setenv("TOOLTAP_WRITER_MEMORY_MB", value)
    assert env_number("TOOLTAP_WRITER_MEMORY_MB", 64.0) == 64.0
    assert f"TOOLTAP_WRITER_MEMORY_MB='{value}' is not a finite number of 0 or more; using 64" in caplog.text
