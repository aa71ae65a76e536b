"""Live replay end to end: a session recorded through a real tooltap, replayed by the real
CLI against real local upstreams that speak OpenAI chat, Anthropic or Gemini."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest
from click.testing import CliRunner

from proxy.cli import main
from proxy.replay.live import LiveError, replay_live
from proxy.replay.recording import RecordedTurn, Recording
from proxy.replay.result import render_text
from proxy.scripted import Reply, ScriptedUpstream
from tests.conftest import CLINE, Server, free_port
from tests.test_proxy_e2e import play_cline

KEY = "sk-replay-test-key-0123456789"
NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def recorded_calls() -> list[list[tuple[str, dict]]]:
    """The tool calls of the four cline-weather turns: [(name, arguments)] per turn."""
    out = []
    for n in (1, 2, 3):
        message = json.loads((CLINE / f"turn{n}" / "expected_completion.json").read_text())["choices"][0]["message"]
        out.append([(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]])
    return out + [[]]


CALLS = recorded_calls()


def with_latitude(calls, latitude):
    return [(name, {**args, "latitude": latitude} if "get_forecast" in name else args) for name, args in calls]


# -- answers in each API, streamed or not --------------------------------------------------

def sse(events: list, named: bool = False) -> Reply:
    body = b"".join((f"event: {e['type']}\n" if named else "").encode() + b"data: " +
                    json.dumps(e, ensure_ascii=False).encode() + b"\n\n" for e in events)
    return Reply.sse(body, split=50)


def openai_answer(calls, stream: bool) -> Reply:
    tool_calls = [{"id": f"call_{i}", "type": "function",
                   "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}
                  for i, (name, args) in enumerate(calls)]
    if not stream:
        message = {"role": "assistant", "content": None if calls else "Sunny."}
        if tool_calls:
            message["tool_calls"] = tool_calls
        return Reply.json({"id": "r", "object": "chat.completion", "model": "m",
                           "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})
    chunks = [{"id": "r", "object": "chat.completion.chunk", "model": "m",
               "choices": [{"index": 0, "delta": {"role": "assistant", "content": "" if calls else "Sunny."}}]}]
    for i, c in enumerate(tool_calls):
        args = c["function"]["arguments"]
        chunks.append({"id": "r", "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": i, "id": c["id"], "type": "function", "function": {"name": c["function"]["name"], "arguments": ""}}]}}]})
        for piece in (args[:7], args[7:]):  # arguments arrive in fragments
            chunks.append({"id": "r", "choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": i, "function": {"arguments": piece}}]}}]})
    chunks.append({"id": "r", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls" if calls else "stop"}]})
    reply = sse(chunks)
    reply.chunks.append(b"data: [DONE]\n\n")
    return reply


def anthropic_answer(calls, stream: bool) -> Reply:
    blocks = [{"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": args} for i, (name, args) in enumerate(calls)]
    blocks = blocks or [{"type": "text", "text": "Sunny."}]
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test", "content": blocks,
               "stop_reason": "tool_use" if calls else "end_turn", "usage": {"input_tokens": 5, "output_tokens": 1}}
    if not stream:
        return Reply.json(message)
    events = [{"type": "message_start", "message": {**message, "content": []}}]
    for i, b in enumerate(blocks):
        if b["type"] == "text":
            events += [{"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}},
                       {"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": b["text"]}}]
        else:
            raw = json.dumps(b["input"], ensure_ascii=False)
            events.append({"type": "content_block_start", "index": i, "content_block": {**b, "input": {}}})
            events += [{"type": "content_block_delta", "index": i, "delta": {"type": "input_json_delta", "partial_json": p}}
                       for p in (raw[:5], raw[5:])]
        events.append({"type": "content_block_stop", "index": i})
    events += [{"type": "ping"}, {"type": "message_delta", "delta": {"stop_reason": message["stop_reason"]},
                                  "usage": {"output_tokens": 9}}, {"type": "message_stop"}]
    return sse(events, named=True)


def gemini_answer(calls, stream: bool) -> Reply:
    parts = [{"functionCall": {"name": name, "args": args}} for name, args in calls] or [{"text": "Sunny."}]
    if not stream:
        return Reply.json({"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP"}]})
    events = [{"candidates": [{"content": {"role": "model", "parts": [p]}, "index": 0}]} for p in parts]
    events[-1]["candidates"][0]["finishReason"] = "STOP"
    return sse(events)


# -- what a valid request of each API looks like --------------------------------------------

def openai_problems(body: dict) -> list[str]:
    problems, expected_ids = [], []
    for m in body["messages"]:
        if m["role"] == "tool":
            if not expected_ids or m["tool_call_id"] != expected_ids.pop(0):
                problems.append(f"tool message {m['tool_call_id']} answers no pending call")
        elif expected_ids:
            problems.append(f"calls {expected_ids} got no tool message")
        if m["role"] == "assistant":
            expected_ids = [c["id"] for c in m.get("tool_calls") or []]
    return problems


def anthropic_problems(body: dict) -> list[str]:
    problems = []
    if not isinstance(body.get("max_tokens"), int) or not body.get("model"):
        problems.append("model and max_tokens are required")
    if "You are Cline" not in json.dumps(body.get("system")) and body.get("system") != "Be brief.":
        problems.append("no system prompt")
    if any(m["role"] == "system" for m in body["messages"]):
        problems.append("a system role in messages")
    for tool in body.get("tools") or []:
        if not NAME.match(tool["name"]) or tool["input_schema"].get("type") != "object":
            problems.append(f"bad tool {tool.get('name')}")
    pending: list[str] = []
    for i, m in enumerate(body["messages"]):
        if m["role"] != ("user" if i % 2 == 0 else "assistant"):
            problems.append(f"messages[{i}]: roles must alternate from user")
        blocks = m["content"] if isinstance(m["content"], list) else [{"type": "text", "text": m["content"]}]
        if m["role"] == "user":
            results = [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]
            if results != pending or any(b["type"] == "tool_result" for b in blocks[len(results):]):
                problems.append(f"messages[{i}]: tool_result blocks {results} must open the turn and answer {pending}")
            pending = []
        else:
            pending = [b["id"] for b in blocks if b["type"] == "tool_use"]
        if any(b["type"] == "text" and not b["text"] for b in blocks):
            problems.append(f"messages[{i}]: an empty text block")
    return problems


def gemini_problems(body: dict) -> list[str]:
    problems = []
    if not re.search("You are Cline|Be brief", json.dumps(body.get("systemInstruction"))):
        problems.append("no systemInstruction")
    for decl in body["tools"][0]["functionDeclarations"]:
        if "additionalProperties" in json.dumps(decl) or '"type": "object"' in json.dumps(decl):
            problems.append(f"{decl['name']}: not Gemini's schema subset")
    pending: list[str] = []
    for i, c in enumerate(body["contents"]):
        if c["role"] != ("user" if i % 2 == 0 else "model"):
            problems.append(f"contents[{i}]: roles must alternate from user")
        if c["role"] == "user":
            answered = [p["functionResponse"]["name"] for p in c["parts"] if "functionResponse" in p]
            if answered != pending:
                problems.append(f"contents[{i}]: functionResponse {answered} must answer {pending}")
            pending = []
        else:
            pending = [p["functionCall"]["name"] for p in c["parts"] if "functionCall" in p]
    return problems


def speaking(api: str, answers, problems=None):
    """A route: check the request is valid for `api`, answer the calls `answers(turn, body)`
    returns for the turn the request is (counted by assistant messages), streamed when asked."""
    answer = {"openai": openai_answer, "anthropic": anthropic_answer, "gemini": gemini_answer}[api]

    def route(req):
        body = req.json()
        found = (problems or (lambda b: []))(body)
        if found:
            return Reply.json({"error": {"message": "; ".join(found)}}, status=400)
        turn = sum(1 for m in body.get("messages") or body.get("contents") if m["role"] in ("assistant", "model"))
        stream = body.get("stream") is True or req.path.endswith(":streamGenerateContent")
        return answer(answers(turn, body), stream)
    return route


@contextlib.contextmanager
def serve(routes):
    scripted = ScriptedUpstream(routes)
    with Server(scripted) as server:
        scripted.url = server.url
        yield scripted


def record_cline(tooltap, upstream) -> str:
    play_cline(tooltap, upstream)
    tooltap.flush()
    (session,) = tooltap.api("/sessions")["sessions"]
    return session["id"]


def replay(tooltap, session, url, *args):
    result = CliRunner().invoke(main, ["replay", "session", session, "--db", f"sqlite:///{tooltap.db_path}",
                                       "--against", url, *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


# -- against an OpenAI-compatible endpoint ------------------------------------------------

def test_same_answers_pass_and_the_key_goes_in_its_header(tooltap, upstream):
    session = record_cline(tooltap, upstream)
    first = tooltap.api(f"/sessions/{session}")["turns"][0]["id"]
    stored = dict(tooltap.api(f"/turns/{first}")["request_headers"])["authorization"]
    assert stored.startswith("Bearer …") and "#" in stored  # what the store keeps: a fingerprint
    with serve({"/v1/chat/completions": speaking("openai", lambda n, b: CALLS[n], openai_problems)}) as target:
        result = replay(tooltap, session, target.url + "/v1", "--api-key", KEY, "-H", "X-Trace: replay-1")
        assert result.exit_code == 0, result.output
        assert "4 of 4 turns identical" in result.output
        assert "weather/get_forecast" in result.output  # the Cline MCP name, decoded
        assert len(target.received) == 4
        for got, n in zip(target.received, (1, 2, 3, 4)):
            recorded = json.loads((CLINE / f"turn{n}" / "request.json").read_text())
            assert got.json() == recorded  # the recorded history, not the new model's answers
            assert got.header("authorization") == f"Bearer {KEY}"
            assert got.header("x-trace") == "replay-1"
            assert stored.split()[1] not in " ".join(v for _, v in got.headers)  # never forwarded

        # Without --api-key no credential is sent at all (the stored one is a fingerprint).
        assert replay(tooltap, session, target.url + "/v1", "--model", "other-model").exit_code == 0
        assert all(r.header("authorization") is None for r in target.received[4:])
        assert {r.json()["model"] for r in target.received[4:]} == {"other-model"}

        # The URL's query goes with every request (Azure's api-version, a ?key=), shown and
        # kept with its key fingerprinted.
        google = "AIzaSy" + "Q" * 33
        result = replay(tooltap, session, f"{target.url}/v1?api-version=2024-10-21&key={google}", "--record-run")
        assert result.exit_code == 0, result.output
        assert {r.query for r in target.received[8:]} == {f"api-version=2024-10-21&key={google}"}
        assert google not in result.output and "?api-version=2024-10-21&key=…QQQQ#" in result.output
        stored = b"".join(p.read_bytes() for p in tooltap.db_path.parent.glob("tooltap*.db*"))
        assert b"api-version=2024-10-21&key=" in stored and google.encode() not in stored  # the run, its key hidden


def test_other_arguments_fail_naming_turn_tool_and_path(tooltap, upstream):
    session = record_cline(tooltap, upstream)
    turn_ids = [t["id"] for t in tooltap.api(f"/sessions/{session}")["turns"]]
    moved = lambda n, b: with_latitude(CALLS[n], 40.7128)  # noqa: E731
    with serve({"/chat/completions": speaking("openai", moved)}) as target:
        result = replay(tooltap, session, target.url)
        assert result.exit_code == 1, result.output
        line = next(ln for ln in result.output.splitlines() if "$.latitude" in ln)
        assert "get_forecast" in line and "38.9072" in line and "40.7128" in line
        assert f"DIFF turn 3 (#{turn_ids[2]}): weather/get_forecast" in result.output
        assert "3 of 4 turns identical; 1 differs" in result.output

        data = json.loads(replay(tooltap, session, target.url, "--format", "json").output)
        (diff,) = [d for t in data["turns"] for d in t["differences"]]
        assert (diff["kind"], diff["path"], diff["expected"], diff["actual"]) == ("argument", "$.latitude", 38.9072, 40.7128)

        # The argument modes and ignored paths change the verdict as documented.
        ignored = replay(tooltap, session, target.url, "--ignore-arg", "latitude")
        assert ignored.exit_code == 0 and "4 of 4 turns match" in ignored.output  # not identical: latitude differs
        assert replay(tooltap, session, target.url, "--ignore-arg", "get_forecast:$.latitude").exit_code == 0
        assert replay(tooltap, session, target.url, "--ignore-arg", "read_file:latitude").exit_code == 1
        assert replay(tooltap, session, target.url, "--tool-args", "get_forecast=ignore").exit_code == 0
        assert replay(tooltap, session, target.url, "--args", "subset").exit_code == 1


def test_task_progress_and_argument_modes(tooltap, upstream):
    session = record_cline(tooltap, upstream)

    def without_progress(n, body):
        return [(name, {k: v for k, v in args.items() if k != "task_progress"}) for name, args in CALLS[n]]

    def other_progress(n, body):
        return [(name, {**args, "task_progress": "- [ ] something else"}) for name, args in CALLS[n]]

    with serve({"/chat/completions": speaking("openai", without_progress)}) as target:
        exact = replay(tooltap, session, target.url)
        assert exact.exit_code == 1 and "missing from the replayed one" in exact.output and "$.task_progress recorded" in exact.output
        assert replay(tooltap, session, target.url, "--args", "subset").exit_code == 0
        assert replay(tooltap, session, target.url, "--args", "superset").exit_code == 1
        assert replay(tooltap, session, target.url, "--ignore-arg", "task_progress").exit_code == 0
    with serve({"/chat/completions": speaking("openai", other_progress)}) as target:
        assert replay(tooltap, session, target.url, "--args", "subset").exit_code == 1
        assert replay(tooltap, session, target.url, "--ignore-arg", "task_progress").exit_code == 0


def test_other_tool_missing_and_extra_calls(tooltap, upstream):
    session = record_cline(tooltap, upstream)
    answers = {0: [("read_file", {"path": "x"})], 1: [], 2: CALLS[2] + [("cIya4J0mcp0get_alerts", {"state": "DC"})],
               3: []}
    with serve({"/chat/completions": speaking("openai", lambda n, b: answers[n])}) as target:
        out = replay(tooltap, session, target.url).output
        assert "the replay called 'read_file' where 'list_files' was recorded" in out
        assert "'read_file' was recorded, the replay did not call it" in out
        assert "the replay called 'weather/get_alerts', which was not recorded here" in out
        assert replay(tooltap, session, target.url, "--order", "superset",
                      "--ignore-arg", "path").exit_code == 1  # turn 2 is still missing its call


def test_repeat_reports_pass_hat_k(tooltap, upstream):
    session = record_cline(tooltap, upstream)
    tries = {"n": 0}

    def flaky(n, body):
        if n == 2:
            tries["n"] += 1
            if tries["n"] == 2:  # one of three tries of the forecast turn answers otherwise
                return with_latitude(CALLS[n], 0)
        return CALLS[n]

    with serve({"/chat/completions": speaking("openai", flaky)}) as target:
        result = replay(tooltap, session, target.url, "--repeat", "3")
        assert result.exit_code == 1, result.output
        assert len(target.received) == 12
        assert "(2/3 runs passed)" in result.output and "pass^3 = 0.75" in result.output
        assert "run 2 of 3: call 0 'weather/get_forecast': $.latitude recorded 38.9072, replayed 0" in result.output


def test_unreachable_endpoint_and_http_errors_are_turn_errors(tooltap, upstream):
    session = record_cline(tooltap, upstream)
    result = replay(tooltap, session, f"http://127.0.0.1:{free_port()}")
    assert result.exit_code == 1
    assert result.output.count("error: ConnectError") == 4 and result.output.count("  ERR  turn") == 4
    # nothing came back to compare: said apart from answers that differ
    assert "0 of 4 turns identical; 4 could not be replayed (errors)" in result.output and "differ" not in result.output

    replies = [speaking("openai", lambda n, b: CALLS[n])] * 4
    replies[1] = Reply.json({"error": {"message": "model overloaded"}}, status=529)
    replies[2] = Reply.json({"error": {"message": "quota exceeded"}})  # an error sent with 200
    with serve({"/chat/completions": replies}) as target:
        result = replay(tooltap, session, target.url)
        assert result.exit_code == 1 and len(target.received) == 4  # the run went on
        assert "HTTP 529" in result.output and "model overloaded" in result.output
        assert "quota exceeded" in result.output
        assert "2 of 4 turns identical; 2 could not be replayed (errors)" in result.output


def test_an_endpoint_that_says_nothing_is_given_up_after_the_read_timeout(tooltap, upstream):
    session = record_cline(tooltap, upstream)
    silent = [Reply.json({"choices": []}, wait=3)] * 4
    with serve({"/chat/completions": silent}) as target:
        started = time.monotonic()
        result = replay(tooltap, session, target.url, "--read-timeout", "0.3")
        assert time.monotonic() - started < 10  # four turns of 0.3 s, not of the default 600
    assert result.exit_code == 1
    assert result.output.count(f"ReadTimeout from {target.url}/chat/completions: nothing came for 0.3 s "
                               "(--read-timeout)") == 4, result.output
    refused = CliRunner().invoke(main, ["replay", "session", session, "--db", f"sqlite:///{tooltap.db_path}",
                                        "--recorded", "--read-timeout", "5"])
    assert refused.exit_code == 2 and "--read-timeout only applies with --against URL" in refused.output


def test_ctrl_c_reports_the_turns_compared_before_it(tooltap, upstream):
    """A long live run stopped by Ctrl-C: what was compared is printed, then how far it got,
    exit 130; nothing is saved."""
    session = record_cline(tooltap, upstream)
    replies = [speaking("openai", lambda n, b: CALLS[n]), Reply.json({"choices": []}, wait=30)] * 2
    with serve({"/chat/completions": replies}) as target:
        proc = subprocess.Popen([sys.executable, "-m", "proxy", "replay", "session", session, "--record-run",
                                 "--db", f"sqlite:///{tooltap.db_path}", "--against", target.url],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                # as from a shell: an earlier test of this run may have left SIGINT ignored
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline = time.monotonic() + 30
        while len(target.received) < 2 and time.monotonic() < deadline:  # the second turn is waiting
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, out + err
    assert f"ok   turn 1 (#" in out and "turn 2" not in out and "1 of 1 turns identical" in out
    assert err.strip().splitlines()[-1] == "tooltap replay: interrupted (Ctrl-C) after 1 of 4 turns; no run was saved"
    assert "Traceback" not in err
    assert tooltap.api(f"/sessions/{session}/replays")["runs"] == []


def test_a_bad_url_is_one_line_and_exit_2(tooltap, upstream):
    session = record_cline(tooltap, upstream)
    for url in ("ftp://example.test", "not a url", "http://"):
        result = replay(tooltap, session, url)
        assert result.exit_code == 2
        assert "Traceback" not in result.output and f"--against {url!r}" in result.output
        assert len([ln for ln in result.output.splitlines() if ln.strip()]) == 1


def test_to_on_a_session_it_cannot_translate_is_refused_before_anything_is_sent(tooltap, upstream):
    upstream.routes["/v1/responses"] = Reply.json({"id": "resp_1", "object": "response", "status": "completed",
                                                   "output": [], "model": "m"})
    r = httpx.post(f"{tooltap.url}/v1/responses", json={"model": "m", "input": "hi"},
                   headers={"x-tooltap-session": "resp"})
    assert r.status_code == 200
    tooltap.flush()
    with serve({}) as target:
        for to in ("anthropic", "openai"):
            result = replay(tooltap, "resp", target.url, "--to", to)
            assert result.exit_code == 2 and target.received == [], result.output
            assert f"--to {to}: openai.responses requests cannot be translated" in result.output
            assert len([ln for ln in result.output.splitlines() if ln.strip()]) == 1


# -- translated: the Cline (OpenAI chat) session to Anthropic and to Gemini ------------------

def test_translated_to_anthropic(tooltap, upstream):
    session = record_cline(tooltap, upstream)
    with serve({"/v1/messages": speaking("anthropic", lambda n, b: CALLS[n], anthropic_problems)}) as target:
        result = replay(tooltap, session, target.url, "--to", "anthropic", "--model", "claude-test",
                        "--api-key", KEY)
        assert result.exit_code == 0, result.output
        assert "4 of 4 turns identical" in result.output
        first, last = target.received[0], target.received[3]
        assert first.header("x-api-key") == KEY and first.header("anthropic-version") == "2023-06-01"
        assert first.header("authorization") is None
        body = last.json()
        assert body["model"] == "claude-test" and body["stream"] is True
        assert body["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
        assert len(body["tools"]) == 15 and body["messages"][-1]["content"][0]["type"] == "tool_result"
        assert "lost in translation" not in result.output  # nothing Anthropic cannot carry

        # A URL with /v1 already reaches the same endpoint.
        assert replay(tooltap, session, target.url + "/v1/", "--to", "anthropic").exit_code == 0


def test_translated_to_gemini_reports_what_was_lost(tooltap, upstream):
    session = record_cline(tooltap, upstream)
    moved = lambda n, b: with_latitude(CALLS[n], 40.7128)  # noqa: E731
    path = "/v1beta/models/gemini-test:streamGenerateContent"
    with serve({path: speaking("gemini", lambda n, b: CALLS[n], gemini_problems)}) as target:
        result = replay(tooltap, session, target.url, "--to", "gemini", "--model", "gemini-test", "--api-key", KEY)
        assert result.exit_code == 0, result.output
        got = target.received[2]
        assert got.query == "alt=sse" and got.header("x-goog-api-key") == KEY and got.header("authorization") is None
        assert "lost in translation: parallel_tool_calls = false" in result.output
        assert "14 tools ask_followup_question" in result.output and "additionalProperties" in result.output
        result = replay(tooltap, session, target.url + "?x-proxy=1", "--to", "gemini", "--model", "gemini-test")
        assert result.exit_code == 0 and target.received[-1].query == "alt=sse&x-proxy=1"  # both
        target.routes[path] = speaking("gemini", moved, gemini_problems)
        result = replay(tooltap, session, target.url, "--to", "gemini", "--model", "gemini-test")
        assert result.exit_code == 1 and "$.latitude recorded 38.9072, replayed 40.7128" in result.output


# -- an Anthropic session, not streamed -----------------------------------------------------

WEATHER_TOOL = {"name": "get weather", "description": "Weather for a city.",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def record_anthropic(tooltap, upstream) -> str:
    """Two non-streamed Anthropic turns with a tool whose name OpenAI and Anthropic reject."""
    call = {"type": "tool_use", "id": "toolu_1", "name": "get weather", "input": {"city": "Paris"}}
    upstream.routes["/v1/messages"] = [
        Reply.json({"id": "m1", "type": "message", "role": "assistant", "content": [call], "stop_reason": "tool_use"}),
        Reply.json({"id": "m2", "type": "message", "role": "assistant", "content": [{"type": "text", "text": "Mild."}],
                    "stop_reason": "end_turn"}),
    ]
    first = [{"role": "user", "content": "Weather in Paris?"}]
    second = first + [{"role": "assistant", "content": [call]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "12C"}]}]
    for messages in (first, second):
        r = httpx.post(f"{tooltap.url}/v1/messages", timeout=10, json={
            "model": "claude-old", "max_tokens": 100, "system": "Be brief.", "tools": [WEATHER_TOOL],
            "messages": messages}, headers={"x-api-key": "sk-ant-stored-secret-0123456789",
                                            "anthropic-version": "2023-06-01", "anthropic-beta": "tools-2024"})
        assert r.status_code == 200
    tooltap.flush()
    (session,) = tooltap.api("/sessions")["sessions"]
    return session["id"]


def test_anthropic_session_replayed_as_recorded_and_to_openai(tooltap, upstream):
    session = record_anthropic(tooltap, upstream)
    answers = lambda n, b: [("get weather", {"city": "Paris"})] if n == 0 else []  # noqa: E731
    as_recorded = lambda b: [p for p in anthropic_problems(b) if not p.startswith("bad tool")]  # noqa: E731
    with serve({"/v1/messages": speaking("anthropic", answers, as_recorded)}) as target:
        result = replay(tooltap, session, target.url)
        assert result.exit_code == 0, result.output
        got = target.received[0]
        assert got.header("x-api-key") is None  # the stored key is a fingerprint: never sent
        assert got.header("anthropic-beta") == "tools-2024" and got.header("anthropic-version") == "2023-06-01"
        assert "stream" not in got.json()  # recorded without streaming, replayed so

    renamed = lambda n, b: [("get_weather", {"city": "Paris"})] if n == 0 else []  # noqa: E731
    with serve({"/chat/completions": speaking("openai", renamed, openai_problems)}) as target:
        result = replay(tooltap, session, target.url, "--to", "openai", "--model", "gpt-test")
        assert result.exit_code == 0, result.output  # get_weather maps back to "get weather"
        body = target.received[1].json()
        assert body["messages"][0] == {"role": "system", "content": "Be brief."}
        assert body["messages"][2]["tool_calls"][0]["function"]["name"] == "get_weather"
        assert body["messages"][3] == {"role": "tool", "tool_call_id": "toolu_1", "content": "12C"}
        assert "stream" not in body and body["max_tokens"] == 100
        assert "renamed to 'get_weather'" in result.output

    with serve({"/v1beta/models/gemini-test:generateContent": speaking("gemini", renamed, gemini_problems)}) as target:
        result = replay(tooltap, session, target.url + "/v1beta", "--to", "gemini", "--model", "gemini-test")
        assert result.exit_code == 0, result.output  # not streamed: :generateContent, a JSON answer
        assert target.received[1].json()["contents"][2] == {"role": "user", "parts": [
            {"functionResponse": {"name": "get_weather", "response": {"output": "12C"}}}]}


def test_turns_that_are_not_conversations_are_skipped(upstream):
    def turn(id, api, path, request, calls=()):
        return RecordedTurn(id=id, parent_id=None, api=api, method="POST" if request else "GET", path=path,
                            status="ok", http_status=200, stream=False, model="m", request=request,
                            request_headers=[], response=None, response_headers=[], raw=b"", content_type=None,
                            content_encoding=None, timeline=[], ttft_ms=None, duration_ms=None,
                            calls=list(calls), decoding=None)

    recording = Recording("s1", None, None, [
        turn(1, "other", "/v1/models", None),
        turn(2, "openai.chat", "/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    ])
    upstream.routes["/chat/completions"] = speaking("openai", lambda n, b: [])
    result = replay_live(recording, upstream.url)
    assert result.ok and [t.note for t in result.turns] == ["skipped: not a conversation (GET /v1/models)", None]
    assert render_text(result).splitlines()[-1] == "1 of 2 turns identical, 1 skipped"
    assert result.turns[1].runs == [True] and len(upstream.received) == 1
    with pytest.raises(LiveError):
        replay_live(recording, "file:///etc/passwd")


def test_a_session_with_nothing_to_compare_does_not_pass(tooltap, upstream):
    """Its only turn failed when recorded: skipped, so not identical, and the run, which
    compared nothing, exits 1."""
    upstream.routes["/chat/completions"] = Reply.json({"error": {"message": "overloaded"}}, status=503)
    r = httpx.post(f"{tooltap.url}/chat/completions",
                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 503
    tooltap.flush()
    (session,) = tooltap.api("/sessions")["sessions"]
    with serve({"/chat/completions": speaking("openai", lambda n, b: [])}) as target:
        result = replay(tooltap, session["id"], target.url)
        assert not target.received
    assert result.exit_code == 1, result.output
    assert "skip turn 1 (#1): no tool calls" in result.output and "did not succeed (upstream_error)" in result.output
    assert result.output.splitlines()[-1] == "0 of 1 turns identical, 1 skipped; no turn was compared"


def test_send_reads_every_answer_shape(upstream):
    from proxy.replay.live import Prepared, ReplayFailure, send

    call = {"functionCall": {"name": "f", "args": {"a": 1}}}
    upstream.routes["/array"] = Reply.json([{"candidates": [{"content": {"role": "model", "parts": [{"text": "x"}]}}]},
                                            {"candidates": [{"content": {"role": "model", "parts": [call]}}]}])
    upstream.routes["/broken"] = Reply.sse(b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
                                           b'data: {"error":{"message":"overloaded mid-stream"}}\n\n')
    upstream.routes["/text"] = Reply(200, [("content-type", "text/plain")], [b"hello"])
    with httpx.Client() as client:
        gemini = send(client, Prepared("gemini", upstream.url + "/array", {}, {}))
        assert gemini["candidates"][0]["content"]["parts"] == [{"text": "x"}, call]
        with pytest.raises(ReplayFailure, match="overloaded mid-stream"):
            send(client, Prepared("openai.chat", upstream.url + "/broken", {}, {}))
        with pytest.raises(ReplayFailure, match="not JSON: 'hello'"):
            send(client, Prepared("openai.chat", upstream.url + "/text", {}, {}))


def test_an_answer_in_another_api_s_format_is_named_as_such(tooltap, upstream):
    """`--to anthropic` against an endpoint that answers every POST as OpenAI chat: each
    turn says the answer is not Anthropic's, not that the model made no tool call."""
    session = record_cline(tooltap, upstream)
    with serve({"/v1/messages": [speaking("openai", lambda n, b: CALLS[n])] * 4}) as target:
        result = replay(tooltap, session, target.url, "--to", "anthropic")
        assert result.exit_code == 1, result.output
        assert result.output.count("is not in anthropic.messages format (no 'id')") == 4, result.output
        assert "the replay did not call it" not in result.output


def test_a_run_nothing_came_back_from_is_not_said_to_differ():
    """The word a run gives itself, in the CLI's report and on the inspector's pages: turns
    whose every run errored could not be replayed; one real difference makes it differ."""
    from inspector_ui.replays import verdict
    from proxy.replay.result import ReplayResult, summary

    def turn(**given):
        return {"turn_id": 1, "ok": False, "error": None, "differences": [], "note": None, **given}

    errored = {"kind": "live", "session_id": "s", "target": "t", "ok": False,
               "turns": [turn(error="HTTP 429 from t: slow down"), turn(ok=True)]}
    differing = {**errored, "turns": [*errored["turns"], turn(differences=[{"field": "call 0", "reason": "other"}])]}
    # with --repeat, a turn that errored once and matched once was replayed: it is not "failed"
    flaky = {**errored, "turns": [turn(error="run 1 of 2: HTTP 429 from t", runs=[False, True])]}
    for report, word in ((errored, "could not replay"), (differing, "differs"), (flaky, "differs")):
        assert ReplayResult.from_dict(report).verdict == word
        assert verdict({"ok": False, "report": report}) == word
    assert "could not be replayed" not in summary(ReplayResult.from_dict(flaky))
