"""OpenTelemetry export: a Cline session recorded through a real tooltap reaches a real
OTLP/HTTP receiver (decoded with the official protobuf package) as GenAI spans, live from
the writer process and after the fact; a dead collector costs the proxy nothing."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time

import httpx
import pytest
from click.testing import CliRunner

from proxy.cli import main
from proxy.otel import traces_url
from proxy.otel.spans import StoredTurn, chat_span, trace_id, usage_attributes
from proxy.scripted import Reply
from tests.cline_db import recorded_cline_db
from tests.conftest import cline_turn, free_port
from tests.otlp_receiver import OtlpReceiver
from tests.test_proxy_e2e import play_cline

INTERNAL, CLIENT = 1, 3  # SpanKind in the OTLP protobuf
CONTENT_KEYS = ("gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions",
                "gen_ai.tool.definitions", "gen_ai.tool.call.arguments", "gen_ai.tool.call.result")


@pytest.fixture
def receiver():
    with OtlpReceiver() as r:
        yield r


def _by_kind(spans):
    chats = sorted((s for s in spans if s.kind == CLIENT), key=lambda s: s.attributes["tooltap.turn.id"])
    tools = sorted((s for s in spans if s.kind == INTERNAL), key=lambda s: s.attributes["tooltap.turn.id"])
    return chats, tools


def test_live_export_of_a_cline_session(receiver, monkeypatch, make_tooltap, upstream):
    monkeypatch.setenv("TOOLTAP_OTLP_ENDPOINT", traces_url(receiver.url))
    monkeypatch.delenv("TOOLTAP_OTLP_CONTENT", raising=False)
    tooltap = make_tooltap(upstream.url)  # its writer process starts with these settings
    play_cline(tooltap, upstream)
    session_id = tooltap.api("/sessions")["sessions"][0]["id"]
    turns = tooltap.api(f"/sessions/{session_id}")["turns"]

    spans = receiver.wait_for(7)
    assert len(spans) == 7, [s.name for s in spans]
    chats, tools = _by_kind(spans)
    assert [s.name for s in chats] == ["chat deepseek-chat"] * 4
    assert [s.name for s in tools] == ["execute_tool list_files", "execute_tool read_file",
                                       "execute_tool get_forecast"]
    # One trace for the session, named by its id; turns are roots, calls their children.
    assert {s.trace_id for s in spans} == {f"{trace_id(session_id):032x}"}
    assert all(s.parent_span_id == "" for s in chats)
    chat_of_turn = {s.attributes["tooltap.turn.id"]: s for s in chats}
    for tool in tools:
        parent = chat_of_turn[tool.attributes["tooltap.turn.id"]]
        assert tool.parent_span_id == parent.span_id
        assert tool.start_ns == parent.end_ns  # from the model's answer...
    for tool, next_chat in zip(tools, chats[1:]):  # ...to the agent's next request
        assert tool.end_ns == next_chat.start_ns and tool.end_ns >= tool.start_ns

    for n, chat in enumerate(chats):
        a = chat.attributes
        assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "openai"
        assert a["gen_ai.request.model"] == "deepseek-chat" and a["gen_ai.response.model"] == "deepseek-chat"
        assert a["gen_ai.conversation.id"] == session_id and a["gen_ai.agent.name"] == "cline"
        assert a["gen_ai.response.finish_reasons"] == (["tool_calls"] if n < 3 else ["stop"])
        assert a["tooltap.turn.id"] == turns[n]["id"]
        if n < 3:
            usage = cline_turn(n + 1)["expected"]["usage"]
            assert a["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
            assert a["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
            assert a["gen_ai.usage.cache_read.input_tokens"] == usage["prompt_tokens_details"]["cached_tokens"]
            assert a["gen_ai.response.id"] == cline_turn(n + 1)["expected"]["id"]
        assert a["gen_ai.response.time_to_first_chunk"] > 0
        assert chat.status_code == 0 and chat.resource["service.name"] == "tooltap" and chat.scope == "tooltap"

    mcp = tools[2].attributes
    expected_call = cline_turn(3)["expected"]["choices"][0]["message"]["tool_calls"][0]
    assert mcp["gen_ai.tool.name"] == "get_forecast" and mcp["gen_ai.tool.type"] == "extension"
    assert mcp["tooltap.mcp.server"] == "weather" and mcp["mcp.method.name"] == "tools/call"
    assert mcp["tooltap.tool.raw_name"] == "cIya4J0mcp0get_forecast"
    assert mcp["gen_ai.tool.call.id"] == expected_call["id"]
    assert mcp["tooltap.tool.result_status"] == "ok"  # the next request carried its result
    assert (mcp["tooltap.task_progress.done"], mcp["tooltap.task_progress.total"]) == (2, 4)
    assert tools[0].attributes["gen_ai.tool.type"] == "function"
    # Content is opt-in: none of it left tooltap.
    assert not [k for s in spans for k in s.attributes if k in CONTENT_KEYS]


def test_serve_otlp_endpoint_reaches_the_writer_process(receiver, upstream, tmp_path):
    """`tooltap serve --otlp-endpoint`, as a user runs it (a process of its own)."""
    turns = [cline_turn(n) for n in (1, 2, 3)]
    upstream.routes["/chat/completions"] = [Reply.sse(t["sse"]) for t in turns]
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--upstream", upstream.url, "--port", str(port),
         "--db", str(tmp_path / "t.db"), "--otlp-endpoint", receiver.url],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                httpx.get(f"{base}/_tooltap/api/health", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        for t in turns:
            r = httpx.post(f"{base}/chat/completions", content=t["request"], timeout=10,
                           headers={"content-type": "application/json"})
            assert r.status_code == 200 and r.content == t["sse"]
        spans = receiver.wait_for(3)
        assert sorted(s.name for s in spans)[:3] == ["chat deepseek-chat"] * 3
        assert {s.attributes["gen_ai.conversation.id"] for s in spans} == {
            httpx.get(f"{base}/_tooltap/api/sessions").json()["sessions"][0]["id"]}
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0]
    assert f"tooltap: spans of stored turns to {receiver.url}/v1/traces" in out


def test_export_after_the_fact_with_and_without_content(receiver, tmp_path_factory):
    db, session_id = recorded_cline_db(tmp_path_factory)
    runner = CliRunner()
    plain = runner.invoke(main, ["otel", "export", "--db", str(db), "--otlp-endpoint", receiver.url])
    assert plain.exit_code == 0, plain.output
    assert plain.output.strip() == f"sent 7 span(s) of 1 session(s) to {receiver.url}/v1/traces"
    first = receiver.wait_for(7)
    assert not [k for s in first for k in s.attributes if k in CONTENT_KEYS]

    full = runner.invoke(main, ["otel", "export", session_id[:6], "--db", str(db), "--otlp-endpoint",  # its start
                                receiver.url + "/v1/traces", "--otlp-content"])
    assert full.exit_code == 0, full.output
    second = receiver.wait_for(14)[7:]
    # The same session sent again: the same trace and span ids, parents and all.
    assert sorted((s.trace_id, s.span_id, s.parent_span_id) for s in second) == \
        sorted((s.trace_id, s.span_id, s.parent_span_id) for s in first)
    chats, tools = _by_kind(second)
    third = chats[2].attributes
    inputs = json.loads(third["gen_ai.input.messages"])
    # Cline's history: each call answered "result missing", the real result in the next user message.
    assert [m["role"] for m in inputs] == ["user", "assistant", "tool", "user", "assistant", "tool", "user"]
    call = inputs[1]["parts"][-1]
    assert call["type"] == "tool_call" and call["name"] == "list_files"
    assert inputs[2]["parts"] == [{"type": "tool_call_response", "id": call["id"], "response": "result missing"}]
    assert json.loads(third["gen_ai.system_instructions"])[0]["content"].startswith("You are Cline")
    output = json.loads(third["gen_ai.output.messages"])
    assert output[0]["finish_reason"] == "tool_calls"
    assert output[0]["parts"][-1] == {"type": "tool_call", "id": tools[2].attributes["gen_ai.tool.call.id"],
                                      "name": "cIya4J0mcp0get_forecast",
                                      "arguments": json.loads(tools[2].attributes["gen_ai.tool.call.arguments"])}
    assert "get_forecast" in [t["name"].split("0mcp0")[-1] for t in json.loads(third["gen_ai.tool.definitions"])]
    mcp = tools[2].attributes
    assert json.loads(mcp["gen_ai.tool.call.arguments"])["latitude"] == 38.9072
    assert mcp["gen_ai.tool.call.result"].lstrip().startswith("Today:")
    assert "sk-cline-secret" not in json.dumps([s.attributes for s in second])

    # A session with no model turn to trace (the day's requests without a conversation):
    # not counted among the sessions sent, and said apart.
    from sqlmodel import Session as DB, create_engine

    from proxy.store.models import Session

    copy = tmp_path_factory.mktemp("otel") / "copy.db"  # the recorded database is shared: not written to
    shutil.copy(db, copy)
    with DB(create_engine(f"sqlite:///{copy}")) as s:
        s.add(Session(id="no-model-turns", started_at=1.0, last_at=1.0))
        s.commit()
    both = runner.invoke(main, ["otel", "export", "--db", str(copy), "--otlp-endpoint", receiver.url])
    assert both.exit_code == 0, both.output
    assert both.output.strip() == (f"sent 7 span(s) of 1 session(s) to {receiver.url}/v1/traces; "
                                   "1 session(s) held no model turn to trace")


@pytest.mark.parametrize("collector", ["refusing", "silent"])
def test_collector_down_the_proxy_answers_and_stores(collector, monkeypatch, make_tooltap, upstream):
    # "refusing": nothing listens. "silent": it takes connections and never answers, so
    # an export waits for its whole timeout, made long here.
    silent = socket.create_server(("127.0.0.1", 0), backlog=16)
    port = silent.getsockname()[1] if collector == "silent" else free_port()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "30")
    monkeypatch.setenv("TOOLTAP_OTLP_ENDPOINT", f"http://127.0.0.1:{port}/v1/traces")
    tooltap = make_tooltap(upstream.url)
    started = time.monotonic()
    turns, got = play_cline(tooltap, upstream)  # every answer is 200 and byte-exact
    played = time.monotonic() - started
    assert got[:3] == [t["sse"] for t in turns[:3]]
    session = tooltap.api("/sessions")["sessions"][0]
    assert session["turns"] == 4 and session["tool_calls"] == 3
    assert tooltap.api("/health")["status"] == "ok"
    # Stopping does not wait for the exporter to give up (30 s).
    time.sleep(1.5)  # a batch is on its way to the dead collector
    stopping = time.monotonic()
    tooltap.server.__exit__()
    assert time.monotonic() - stopping < 10, "the writer waited on a dead collector"
    assert played < 15
    silent.close()


def test_without_the_sdk_serve_and_export_say_what_to_install(monkeypatch, tmp_path):
    for name in ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http.trace_exporter"):
        monkeypatch.setitem(sys.modules, name, None)  # importing it raises ImportError
    runner = CliRunner()
    served = runner.invoke(main, ["serve", "--upstream", "http://127.0.0.1:9", "--db", str(tmp_path / "t.db"),
                                  "--otlp-endpoint", "http://127.0.0.1:4318"])
    assert served.exit_code == 2
    assert served.output.strip().splitlines() == [
        "Error: OpenTelemetry export needs the SDK and its OTLP exporter: pip install opentelemetry-sdk "
        "opentelemetry-exporter-otlp-proto-http (or '.[otel]' in tooltap's folder)"]
    exported = runner.invoke(main, ["otel", "export", "--db", str(tmp_path / "t.db"),
                                    "--otlp-endpoint", "http://127.0.0.1:4318"])
    assert exported.exit_code == 2 and "pip install opentelemetry-sdk" in exported.output


def test_export_errors_are_one_line(tmp_path_factory, tmp_path):
    db, _ = recorded_cline_db(tmp_path_factory)
    runner = CliRunner()
    dead = f"http://127.0.0.1:{free_port()}"
    down = runner.invoke(main, ["otel", "export", "--db", str(db), "--otlp-endpoint", dead])
    assert down.exit_code == 2 and len(down.output.strip().splitlines()) == 1
    assert f"no collector answers at {dead}/v1/traces (Connection refused): start it" in down.output
    unknown = runner.invoke(main, ["otel", "export", "nope", "--db", str(db), "--otlp-endpoint", dead])
    assert unknown.exit_code == 2 and "no session 'nope'" in unknown.output
    no_db = runner.invoke(main, ["otel", "export", "--db", str(tmp_path / "none.db"), "--otlp-endpoint", dead])
    assert no_db.exit_code == 2 and "no tooltap database" in no_db.output
    no_endpoint = runner.invoke(main, ["otel", "export", "--db", str(db)], env={"OTEL_EXPORTER_OTLP_ENDPOINT": ""})
    assert no_endpoint.exit_code == 2 and "--otlp-endpoint" in no_endpoint.output


def test_token_counts_follow_the_conventions():
    # Anthropic counts cache reads and writes apart from input_tokens; the conventions count them in.
    assert usage_attributes("anthropic.messages", {
        "input_tokens": 10, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 5, "output_tokens": 7,
    }) == {"gen_ai.usage.input_tokens": 115, "gen_ai.usage.output_tokens": 7,
                "gen_ai.usage.cache_read.input_tokens": 100, "gen_ai.usage.cache_creation.input_tokens": 5,
                "gen_ai.usage.reasoning.output_tokens": None}
    # Gemini counts thoughts apart from candidates; output tokens include reasoning.
    gemini = usage_attributes("gemini", {"promptTokenCount": 20, "candidatesTokenCount": 3, "thoughtsTokenCount": 9,
                                         "cachedContentTokenCount": 4})
    assert (gemini["gen_ai.usage.input_tokens"], gemini["gen_ai.usage.output_tokens"],
            gemini["gen_ai.usage.reasoning.output_tokens"], gemini["gen_ai.usage.cache_read.input_tokens"]) == (20, 12, 9, 4)
    assert traces_url("http://collector:4318") == "http://collector:4318/v1/traces"
    assert traces_url("http://collector:4318/v1/traces") == "http://collector:4318/v1/traces"


def test_an_error_answer_names_no_response_model():
    """A 429 is no model's answer: the span keeps the model asked and names none as the
    one that responded (the conventions' gen_ai.response.model)."""
    turn = StoredTurn(id=1, uid=None, session_id="s", parent_id=None, agent=None, api="openai.chat",
                      upstream="https://api.openai.com/v1", path="/chat/completions", model="gpt-4o",
                      status="upstream_error", http_status=429, error="rate limited", stream=False,
                      started_at=1.0, ttft_ms=None, duration_ms=5.0, usage=None,
                      response={"error": {"message": "rate limited"}}, params={"model": "gpt-4o"})
    attrs = chat_span(turn).attributes
    assert attrs["gen_ai.request.model"] == "gpt-4o" and attrs.get("gen_ai.response.model") is None
    assert attrs["error.type"] == "429"
    ok = chat_span(StoredTurn(**{**turn.__dict__, "status": "ok", "http_status": 200, "response": {}}))
    assert ok.attributes["gen_ai.response.model"] == "gpt-4o"  # answered, naming no model: the one asked


def test_images_audio_and_files_are_media_parts():
    """Each API's media blocks become the conventions' blob, uri and file parts; when the
    messages outgrow the attribute, the blobs' bytes are left out first and it stays JSON."""
    from proxy.otel import spans
    from proxy.otel.messages import input_messages

    png = {"type": "blob", "modality": "image", "mime_type": "image/png", "content": "iVBORw0KGgo="}
    chat = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "mp3"}},
        {"type": "file", "file": {"file_id": "file-abc"}}]}]}
    assert input_messages("openai.chat", chat)[1][0]["parts"][1:] == [
        png, {"type": "uri", "modality": "image", "mime_type": None, "uri": "https://example.com/cat.jpg"},
        {"type": "blob", "modality": "audio", "mime_type": "audio/mpeg", "content": "UklGRg=="},
        {"type": "file", "modality": "document", "mime_type": None, "file_id": "file-abc"}]
    anthropic = {"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
        {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}}]}]}
    assert input_messages("anthropic.messages", anthropic)[1][0]["parts"] == [
        png, {"type": "uri", "modality": "document", "mime_type": None, "uri": "https://example.com/a.pdf"}]
    gemini = {"contents": [{"role": "user", "parts": [
        {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}},
        {"fileData": {"mimeType": "video/mp4", "fileUri": "gs://b/v.mp4"}}]}]}
    assert input_messages("gemini", gemini)[1][0]["parts"] == [
        png, {"type": "uri", "modality": "video", "mime_type": "video/mp4", "uri": "gs://b/v.mp4"}]
    responses = {"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "and this?"}, {"type": "input_image", "file_id": "file-img"}]}]}
    assert input_messages("openai.responses", responses)[1][0]["parts"] == [
        {"type": "text", "content": "and this?"},
        {"type": "file", "modality": "image", "mime_type": None, "file_id": "file-img"}]

    big = [{"role": "user", "parts": [{"type": "text", "content": "look"},
                                      {**png, "content": "A" * (spans.CONTENT_MAX + 10)}]}]
    big[0]["parts"].append({"type": "tool_call", "name": "t", "arguments": {"type": "blob", "content": "kept"}})
    shown = json.loads(spans._json(big))
    assert shown[0]["parts"][0] == {"type": "text", "content": "look"}
    assert shown[0]["parts"][1]["content"] == ""
    assert shown[0]["parts"][1]["tooltap.content_omitted_chars"] == spans.CONTENT_MAX + 10
    assert shown[0]["parts"][2]["arguments"] == {"type": "blob", "content": "kept"}  # a tool's own, not a part


def test_a_cut_answer_s_calls_are_spans_only_when_the_agent_ran_them():
    from proxy.otel.spans import StoredCall, tool_spans

    calls = [StoredCall(0, "call_a", "read_file", None, '{"path": "a"}', result={"status": "ok", "text": "A"}),
             StoredCall(1, "call_b", "read_file", None, '{"pa')]  # cut in its arguments
    turn = StoredTurn(id=1, uid=None, session_id="s", parent_id=None, agent=None, api="openai.chat",
                      upstream="https://api.openai.com/v1", path="/chat/completions", model="m",
                      status="upstream_aborted", http_status=200, error="the upstream dropped the stream",
                      stream=True, started_at=1.0, ttft_ms=1.0, duration_ms=5.0, usage=None, response={},
                      params={}, calls=calls)
    assert [s.attributes["gen_ai.tool.call.id"] for s in tool_spans(turn)] == ["call_a"]
    whole = StoredTurn(**{**turn.__dict__, "status": "ok", "error": None})
    assert [s.attributes["gen_ai.tool.call.id"] for s in tool_spans(whole)] == ["call_a", "call_b"]


def test_content_over_the_limit_is_cut_inside_its_strings_and_stays_json():
    """A Cline session soon carries more than 256K characters (files the agent read): the
    longest strings are cut, each saying how long it was, so a collector still parses the
    messages and the arguments, and every message is kept."""
    from proxy.otel import spans
    from proxy.otel.spans import StoredCall, tool_spans

    limit = spans.CONTENT_MAX
    file_text = "line of a big file\n" * (limit // 10)  # about twice the limit, with escapes
    request = {"model": "m", "messages": [
        {"role": "system", "content": "You are Cline."},
        {"role": "user", "content": "read it"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path":"big.txt"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": file_text},
        {"role": "user", "content": "now summarise " + "x" * (limit // 2)}]}
    big_args = json.dumps({"path": "out.txt", "content": file_text})
    turn = StoredTurn(id=1, uid=None, session_id="s", parent_id=None, agent=None, api="openai.chat",
                      upstream="https://api.openai.com/v1", path="/chat/completions", model="m", status="ok",
                      http_status=200, error=None, stream=True, started_at=1.0, ttft_ms=1.0, duration_ms=5.0,
                      usage=None, request=request, response={"choices": [{"message": {"role": "assistant"}}]},
                      params={"model": "m"},
                      calls=[StoredCall(0, "c2", "write_to_file", None, big_args, result=None)])
    text = chat_span(turn, content=True).attributes["gen_ai.input.messages"]
    assert len(text) <= limit
    shown = json.loads(text)
    assert [m["role"] for m in shown] == ["user", "assistant", "tool", "user"]
    assert shown[0]["parts"] == [{"type": "text", "content": "read it"}]  # short ones untouched
    result = shown[2]["parts"][0]["response"]
    assert result.startswith("line of a big file\n") and result.endswith(
        f"... [cut by tooltap: {len(file_text)} characters]")
    assert shown[3]["parts"][0]["content"].startswith("now summarise xxx")
    args = tool_spans(turn, content=True)[0].attributes["gen_ai.tool.call.arguments"]
    assert len(args) <= limit
    assert json.loads(args)["path"] == "out.txt"
    # text heavy with escapes (code full of quotes and newlines) still fits as JSON
    code = '"quoted"\n\t' * (limit // 6)
    fitted = spans._json([{"role": "tool", "parts": [{"type": "text", "content": code}]}])
    assert len(fitted) <= limit and json.loads(fitted)[0]["parts"][0]["content"].startswith('"quoted"\n')
    # a lone surrogate a model wrote in long arguments is sent escaped: the exporter could not encode it
    lone = tool_spans(StoredTurn(**{**turn.__dict__, "calls": [StoredCall(
        0, "c3", "write_to_file", None, json.dumps({"content": "\ud800" + file_text}), result=None)]}),
        content=True)[0].attributes["gen_ai.tool.call.arguments"]
    assert lone.encode("utf-8") and json.loads(lone)["content"].startswith("\ud800line of a big file")
    # a JSON with no long strings to cut (thousands of short messages) is cut as text, as before
    many = [{"role": "user", "parts": [{"type": "text", "content": "short words"}]}] * (limit // 40)
    assert spans._json(many).endswith(" characters]") and len(spans._json(many)) > limit


def test_ctrl_c_says_what_was_sent_not_stored(tmp_path_factory, monkeypatch):
    """`otel export` stores nothing: stopped by Ctrl-C, it says where its spans went."""
    from proxy.otel import sdk

    db, _ = recorded_cline_db(tmp_path_factory)

    def interrupted(spans, url):
        next(iter(spans))
        raise KeyboardInterrupt

    monkeypatch.setattr(sdk, "send", interrupted)
    import signal

    # The command ignores a second Ctrl-C while it says so: not for the rest of this pytest run.
    monkeypatch.setattr(signal, "signal", lambda *args: None)
    out = CliRunner().invoke(main, ["otel", "export", "--db", str(db), "--otlp-endpoint", "http://127.0.0.1:9"])
    assert out.exit_code == 130
    assert out.output.strip() == ("Interrupted (Ctrl-C): stopped before it finished; "
                                  "the spans sent before it are at the collector.")


def test_a_collector_that_keeps_answering_503_is_named_with_its_status(tmp_path_factory):
    """The exporter retries a 503, then says only "timeout, max retries or shutdown": the
    one line says what the collector answered."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    import threading

    class Unavailable(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the http.server API
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self.send_response(503)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    db, _ = recorded_cline_db(tmp_path_factory)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Unavailable)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        out = CliRunner().invoke(main, ["otel", "export", "--db", str(db), "--otlp-endpoint", url])
    finally:
        server.shutdown()
    assert out.exit_code == 2 and len(out.output.strip().splitlines()) == 1, out.output
    assert f"the collector at {url}/v1/traces did not take the spans (Service Unavailable, still after retries)" \
        in out.output
