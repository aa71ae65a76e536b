"""HAR: a Cline session recorded through a real tooltap goes out as HAR 1.2 (checked
against a schema written from the format's specification) and comes back into a fresh
database the same; a mitmproxy-style HAR from elsewhere is reassembled, decoded,
threaded and stripped of its keys on the way in."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from proxy.cli import main
from proxy.store.db import open_database
from proxy.store.read import Reader
from tests.cline_db import recorded_cline_db
from tests.conftest import FIXTURES, cline_turn
from tests.har_samples import KEY, REPLY, STREAM, mitmproxy_har

SCHEMA = json.loads((FIXTURES / "har-1.2.schema.json").read_text())


@pytest.fixture(scope="module")
def cline(tmp_path_factory):
    return recorded_cline_db(tmp_path_factory)


def _run(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def _export(db: Path, session_id: str, path: Path) -> dict:
    out = _run("export", session_id, "--db", str(db), "--har", str(path))
    assert out.strip() == f"wrote {path} (4 entries)"
    return json.loads(path.read_text(encoding="utf-8"))


def _only_entry(tooltap, path: Path) -> dict:
    """The store's one session exported as HAR to `path`: its one entry."""
    tooltap.flush()
    (session,) = tooltap.api("/sessions")["sessions"]
    _run("export", session["id"], "--db", str(tooltap.db_path), "--har", str(path))
    (entry,) = json.loads(path.read_text(encoding="utf-8"))["log"]["entries"]
    return entry


def _everything(db_url: str) -> list[dict]:
    """Sessions with their turns and tool calls, without what a database assigns (ids)."""
    reader = Reader(open_database(db_url, create=False))
    out = []
    for s in reader.sessions():
        turns = reader.session(s["id"])["turns"]
        position = {t["id"]: i for i, t in enumerate(turns)}
        whole = []
        for summary in turns:
            t = reader.turn(summary["id"])
            raw = reader.raw(t["id"])
            whole.append({
                **{k: t[k] for k in ("api", "method", "path", "upstream", "model", "http_status", "status", "stream",
                                     "started_at", "ttft_ms", "duration_ms", "usage", "error", "request", "request_encoding", "response",
                                     "raw_sha256", "raw_size", "request_headers", "response_headers", "decoding")},
                "parent": position.get(t["parent_id"]), "raw": raw[0],
                "timeline": reader.timeline(t["id"]),
                "tool_calls": [{k: v for k, v in c.items()} for c in t["tool_calls"]],
            })
        out.append({**s, "turns": whole})
    return out


def test_export_is_har_1_2_with_exact_bodies_and_capture_timings(cline, tmp_path):
    db, session_id = cline
    (tmp_path / "s.har").write_text("an older file, readable by all")
    (tmp_path / "s.har").chmod(0o644)
    har = _export(db, session_id, tmp_path / "s.har")
    assert (tmp_path / "s.har").stat().st_mode & 0o777 == 0o600  # prompts: the owner's alone, as the database
    jsonschema.Draft202012Validator(SCHEMA).validate(har)

    entries = har["log"]["entries"]
    reader = Reader(open_database(f"sqlite:///{db}", create=False))
    turns = reader.session(session_id)["turns"]
    for n, (e, t) in enumerate(zip(entries, turns)):
        assert e["request"]["method"] == "POST" and e["request"]["url"].endswith("/chat/completions")
        assert json.loads(e["request"]["postData"]["text"]) == json.loads(cline_turn(n + 1)["request"])
        assert e["response"]["status"] == 200 and e["response"]["statusText"] == "OK"
        assert e["response"]["content"]["mimeType"] == "text/event-stream"
        body = e["response"]["content"]["text"].encode()
        assert body == reader.raw(t["id"])[0]  # the exact bytes the agent got
        if n < 3:
            assert body == cline_turn(n + 1)["sse"]
        assert e["timings"]["wait"] == pytest.approx(t["ttft_ms"], abs=0.001)
        assert e["time"] == pytest.approx(t["duration_ms"], abs=0.001)
        assert e["timings"]["wait"] + e["timings"]["receive"] == pytest.approx(e["time"], abs=0.002)
        assert e["_tooltap"]["session_id"] == session_id and e["_tooltap"]["turn_id"] == t["id"]
    # The key is a fingerprint, as stored; the secret itself is nowhere in the file.
    auth = next(h["value"] for h in entries[0]["request"]["headers"] if h["name"] == "authorization")
    assert auth.startswith("Bearer …") and "#" in auth
    assert "sk-cline-secret" not in (tmp_path / "s.har").read_text(encoding="utf-8")

    # The schema is no rubber stamp: what the format requires, it checks.
    broken = json.loads(json.dumps(har))
    del broken["log"]["entries"][0]["timings"]["wait"]
    broken["log"]["entries"][1]["response"]["content"]["size"] = "12"
    assert len(list(jsonschema.Draft202012Validator(SCHEMA).iter_errors(broken))) == 2


def test_round_trip_into_a_fresh_database(cline, tmp_path):
    db, session_id = cline
    path = tmp_path / "s.har"
    _export(db, session_id, path)
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    assert _run("import", str(path), "--db", fresh).strip() == "imported 4 turn(s) into 1 session(s)"

    before, after = _everything(f"sqlite:///{db}"), _everything(fresh)
    assert [s["id"] for s in after] == [session_id]
    assert after == before  # sessions, turns, tool calls, decoding: all the same
    calls = [c for t in after[0]["turns"] for c in t["tool_calls"]]
    assert [(c["decoded"]["tool"], c["decoded"]["server"]) for c in calls] == [
        ("list_files", None), ("read_file", None), ("get_forecast", "weather")]
    assert calls[2]["result"]["status"] == "ok"

    # `--har -`: the same HAR on standard output, and nothing else there.
    out = CliRunner().invoke(main, ["export", session_id, "--db", str(db), "--har", "-"])
    assert out.exit_code == 0 and json.loads(out.stdout) == json.loads(path.read_text(encoding="utf-8"))
    both = CliRunner().invoke(main, ["export", session_id, "--db", str(db), "--har", "-", "--pytest", str(tmp_path)])
    assert both.exit_code == 2 and "--har - writes the HAR to standard output alone" in both.output

    # Importing again stores nothing twice.
    again = _run("import", str(path), "--db", fresh)
    assert again.strip() == "imported 0 turn(s) into 0 session(s); 4 already stored"
    assert len(Reader(open_database(fresh, create=False)).turns()) == 4


def test_a_mitmproxy_har_is_stored_as_if_it_had_passed_through(tmp_path):
    path = tmp_path / "flows.har"
    path.write_text(json.dumps(mitmproxy_har(), indent=4))
    db = f"sqlite:///{tmp_path / 'm.db'}"
    out = _run("import", str(path), "--db", db)
    assert out.strip() == "imported 2 turn(s) into 1 session(s); 1 not a model call (--all-requests keeps them)"

    reader = Reader(open_database(db, create=False))
    [session] = reader.sessions()
    assert session["title"] == "weather in Paris tomorrow?" and session["agent"] == "cline"
    first, second = (reader.turn(t["id"]) for t in reader.session(session["id"])["turns"])
    assert second["parent_id"] == first["id"]  # threaded by its history
    assert first["api"] == "openai.chat" and first["path"] == "/v1/chat/completions"
    assert first["upstream"] == "https://api.openai.com"
    assert first["response"]["choices"][0]["message"]["content"] == REPLY
    # The stream is reassembled from the decoded text; its encoding header no longer applies.
    assert second["stream"] is True
    assert second["response"]["choices"][0]["message"]["content"] == "Sunny, 24°C tomorrow."
    assert second["usage"]["prompt_tokens"] == 120
    assert reader.raw(second["id"])[0] == STREAM.encode()
    assert "content-encoding" not in {k.lower() for k, _ in second["response_headers"]}
    # Timings: the first byte after send and wait (connect and ssl were null: a reused connection).
    assert (second["ttft_ms"], second["duration_ms"]) == (401.0, 651.0)
    # The key arrived in clear and is stored as a fingerprint only.
    auth = dict(first["request_headers"])["authorization"]
    assert auth.startswith("Bearer …") and KEY not in auth
    assert KEY.encode() not in (tmp_path / "m.db").read_bytes()
    # Decoded as Cline: the XML call in the reply, its MCP server, its result from the next request.
    [call] = first["tool_calls"]
    assert call["source"] == "text" and call["decoded"]["server"] == "weather"
    assert call["decoded"]["tool"] == "get_forecast" and call["arguments"] == {"latitude": 48.85, "longitude": 2.35}
    assert call["result"]["text"] == "Sunny, 24°C"

    # mitmproxy's compressed .zhar reads the same; --all-requests keeps the model list too.
    zhar = tmp_path / "flows.zhar"
    zhar.write_bytes(zlib.compress(path.read_bytes(), 9))
    everything = f"sqlite:///{tmp_path / 'all.db'}"
    assert _run("import", str(zhar), "--db", everything, "--all-requests").strip() == \
        "imported 3 turn(s) into 2 session(s)"

    # The model list is a session of one turn, under the day it was made (not the import's):
    # one entry, in the singular.
    reader = Reader(open_database(everything, create=False))
    (single,) = [s["id"] for s in reader.sessions() if len(reader.session(s["id"])["turns"]) == 1]
    assert single == "other-2025-06-01"
    one = tmp_path / "one.har"
    assert _run("export", single, "--db", everything, "--har", str(one)).strip() == f"wrote {one} (1 entry)"


def test_a_key_pasted_into_a_body_is_exported_with_a_warning(tooltap, upstream, tmp_path):
    """A HAR holds the bodies, so the key goes out with them (the pytest export refuses
    the session instead): one line on stderr says how many and where, not the key."""
    import httpx

    from proxy.scripted import Reply

    pasted = "sk-proj-Zq8vN2xK4mR7tY1wB5cH9jL3pD6fG0sA"
    upstream.routes["/chat/completions"] = Reply.json({"choices": [{"index": 0, "message": {
        "role": "assistant", "content": "Done."}, "finish_reason": "stop"}]})
    first = {"model": "m", "messages": [{"role": "user", "content": f"use my key {pasted} please"}]}
    second = {**first, "messages": [*first["messages"], {"role": "assistant", "content": "Done."},
                                    {"role": "user", "content": "thanks"}]}
    for body in (first, second):  # the key again in the second request's history
        r = httpx.post(f"{tooltap.url}/chat/completions", json=body, timeout=10,
                       headers={"authorization": "Bearer sk-cline-secret-0123456789abcdef"})
        assert r.status_code == 200
    tooltap.flush()
    session = tooltap.api("/sessions")["sessions"][0]["id"]
    path = tmp_path / "s.har"
    result = CliRunner().invoke(main, ["export", session, "--db", str(tooltap.db_path), "--har", str(path)])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"wrote {path} (2 entries)\n"
    assert pasted in path.read_text(encoding="utf-8")  # written all the same: a HAR is meant to hold bodies
    (warning,) = result.stderr.splitlines()
    assert warning.startswith(f"warning: {path} holds 2 key-like value(s) in clear: ")
    assert "turn 1 request body $.messages[0].content: an sk- API key (…" in warning
    assert "turn 2 request body $.messages[0].content: an sk- API key (…" in warning
    assert pasted not in warning and "authorization" not in warning  # headers hold fingerprints


def test_import_errors_are_one_line(tmp_path):
    runner = CliRunner()
    cases = {
        "missing.har": None,
        "text.har": b"hello",
        "nolog.har": b'{"entries": []}',
        "bad-entry.har": json.dumps({"log": {"entries": [{"request": {"method": "POST"}}]}}).encode(),
    }
    for name, content in cases.items():
        path = tmp_path / name
        if content is not None:
            path.write_bytes(content)
        result = runner.invoke(main, ["import", str(path), "--db", f"sqlite:///{tmp_path / 'x.db'}"])
        assert result.exit_code == 2, (name, result.output)
        assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    # Good entries then a bad one: nothing is stored, not the entries before it (no database made).
    har = mitmproxy_har()
    har["log"]["entries"].append({"request": {"method": "POST"}})
    (tmp_path / "mixed.har").write_text(json.dumps(har))
    mixed = runner.invoke(main, ["import", str(tmp_path / "mixed.har"), "--db", f"sqlite:///{tmp_path / 'x.db'}"])
    assert mixed.exit_code == 2 and "entry 4 of the HAR cannot be read: no 'url'" in mixed.output, mixed.output
    assert not (tmp_path / "x.db").exists()
    open_database(f"sqlite:///{tmp_path / 'x.db'}").dispose()
    nothing = runner.invoke(main, ["export", "nope", "--db", f"sqlite:///{tmp_path / 'x.db'}",
                                   "--har", str(tmp_path / "o.har")])
    assert nothing.exit_code == 2 and "no session 'nope'" in nothing.output


def test_export_makes_the_folders_its_file_goes_in(cline, tmp_path):
    """As `--pytest DIR` does: missing folders are made (owner-only); a file in the way is
    one line, exit 2, and nothing is left behind."""
    db, session_id = cline
    har = _export(db, session_id, tmp_path / "exports" / "today" / "s.har")
    assert har["log"]["entries"] and (tmp_path / "exports" / "today").stat().st_mode & 0o777 == 0o700
    (tmp_path / "notes").write_text("a file, not a folder")
    result = CliRunner().invoke(main, ["export", session_id, "--db", f"sqlite:///{db}",
                                       "--har", str(tmp_path / "notes" / "s.har")])
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "is not a folder" in result.output


def test_a_gzip_request_body_is_exported_decoded_without_its_coding_and_imported_whole(tooltap, upstream, tmp_path):
    """The HAR holds the body as text, decoded; a Content-Encoding left beside it made the
    import gunzip the text (unparsable: no title, no model, no agent)."""
    import gzip

    import httpx

    from proxy.scripted import Reply

    upstream.routes["/chat/completions"] = Reply.json({"choices": [{"index": 0, "message": {
        "role": "assistant", "content": "Done."}, "finish_reason": "stop"}]})
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "zipped hello"}]}).encode()
    r = httpx.post(f"{tooltap.url}/chat/completions", content=gzip.compress(body), timeout=10,
                   headers={"content-type": "application/json", "content-encoding": "gzip"})
    assert r.status_code == 200
    path, fresh = tmp_path / "z.har", f"sqlite:///{tmp_path / 'z.db'}"
    entry = _only_entry(tooltap, path)
    assert "content-encoding" not in {h["name"].lower() for h in entry["request"]["headers"]}
    assert json.loads(entry["request"]["postData"]["text"]) == json.loads(body)
    assert _run("import", str(path), "--db", fresh).startswith("imported 1 turn(s)")
    reader = Reader(open_database(fresh, create=False))
    (again,) = reader.sessions()
    assert again["title"] == tooltap.api("/sessions")["sessions"][0]["title"] == "zipped hello"
    (turn,) = reader.session(again["id"])["turns"]
    assert reader.turn(turn["id"])["request"] == json.loads(body) and not reader.turn(turn["id"])["error"]


def test_an_upstream_error_keeps_its_message_once_through_a_round_trip(tooltap, upstream, tmp_path):
    """The turn's error names the provider's message; imported, it is not said again."""
    import httpx

    from proxy.scripted import Reply

    upstream.routes["/chat/completions"] = Reply.json({"error": {"message": "Rate limit <x>"}}, status=429)
    r = httpx.post(f"{tooltap.url}/chat/completions", timeout=10,
                   json={"model": "m", "messages": [{"role": "user", "content": "too fast"}]})
    assert r.status_code == 429
    path, fresh = tmp_path / "e.har", f"sqlite:///{tmp_path / 'e.db'}"
    entry = _only_entry(tooltap, path)
    assert entry["_tooltap"]["error"] == "429 from the upstream: Rate limit <x>"
    assert _run("import", str(path), "--db", fresh).startswith("imported 1 turn(s)")
    reader = Reader(open_database(fresh, create=False))
    (turn,) = reader.session(reader.sessions()[0]["id"])["turns"]
    assert reader.turn(turn["id"])["error"] == "429 from the upstream: Rate limit <x>"


def test_a_fingerprinted_query_key_stays_in_the_har_query(tooltap, upstream, tmp_path):
    """`?key=` is stored as `…abcd#1f2e3d4c`: written raw into the URL, its `#` began a
    fragment (which a HAR URL must not have) and cut the query short."""
    import httpx

    from proxy.scripted import Reply
    from proxy.secrets import fingerprint

    key = "AIzaSy" + "Q" * 33
    upstream.routes["/v1beta/models/g:generateContent"] = Reply.json({"candidates": []})
    r = httpx.post(f"{tooltap.url}/v1beta/models/g:generateContent?key={key}&alt=json", timeout=10,
                   json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
    assert r.status_code == 200
    entry = _only_entry(tooltap, tmp_path / "g.har")
    url = entry["request"]["url"]
    assert "#" not in url and key not in url
    assert entry["request"]["queryString"] == [{"name": "key", "value": fingerprint(key)},
                                               {"name": "alt", "value": "json"}]


def test_a_named_upstream_s_prefix_is_not_in_the_har_url(make_tooltap, upstream, tmp_path):
    """Behind `--upstream claude=URL` the agent asks tooltap for /claude/v1/messages and
    the upstream gets /v1/messages: the HAR names what the upstream got, and imported back
    the turn keeps the path the agent asked for."""
    import httpx

    from proxy.scripted import Reply

    tooltap = make_tooltap(f"claude={upstream.url}/api")
    upstream.routes["/api/v1/messages"] = Reply.json({"id": "m1", "type": "message", "role": "assistant",
                                                      "content": [{"type": "text", "text": "hi"}]})
    r = httpx.post(f"{tooltap.url}/claude/v1/messages?beta=true", timeout=10, json={
        "model": "c", "max_tokens": 5, "messages": [{"role": "user", "content": "hello"}]})
    assert r.status_code == 200 and upstream.received[-1].path == "/api/v1/messages"
    path = tmp_path / "claude.har"
    entry = _only_entry(tooltap, path)
    turn = tooltap.api(f"/turns/{entry['_tooltap']['turn_id']}")
    assert (turn["path"], turn["route"]) == ("/claude/v1/messages?beta=true", "/claude")
    assert entry["request"]["url"] == f"{upstream.url}/api/v1/messages?beta=true"
    fresh = tmp_path / "fresh.db"
    _run("import", str(path), "--db", str(fresh))
    (again,) = _everything(f"sqlite:///{fresh}")
    assert again["turns"][0]["path"] == "/claude/v1/messages?beta=true"
