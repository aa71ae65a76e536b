"""Live replay: each stored request sent to another endpoint, its tool calls compared.

Every turn is sent as it was recorded: the recorded session, not the new model's
answers, is the context of every turn, so each turn's request is simply its stored body
(with `--model` swapped in, and translated when `--to` names another API). The answer's
tool calls are decoded the way the recording's were (Cline's `<uid>0mcp0<tool>` becomes
`weather/get_forecast`, a tool the target made us rename gets its recorded name back),
then compared with the recorded calls under the user's `Rules`.

Endpoints: URL is what the target API's own SDK takes as its base URL:
- OpenAI chat: `{URL}/chat/completions` (URL carries the version: `https://api.openai.com/v1`);
- Anthropic: `{URL}/v1/messages` (`https://api.anthropic.com`; a URL ending in /v1 is taken as is);
- Gemini: `{URL}/v1beta/models/{model}:generateContent` (`https://generativelanguage.googleapis.com`;
  a URL ending in a version segment is taken as is), `:streamGenerateContent?alt=sse` when streaming.

The recorded stream flag is kept: a replay exercises the path the agent used (some
servers answer differently, or only, when streaming), and a streamed answer is
reassembled by the same assemblers the proxy uses. Whatever the request asked, the
answer is read by its content type, so a server that ignores `stream` still works.

Credentials: stored headers hold fingerprints, never keys, so none is forwarded; the key
given here is sent the way the target expects, plus the user's `-H` headers.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable
from urllib.parse import urlencode

import httpx

from .. import apis
from ..agents.base import CallInput, TurnInput
from ..agents.session import decode_session
from ..secrets import redact_url
from ..sse import Event, SSEDecoder
from .compare import Call, Rules, compare_calls
from .recording import Recording, RecordedTurn, tool_key
from .result import Difference, ReplayResult, TurnVerdict
from .translate import API_NAMES, READERS, TranslationError, translate


class LiveError(Exception):
    """The replay cannot start (a bad URL); the message is one line for the user."""


READ_TIMEOUT = 600.0  # models think before they answer
CONNECT_TIMEOUT = 10.0
ANTHROPIC_VERSION = "2023-06-01"
# Recorded headers that carry the protocol, not the caller: forwarded when the API is kept.
PROTOCOL_HEADERS = {"anthropic.messages": ("anthropic-version", "anthropic-beta")}
_VERSION_SEGMENT = re.compile(r"/v\d+(?:alpha|beta)?\d*$")


@dataclass
class Target:
    """Where and how to send: the base URL, the API (None: as recorded), the model (None:
    as recorded), the key and the user's extra headers."""

    base: str
    to_api: str | None = None
    model: str | None = None
    api_key: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    params: list[tuple[str, str]] = field(default_factory=list)  # the URL's query (Azure's api-version)


@dataclass
class Prepared:
    """One turn's request, ready to send."""

    api: str  # the wire API it speaks
    url: str
    body: dict
    headers: dict[str, str]
    lost: list[str] = field(default_factory=list)
    renamed: dict[str, str] = field(default_factory=dict)  # as sent -> as recorded
    params: list[tuple[str, str]] = field(default_factory=list)  # added to the URL's own query


def replay_live(recording: Recording, url: str, *, model: str | None = None, to_api: str | None = None,
                repeat: int = 1, rules: Rules | None = None, api_key: str | None = None,
                headers: dict[str, str] | None = None, read_timeout: float = READ_TIMEOUT,
                advance: Callable[[], None] = lambda: None) -> ReplayResult:
    """Send each recorded turn `repeat` times to `url` and compare its tool calls;
    `advance` is called as each turn is done."""
    base, params = _base_url(url)
    if to_api:  # refused before anything is sent, not turn after turn
        untranslatable = sorted({t.api for t in recording.turns if apis.by_name(t.api) is not None
                                 and t.api != API_NAMES[to_api] and t.api not in READERS})
        if untranslatable:
            raise LiveError(f"--to {to_api}: {', '.join(untranslatable)} requests cannot be translated (from "
                            f"{', '.join(READERS)} only); replay this session without --to")
    target = Target(base, to_api, model, api_key, dict(headers or {}), params)
    rules = rules or Rules()
    shown = redact_url(f"{base}?{urlencode(params)}" if params else base)  # a ?key= is not kept
    label = shown + (f" as {to_api}" if to_api else "") + (f" with model {model}" if model else "")
    result = ReplayResult("live", recording.session_id, label, settings={
        "url": shown, "model": model, "to": to_api, "repeat": repeat, "order": rules.order,
        "args": rules.args, "per_tool": dict(rules.per_tool), "ignore": list(rules.ignore)})
    uids = _known_uids(recording)
    places = recording.places
    by_id = {t.id: t for t in recording.turns}
    seen_losses: set[str] = set()
    timeout = httpx.Timeout(read_timeout, connect=CONNECT_TIMEOUT)
    with httpx.Client(timeout=timeout, follow_redirects=False) as client:
        try:
            for turn in recording.turns:
                whole, missing = written_out(turn, by_id)
                verdict = _replay_turn(client, whole, target, repeat, rules, uids)
                verdict.lost = missing + verdict.lost
                verdict.place = places[turn.id]
                # Each loss is listed at the first turn it occurs in: the tools repeat every turn.
                new = [loss for loss in verdict.lost if loss not in seen_losses]
                seen_losses.update(verdict.lost)
                verdict.lost = new
                result.turns.append(verdict)
                advance()
        except KeyboardInterrupt:  # Ctrl-C in a long run: the turns compared so far are reported
            result.interrupted = True
    return result


def _base_url(url: str) -> tuple[str, list[tuple[str, str]]]:
    """The base every endpoint path goes after, and the query to send with each request."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as exc:
        raise LiveError(f"--against {url!r}: not a URL ({exc})") from exc
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise LiveError(f"--against {url!r}: give an http:// or https:// URL with a host")
    return str(parsed.copy_with(query=None, fragment=None)).rstrip("/"), list(parsed.params.multi_items())


def written_out(turn: RecordedTurn, by_id: dict[int, RecordedTurn]) -> tuple[RecordedTurn, list[str]]:
    """A turn whose request continues a conversation the server held (Responses
    `previous_response_id` or `conversation`), with that conversation put in from the
    recording, turn by turn up its parents: the endpoint replayed against holds none of
    it, and the recorded conversation is each turn's context. What began before the
    recording (a conversation made with items) is named as lost."""
    api = apis.by_name(turn.api)
    if api is None or not isinstance(turn.request, dict) or not api.continues(turn.request):
        return turn, []
    earlier, at, lost = [], turn, []
    while api.continues(at.request) and len(earlier) < len(by_id):
        parent = by_id.get(at.parent_id)
        if parent is None or not isinstance(parent.request, dict):
            lost.append(f"what came before {api.continues(at.request)} is not in the recording: replayed without it")
            break
        earlier.insert(0, (parent.request, parent.response or {}))
        at = parent
    return replace(turn, request=api.written_out(turn.request, earlier)), lost


def _known_uids(recording: Recording) -> dict[str, str]:
    """uid -> server as the recording resolved them (descriptions or result headers)."""
    out = {}
    for turn in recording.turns:
        for call in turn.calls:
            d = call.decoded or {}
            if d.get("uid") and d.get("resolved") and d.get("server"):
                out[d["uid"]] = d["server"]
    return out


def _replay_turn(client: httpx.Client, turn: RecordedTurn, target: Target, repeat: int, rules: Rules,
                 uids: dict[str, str]) -> TurnVerdict:
    recorded = [{"tool": c.tool, "name": c.name, "arguments": c.arguments} for c in turn.calls]
    verdict = TurnVerdict(turn.id, ok=True, recorded_calls=recorded)
    skip = _why_skip(turn)
    if skip:
        verdict.note = f"skipped: {skip}"
        return verdict
    try:
        prepared = prepare(turn, target)
    except TranslationError as exc:
        verdict.ok, verdict.error = False, str(exc)
        return verdict
    verdict.lost = prepared.lost
    expected = [Call(c.tool, _args(c.arguments, c.arguments_raw), c.name) for c in turn.calls]
    found: dict[tuple, list[int]] = {}  # each difference once, with the runs it occurred in
    for run in range(1, repeat + 1):
        try:
            response = send(client, prepared)
        except ReplayFailure as exc:
            verdict.runs.append(False)
            verdict.error = (f"run {run} of {repeat}: " if repeat > 1 else "") + str(exc)
            continue
        actual = decode_calls(turn, prepared, response, uids)
        verdict.replayed_calls = [{"tool": c.tool, "name": c.name, "arguments": c.arguments} for c in actual]
        mismatches = compare_calls(expected, actual, rules)
        verdict.runs.append(not mismatches)
        for m in mismatches:
            key = (m.kind, m.path, m.reason, json.dumps(m.expected), json.dumps(m.actual))
            if key not in found:
                verdict.differences.append(Difference(_field(m), m.reason, m.expected, m.actual, m.path, m.kind))
            found.setdefault(key, []).append(run)
    if repeat > 1:
        for d, runs in zip(verdict.differences, found.values()):
            d.reason = f"run {', '.join(map(str, runs))} of {repeat}: {d.reason}"
    verdict.ok = all(verdict.runs)
    return verdict


def _field(m) -> str:
    where = f"tool_calls[{m.index}]"
    return {"argument": f"{where}.arguments", "other_tool": f"{where}.tool"}.get(m.kind, where)


def _why_skip(turn: RecordedTurn) -> str | None:
    if turn.api not in ("openai.chat", "anthropic.messages", "gemini", "openai.responses"):
        return f"not a conversation ({turn.method} {turn.path.split('?')[0]})"
    if not isinstance(turn.request, dict):
        return "the recorded request is not JSON"
    if turn.status != "ok":
        return f"the recorded turn did not succeed ({turn.status}): nothing to compare against"
    return None


def _args(parsed: Any, raw: str) -> Any:
    # Arguments that did not parse compare as their text.
    return raw if parsed is None and raw else parsed


# -- building the request -----------------------------------------------------------------

def prepare(turn: RecordedTurn, target: Target) -> Prepared:
    """The request for one recorded turn: body (translated if need be), URL and headers."""
    source = turn.api
    api = API_NAMES[target.to_api] if target.to_api else source
    stream = _recorded_stream(turn)
    model = target.model or _recorded_model(turn)
    if api == source:
        body, lost, renamed = dict(turn.request), [], {}
        if target.model and source != "gemini":
            body["model"] = model
    else:
        t = translate(turn.request, source, api, model=model, stream=stream)
        body, lost, renamed = t.body, t.lost, t.renamed
    sent = {"content-type": "application/json", **_auth(api, target.api_key)}
    if api == source:  # the recorded protocol headers (anthropic-version, -beta) stand
        for name in PROTOCOL_HEADERS.get(api, ()):
            value = next((v for k, v in turn.request_headers if k.lower() == name), None)
            if value:
                sent[name] = value
    sent.update({k.lower(): v for k, v in target.headers.items()})
    return Prepared(api, _endpoint(target.base, api, model, stream), body, sent, lost, renamed, target.params)


def _recorded_stream(turn: RecordedTurn) -> bool:
    if turn.api == "gemini":
        return ":streamGenerateContent" in turn.path
    return bool(turn.request.get("stream"))


def _recorded_model(turn: RecordedTurn) -> str | None:
    m = re.search(r"/models/([^/:?]+):", turn.path)
    if turn.api == "gemini" and m:
        return m.group(1)
    return turn.request.get("model") or turn.model


def _endpoint(base: str, api: str, model: str | None, stream: bool) -> str:
    if api == "openai.chat":
        return f"{base}/chat/completions"
    if api == "openai.responses":
        return f"{base}/responses"
    if api == "anthropic.messages":
        return f"{base.removesuffix('/v1')}/v1/messages"
    root = base if _VERSION_SEGMENT.search(base) else f"{base}/v1beta"
    method = "streamGenerateContent?alt=sse" if stream else "generateContent"
    return f"{root}/models/{model or 'unknown-model'}:{method}"


def _auth(api: str, key: str | None) -> dict[str, str]:
    out = {"anthropic-version": ANTHROPIC_VERSION} if api == "anthropic.messages" else {}
    if key:
        if api == "anthropic.messages":
            out["x-api-key"] = key
        elif api == "gemini":
            out["x-goog-api-key"] = key
        else:
            out["authorization"] = f"Bearer {key}"
    return out


# -- sending and reading the answer -------------------------------------------------------

class ReplayFailure(Exception):
    """This run of a turn got no usable answer (unreachable, HTTP error, stream error)."""


# Fields every answer of an API has (any one of them). Without them the endpoint answered
# in another format, say an OpenAI-only server given `--to anthropic`: not "no tool calls".
_ANSWER_FIELDS = {"openai.chat": ("choices",), "anthropic.messages": ("id",), "openai.responses": ("id",),
                  "gemini": ("candidates", "promptFeedback")}


def send(client: httpx.Client, prepared: Prepared) -> dict:
    """POST the request and return the answer as the non-streaming endpoint gives it."""
    answer = _fetch(client, prepared)
    fields = _ANSWER_FIELDS.get(prepared.api, ())
    if fields and not any(answer.get(f) for f in fields):
        raise ReplayFailure(f"the answer from {prepared.url} is not in {prepared.api} format (no "
                            f"{' or '.join(map(repr, fields))}): does the endpoint speak that API?")
    return answer


def _fetch(client: httpx.Client, prepared: Prepared) -> dict:
    api = apis.by_name(prepared.api)
    try:
        url = httpx.URL(prepared.url).copy_merge_params(prepared.params) if prepared.params else prepared.url
        with client.stream("POST", url, json=prepared.body, headers=prepared.headers) as r:
            if r.status_code >= 400:
                r.read()
                raise ReplayFailure(f"HTTP {r.status_code} from {prepared.url}: {_error_text(r)}")
            if r.headers.get("content-type", "").startswith("text/event-stream"):
                return _assemble(api, r.iter_bytes())
            r.read()
    except httpx.ReadTimeout as exc:
        raise ReplayFailure(f"ReadTimeout from {prepared.url}: nothing came for {client.timeout.read:g} s "
                            "(--read-timeout)") from exc
    except httpx.HTTPError as exc:
        raise ReplayFailure(f"{type(exc).__name__} from {prepared.url}: {exc or 'no answer'}") from exc
    try:
        payload = r.json()
    except ValueError as exc:
        raise ReplayFailure(f"the answer from {prepared.url} is not JSON: {r.text[:120]!r}") from exc
    if isinstance(payload, list):  # Gemini streaming without alt=sse: one JSON array of chunks
        assembler = api.new_assembler()
        assembler.feed(Event(r.text))
        return assembler.result()
    if not isinstance(payload, dict):
        raise ReplayFailure(f"the answer from {prepared.url} is not a JSON object")
    if payload.get("error") and not any(k in payload for k in ("choices", "content", "candidates", "output")):
        raise ReplayFailure(f"error from {prepared.url}: {json.dumps(payload['error'], ensure_ascii=False)[:200]}")
    return payload


def _assemble(api: Any, chunks) -> dict:
    decoder, assembler = SSEDecoder(), api.new_assembler()
    for chunk in chunks:
        for event in decoder.feed(chunk):
            assembler.feed(event)
    for event in decoder.close():
        assembler.feed(event)
    if assembler.error:
        raise ReplayFailure(f"error in the stream: {json.dumps(assembler.error, ensure_ascii=False)[:200]}")
    return assembler.result()


def _error_text(r: httpx.Response) -> str:
    try:
        err = r.json().get("error")
        text = err.get("message") if isinstance(err, dict) else err
    except (ValueError, AttributeError):
        text = None
    return " ".join(str(text or r.text or r.reason_phrase).split())[:200]


def decode_calls(turn: RecordedTurn, prepared: Prepared, response: dict, uids: dict[str, str]) -> list[Call]:
    """The answer's tool calls as comparison sees the recorded ones: each name mapped back
    to what the recorded tools called it, then decoded by the agent decoders in the
    context of the recorded request (so a Cline MCP uid resolves to the same server)."""
    calls = apis.by_name(prepared.api).tool_calls(response)
    inputs = [CallInput(c.index, c.id, prepared.renamed.get(c.name, c.name), c.arguments_raw, c.arguments,
                        c.arguments_error) for c in calls]
    decoding = decode_session([TurnInput(turn.id, None, turn.api, turn.request, None, inputs)], known_uids=uids)
    return [Call(tool_key(c.name, decoding.calls[(turn.id, c.index)]["decoded"]), _args(c.arguments, c.arguments_raw),
                 c.name) for c in inputs]
