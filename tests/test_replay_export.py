"""`tooltap export --pytest`: a recorded session becomes a pytest module and a cassette;
the module passes as written, fails when the recorded answer changes, and the cassette
upstream (proxy.testing) never answers a request it did not record."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from proxy.cli import main
from proxy.replay.cassette import Cassette
from proxy.replay.upstream import CassetteUpstream, IgnoreRules, Interaction
from proxy.scripted import Reply
from proxy.testing import serve_cassette
from tests.conftest import CLINE
from tests.test_proxy_e2e import play_cline

SECRET = "sk-cline-secret-0123456789abcdef"  # the key play_cline sends


def export(tooltap, directory: Path):
    tooltap.flush()
    session = tooltap.api("/sessions")["sessions"][0]["id"]
    result = CliRunner().invoke(main, ["export", session, "--pytest", str(directory),
                                       "--db", f"sqlite:///{tooltap.db_path}"])
    return session, result


def run_pytest(directory: Path, *args: str, autoload: bool = False) -> subprocess.CompletedProcess:
    """The exported module, run the way a user runs it: pytest in its own process. Without
    `autoload`, only tooltap's plugin is loaded (by its entry point name): seconds faster."""
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    if autoload:
        env.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD")
    plugin = [] if autoload else ["-p", "tooltap"]
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin, *args],
                          cwd=directory, capture_output=True, text=True, timeout=120, env=env)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """The cline-weather session recorded through a real tooltap and exported, once for
    this module (each test gets its own copy)."""
    from proxy.app import TooltapApp
    from proxy.config import Settings, Upstream
    from proxy.scripted import ScriptedUpstream
    from tests.conftest import Server, Tooltap

    base = tmp_path_factory.mktemp("recorded")
    scripted = ScriptedUpstream()
    with Server(scripted) as up:
        scripted.url = up.url
        app = TooltapApp(Settings(upstreams=(Upstream.parse(up.url),), db_url=f"sqlite:///{base}/tooltap.db"))
        with Server(app) as server:
            tooltap = Tooltap(app, server, base / "tooltap.db")
            play_cline(tooltap, scripted)
            session, result = export(tooltap, base / "exported")
    assert result.exit_code == 0, result.output
    assert result.output.count("wrote ") == 2
    # Prompts and answers: the owner's alone, as the database is.
    assert sorted(f.stat().st_mode & 0o777 for f in (base / "exported").iterdir()) == [0o600, 0o600]
    return base / "exported"


@pytest.fixture
def exported(recorded, tmp_path):
    out = shutil.copytree(recorded, tmp_path / "exported")
    return next(out.glob("*.cassette.json")), next(out.glob("test_*.py"))


def test_exported_module_passes_then_fails_when_the_answer_changes(exported):
    cassette_path, module = exported
    text = cassette_path.read_text()
    assert SECRET not in text and SECRET[-8:] not in text and "authorization" not in text.lower()
    doc = json.loads(text)
    assert [i["turn"] is not None for i in doc["interactions"]] == [True] * 4
    assert doc["session"]["mcp_servers"] == {"cIya4J": "weather"}
    assert doc["interactions"][0]["request"]["body"] == json.loads((CLINE / "turn1/request.json").read_bytes())
    # The response is the exact stream, as text, with its network cuts and their times.
    first = doc["interactions"][0]["response"]
    assert first["body"].encode() == (CLINE / "turn1/response.sse").read_bytes()
    offsets, times = zip(*first["timeline"])
    assert offsets[0] == 0 and list(offsets) == sorted(set(offsets)) and times[0] > 0
    assert first["headers"]["content-type"].startswith("text/event-stream")

    # The expected calls are literals in the module, readable in a diff.
    source = module.read_text()
    assert "tool='weather/get_forecast'" in source and "name='cIya4J0mcp0get_forecast'" in source
    assert "'latitude': 38.9072" in source and "tool='list_files'" in source

    r = run_pytest(module.parent, autoload=True)  # plain `pytest`: the plugin comes with tooltap
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4 passed" in r.stdout

    # Change what the model answered: get_forecast's latitude, in the recorded stream.
    edited = text.replace(r'\"arguments\":\".9072,', r'\"arguments\":\".5000,')
    assert edited != text
    cassette_path.write_text(edited)
    r = run_pytest(module.parent)
    assert r.returncode == 1
    assert "1 failed, 3 passed" in r.stdout
    assert "FAILED test_session_" in r.stdout and "::test_turn[turn" in r.stdout
    assert "call 0 'weather/get_forecast': $.latitude recorded 38.9072, replayed 38.5" in r.stdout


def test_a_damaged_cassette_is_said_in_one_line_naming_what_is_wrong(exported):
    cassette_path, module = exported
    doc = json.loads(cassette_path.read_text())
    del doc["interactions"][1]["request"]
    cassette_path.write_text(json.dumps(doc))
    r = run_pytest(module.parent)
    assert r.returncode == 1
    said = f"tooltap_cassette: {cassette_path}: damaged cassette: interactions[1]: 'request' is missing"
    errors = r.stdout.split("short test summary info")[0]  # (where CI is set, the summary repeats it)
    assert errors.count(said) == 4, r.stdout  # once for each test's setup, and nothing chained to it
    assert "direct cause" not in r.stdout and "During handling" not in r.stdout
    cassette_path.write_text("{")
    r = run_pytest(module.parent)
    assert f"tooltap_cassette: cassette {cassette_path} is not JSON: " in r.stdout
    assert "direct cause" not in r.stdout and "During handling" not in r.stdout


def test_a_miss_names_the_closest_request_and_the_cline_clock_is_ignored(exported):
    cassette_path, _ = exported
    turn3 = json.loads((CLINE / "turn3/request.json").read_bytes())
    env = turn3["messages"][-1]["content"][-1]
    assert "# Current Time\n2026/3/7" in env["text"]
    env["text"] = env["text"].replace("2026/3/7 下午9:32:23", "2026/4/1 上午8:00:00")
    with serve_cassette(cassette_path) as served:
        # A fresh run of the same task differs in the clock only: it still matches.
        r = httpx.post(served.url + "/chat/completions", json=turn3, timeout=10)
        assert r.status_code == 200 and b"cIya4J0mcp0get_forecast" in r.content
        assert not served.misses

        turn3["temperature"] = 0.7
        r = httpx.post(served.url + "/chat/completions", json=turn3, timeout=10)
        assert r.status_code == 404 and r.headers["x-tooltap-cassette"] == "miss"
        error = r.json()["error"]
        turn_ids = [i.turn_id for i in served.interactions]
        assert error["closest"]["index"] == 2 and f"(turn #{turn_ids[2]})" in error["closest"]["request"]
        assert error["diff"] == [{"path": "$.temperature", "recorded": 0, "received": 0.7}]
        assert f"closest recorded request: interactions[2], POST /chat/completions (turn #{turn_ids[2]})" \
            in error["message"]
        assert len(served.misses) == 1


def test_serve_cassette_needs_no_pytest(exported):
    """A user's script serves the cassette where pytest is not installed (a plain
    `pip install tooltap`): the recorded answer, and a miss named."""
    cassette_path, _ = exported
    script = f"""
import sys
sys.modules["pytest"] = None  # as if not installed: importing it raises ImportError
import json, httpx
from proxy.testing import serve_cassette
request = json.loads(open({str(CLINE / "turn3/request.json")!r}, encoding="utf-8").read())
with serve_cassette({str(cassette_path)!r}) as served:
    r = httpx.post(served.url + "/chat/completions", json=request, timeout=10)
    print(r.status_code, b"cIya4J0mcp0get_forecast" in r.content)
    r = httpx.post(served.url + "/chat/completions", json=dict(request, model="other"), timeout=10)
    print(r.status_code, r.json()["error"]["diff"][0]["path"])
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["200 True", "404 $.model"]


def test_user_code_against_the_fixture(exported):
    """The official openai SDK pointed at the fixture's URL gets the recorded tool calls;
    a request that was not recorded fails the test even when the code swallows the error."""
    cassette_path, module = exported
    (module.parent / "test_my_agent.py").write_text(f'''
import json
import openai
import pytest

pytestmark = pytest.mark.tooltap_cassette({cassette_path.name!r})
REQUEST = json.loads({(CLINE / "turn3/request.json").read_text()!r})


def test_sdk_gets_the_recorded_calls(tooltap_cassette):
    client = openai.OpenAI(base_url=tooltap_cassette.url, api_key="unused", max_retries=0)
    stream = client.chat.completions.create(**REQUEST)
    name, args = "", ""
    for chunk in stream:
        for call in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            name += call.function.name or ""
            args += call.function.arguments or ""
    assert name == "cIya4J0mcp0get_forecast"
    assert json.loads(args)["latitude"] == 38.9072


def test_swallowed_miss(tooltap_cassette):
    client = openai.OpenAI(base_url=tooltap_cassette.url, api_key="unused", max_retries=0)
    try:
        client.chat.completions.create(**{{**REQUEST, "model": "another-model"}})
    except openai.NotFoundError:
        pass  # agent code that hides errors must not turn a miss into a pass


def test_raised_miss(tooltap_cassette):
    client = openai.OpenAI(base_url=tooltap_cassette.url, api_key="unused", max_retries=0)
    client.chat.completions.create(**{{**REQUEST, "model": "one-more-model"}})


def test_given_up_miss(tooltap_cassette):
    client = openai.OpenAI(base_url=tooltap_cassette.url, api_key="unused", max_retries=0)
    try:
        client.chat.completions.create(**{{**REQUEST, "model": "a-third-model"}})
    except openai.NotFoundError:
        pytest.fail("the agent gave up")
''')
    r = run_pytest(module.parent, "test_my_agent.py")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "3 failed, 1 passed in" in r.stdout  # each miss once: no error at teardown besides
    assert "FAILED test_my_agent.py::test_swallowed_miss" in r.stdout
    assert "(the code under test then raised NotFoundError at test_my_agent.py:" in r.stdout
    assert "closest recorded request: interactions[2], POST /chat/completions (turn #3)" in r.stdout
    assert '$.model: recorded "deepseek-chat", received "another-model"' in r.stdout
    # said once each, not again with every exception chained to it (in the failures: where CI
    # is set, pytest's short summary repeats each failure's whole message)
    failures = r.stdout.split("short test summary info")[0]
    assert "During handling of the above exception" not in failures
    assert failures.count('received "one-more-model"') == 1 and failures.count('received "a-third-model"') == 1


def test_tests_are_named_by_the_turn_s_place_whatever_its_id(tooltap, upstream, tmp_path):
    """The cline session recorded after another one: its turns are 2 to 5 in this database,
    and still turn1 to turn4 in the exported module (the ids only in its comments)."""
    upstream.routes["/chat/completions"] = Reply.json({"choices": [{"index": 0, "message": {
        "role": "assistant", "content": "Hello."}, "finish_reason": "stop"}]})
    r = httpx.post(f"{tooltap.url}/chat/completions", timeout=10,
                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200
    play_cline(tooltap, upstream)
    tooltap.flush()
    session = next(s["id"] for s in tooltap.api("/sessions")["sessions"] if s["turns"] == 4)
    ids = [t["id"] for t in tooltap.api(f"/sessions/{session}")["turns"]]
    assert ids == [2, 3, 4, 5]
    out = CliRunner().invoke(main, ["export", session, "--pytest", str(tmp_path),
                                    "--db", f"sqlite:///{tooltap.db_path}"])
    assert out.exit_code == 0, out.output
    source = next(tmp_path.glob("test_*.py")).read_text()
    assert "    # turn 1 (#2): POST /chat/completions\n    (1, 200, [" in source
    assert "    # turn 4 (#5): POST /chat/completions\n    (4, 200, [])," in source
    r = run_pytest(tmp_path, "--collect-only")
    assert r.returncode == 0, r.stdout + r.stderr
    assert [line.split("::")[1] for line in r.stdout.splitlines() if "::" in line] == [
        f"test_turn[turn{n}]" for n in (1, 2, 3, 4)]


def test_a_stream_the_upstream_aborted_is_expected_to_end_the_same_way(tooltap, upstream, tmp_path):
    """The recorded answer stops mid-body: its exported test expects the same bytes, then the
    same abrupt end. It passes as written, and fails when the replay ends otherwise: whole
    where the recording was cut, or cut where it was whole."""
    from proxy.demo import chat_sse, words

    call = {"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    sse = chat_sse("m", [{"tool_calls": [call]}] + words("and a long answer after it"), finish="tool_calls")
    upstream.routes["/chat/completions"] = Reply.sse(sse, drop_after=4)
    with pytest.raises(httpx.RemoteProtocolError):  # what the agent saw
        httpx.post(f"{tooltap.url}/chat/completions", timeout=10,
                   json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "weather?"}]})
    session, result = export(tooltap, tmp_path)
    assert result.exit_code == 0, result.output
    assert tooltap.api(f"/sessions/{session}")["turns"][0]["status"] == "upstream_aborted"
    cassette_path, module = next(tmp_path.glob("*.cassette.json")), next(tmp_path.glob("test_*.py"))
    source = module.read_text()
    assert "tool='get_weather'" in source and "    ], CUT_SHORT),\n" in source
    assert max(len(line) for line in source.splitlines()) <= 120
    r = run_pytest(tmp_path)
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout + r.stderr

    # The cassette no longer drops the connection: the replay ends whole, and that fails.
    text = cassette_path.read_text()
    doc = json.loads(text)
    assert doc["interactions"][0]["response"].pop("cut_short") is True
    cassette_path.write_text(json.dumps(doc))
    r = run_pytest(tmp_path)
    assert r.returncode == 1 and "1 failed" in r.stdout, r.stdout + r.stderr
    assert "turn 1: the answer ended whole, the recorded one was cut short" in r.stdout
    assert "RemoteProtocolError" not in r.stdout

    # The module expects a whole answer where the cassette cuts it: that fails too, saying so.
    cassette_path.write_text(text)
    module.write_text(source.replace("], CUT_SHORT),", "]),"))
    r = run_pytest(tmp_path)
    assert r.returncode == 1 and "1 failed" in r.stdout, r.stdout + r.stderr
    assert "turn 1: the connection dropped after" in r.stdout and "the recorded answer ended whole" in r.stdout
    assert "RemoteProtocolError" not in r.stdout


def test_export_makes_the_folders_it_needs_and_refuses_a_path_it_cannot_use(tooltap, upstream, tmp_path,
                                                                            monkeypatch):
    upstream.routes["/chat/completions"] = Reply.json({"choices": [{"index": 0, "message": {
        "role": "assistant", "content": "Hello."}, "finish_reason": "stop"}]})
    httpx.post(f"{tooltap.url}/chat/completions", timeout=10,
               json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    tooltap.flush()
    session = tooltap.api("/sessions")["sessions"][0]["id"]
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)

    def run(directory: str):
        return CliRunner().invoke(main, ["export", session, "--pytest", directory,
                                         "--db", f"sqlite:///{tooltap.db_path}"])

    # As the README writes it, in a project without tests/ yet: both folders are made,
    # owner-only as the files in them (prompts and answers).
    out = run("tests/recorded/")
    assert out.exit_code == 0, out.output
    assert out.output.splitlines()[0].startswith("wrote tests/recorded/session_")
    assert [oct(p.stat().st_mode & 0o777) for p in (project / "tests", project / "tests/recorded")] == ["0o700"] * 2
    assert sorted(p.stat().st_mode & 0o777 for p in (project / "tests/recorded").iterdir()) == [0o600, 0o600]

    # A file in the way, or where the folder should be: one line, exit 2, nothing made.
    (project / "notes").write_text("a file")
    for directory in ("notes/recorded", "notes"):
        out = run(directory)
        assert out.exit_code == 2, out.output
        assert out.output == f"Error: cannot write into {directory}: {project / 'notes'} is not a folder\n"
    # A folder that cannot be made: said in one line, and the folders made before it are removed.
    out = run("made/" + "x" * 300)
    assert out.exit_code == 2 and out.output.startswith("Error: cannot write into made/")
    assert out.output.endswith(": File name too long\n") and len(out.output.splitlines()) == 1
    assert not (project / "made").exists()
    if os.geteuid() != 0:  # root writes anywhere
        locked = project / "locked"
        locked.mkdir(mode=0o500)
        out = run("locked/tests/recorded")
        assert out.exit_code == 2 and out.output.endswith(": Permission denied\n"), out.output
        assert list(locked.iterdir()) == []


def test_export_refuses_a_key_left_in_the_session(tooltap, upstream, tmp_path):
    upstream.routes["/chat/completions"] = Reply.json({"choices": [{"index": 0, "message": {
        "role": "assistant", "content": "Done."}, "finish_reason": "stop"}]})
    pasted = "sk-proj-Zq8vN2xK4mR7tY1wB5cH9jL3pD6fG0sA"
    r = httpx.post(f"{tooltap.url}/chat/completions", timeout=10, headers={"authorization": f"Bearer {SECRET}"},
                   json={"model": "m", "messages": [{"role": "user", "content": f"use my key {pasted} please"}]})
    assert r.status_code == 200
    out = tmp_path / "refused"
    _, result = export(tooltap, out)
    assert result.exit_code == 2
    assert "interactions[0].request.body.messages[0].content: an sk- API key" in result.output
    assert pasted not in result.output and "Nothing was written" in result.output
    assert not out.exists()


def test_cassette_upstream_timing_retries_and_encoding():
    # Identical requests (a retry) get their recorded answers in order; chunks keep their
    # recorded gaps at speed 1 and shrink at speed 20.
    def answer(text: str, at: float) -> Interaction:
        return Interaction("POST", "/v1/x", {"q": 1}, 200, [("content-type", "text/plain")],
                           [(0.0, b"ok "), (at, text.encode())])

    upstream = CassetteUpstream([answer("first", 600.0), answer("second", 600.0)], speed=1)
    with upstream.serving() as url:
        started = time.monotonic()
        assert httpx.post(url + "/v1/x", json={"q": 1.0}).text == "ok first"
        slow = time.monotonic() - started
        upstream.speed = 20
        started = time.monotonic()
        assert httpx.post(url + "/v1/x", content=b'{ "q" : 1 }').text == "ok second"
        fast = time.monotonic() - started
        assert httpx.post(url + "/v1/x", json={"q": 1}).text == "ok second"  # the last one repeats
    assert slow >= 0.6 and fast < 0.4  # 30 ms of waiting, on a busy machine
    assert upstream.served == [0, 1, 1] and not upstream.misses

    rules = IgnoreRules(["$.messages[*].ts", "user", r"re:\d\d:\d\d"])
    assert rules.apply({"user": "u", "messages": [{"ts": 1, "text": "at 10:42"}, {"text": "b"}],
                        "meta": {"user": "x"}}) == {"messages": [{"text": "at <ignored>"}, {"text": "b"}],
                                                    "meta": {}}
    with pytest.raises(ValueError, match="cannot read the path"):
        IgnoreRules(["$.a[x"])


def test_a_compressed_recording_is_served_decoded(tooltap, upstream):
    import gzip

    from proxy.replay.recording import load, open_reader

    body = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "zip"}}]}).encode()
    upstream.routes["/chat/completions"] = Reply(200, [("content-type", "application/json"),
                                                       ("content-encoding", "gzip")], [gzip.compress(body)])
    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    httpx.post(f"{tooltap.url}/chat/completions", json=request, timeout=10)
    tooltap.flush()
    session = tooltap.api("/sessions")["sessions"][0]["id"]
    cassette = Cassette.from_recording(load(open_reader(f"sqlite:///{tooltap.db_path}"), session))
    assert json.loads(cassette.dumps())["interactions"][0]["response"]["body"] == body.decode()
    with serve_cassette(Cassette.from_json(json.loads(cassette.dumps()))) as served:
        r = httpx.post(served.url + "/chat/completions", json=request)
        assert r.content == body and "content-encoding" not in r.headers
        answer = served.send(0)
        assert answer.response["choices"][0]["message"]["content"] == "zip" and answer.calls == []


def test_arguments_the_store_could_not_hold_are_expected_as_sent(tooltap, upstream, tmp_path):
    """A lone surrogate or NaN in a model's arguments is flagged and not stored as JSON; the
    exported test still expects the value the arguments' text parses to, as a replay gets."""
    texts = ['{"path": "a\\ud800b", "n": 1}', '{"ratio": NaN}', '{"cmd": "safe \u202erm"}']
    upstream.routes["/chat/completions"] = Reply.json({"choices": [{"index": 0, "finish_reason": "tool_calls",
        "message": {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "read_file", "arguments": text}}
            for i, text in enumerate(texts)]}}]})
    r = httpx.post(f"{tooltap.url}/chat/completions", timeout=10,
                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200
    session, result = export(tooltap, tmp_path)
    assert result.exit_code == 0, result.output
    stored = tooltap.api(f"/turns/{tooltap.api(f'/sessions/{session}')['turns'][0]['id']}")["tool_calls"]
    assert [c["arguments"] for c in stored][:2] == [None, None]  # flagged, kept raw
    source = next(tmp_path.glob("test_*.py")).read_text()
    assert "'a\\ud800b'" in source and 'float("nan")' in source
    # A bidirectional control is written as its escape where people read: the same JSON.
    cassette = next(tmp_path.glob("*.cassette.json")).read_text()
    assert "\u202e" not in cassette and "\\u202erm" in cassette
    r = run_pytest(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    report = CliRunner().invoke(main, ["replay", "session", session, "--recorded", "--format", "json",
                                       "--db", f"sqlite:///{tooltap.db_path}"])
    assert report.exit_code == 0 and "\u202e" not in report.output, report.output
    assert json.loads(report.output)["turns"][0]["recorded_calls"][2]["arguments"]["cmd"] == "safe \u202erm"


def test_a_request_without_a_body_replays_without_one(tooltap, upstream, tmp_path):
    """The openai SDK's `models.list()` is a GET with no body: the exported test sends it
    without one (it sent the text `null`, missed the cassette, and failed as written)."""
    import openai

    upstream.routes["/models"] = Reply.json({"object": "list", "data": [{"id": "fake-1", "object": "model"}]})
    client = openai.OpenAI(base_url=tooltap.url, api_key="sk-test", max_retries=0)
    assert [m.id for m in client.models.list()] == ["fake-1"]
    tooltap.flush()
    session = tooltap.api("/sessions")["sessions"][0]["id"]
    out = CliRunner().invoke(main, ["export", session, "--pytest", str(tmp_path),
                                    "--db", f"sqlite:///{tooltap.db_path}"])
    assert out.exit_code == 0, out.output
    r = run_pytest(tmp_path)
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout + r.stderr


def test_a_session_is_named_by_the_first_characters_of_its_id(tooltap, upstream, tmp_path):
    """As git takes a commit's prefix: export, replay and HAR take a session id's first
    four characters or more when they name one session, and say so when they name several."""
    from sqlmodel import Session as DB, create_engine

    from proxy.store.models import Session

    upstream.routes["/chat/completions"] = Reply.json({"choices": [{"index": 0, "message": {
        "role": "assistant", "content": "Hello."}, "finish_reason": "stop"}]})
    r = httpx.post(f"{tooltap.url}/chat/completions", timeout=10,
                   json={"model": "m", "messages": [{"role": "user", "content": "first"}]})
    assert r.status_code == 200
    tooltap.flush()
    session = tooltap.api("/sessions")["sessions"][0]["id"]
    db = ["--db", f"sqlite:///{tooltap.db_path}"]
    out = CliRunner().invoke(main, ["export", session[:6], "--har", str(tmp_path / "s.har"), *db])
    assert out.exit_code == 0, out.output
    har = json.loads((tmp_path / "s.har").read_text())
    assert har["log"]["entries"][0]["_tooltap"]["session_id"] == session
    replay = CliRunner().invoke(main, ["replay", "session", session[:8], "--recorded", *db])
    assert replay.exit_code == 0, replay.output
    short = CliRunner().invoke(main, ["export", session[:3], "--har", str(tmp_path / "t.har"), *db])
    assert short.exit_code == 2
    assert f"'{session[:3]}' is too short to name a session: give 4 characters or more of its id" in short.output
    other = CliRunner().invoke(main, ["export", "zz" if session[0] != "z" else "yy", "--har", str(tmp_path / "t.har"),
                                      *db])
    assert other.exit_code == 2 and "no session" in other.output
    with DB(create_engine(f"sqlite:///{tooltap.db_path}")) as s:  # two sessions that start alike
        s.add_all([Session(id="abcd1111", started_at=1.0, last_at=1.0),
                   Session(id="abcd2222", started_at=1.0, last_at=1.0)])
        s.commit()
    both = CliRunner().invoke(main, ["export", "abcd", "--har", str(tmp_path / "u.har"), *db])
    assert both.exit_code == 2
    assert "'abcd' begins more than one session (abcd1111, abcd2222): give more of the id" in both.output
    assert not (tmp_path / "u.har").exists()
