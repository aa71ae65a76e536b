"""Converter replay: every stored turn's tools and tool calls through every provider format.

For each tool set a turn offered, and each target format: convert it (proxy/schemas),
read it back with that format's own parser, and list what the converter said it lost
plus anything else the round trip changed; check each tool name against the provider's
rules. Then hold every tool call the model made to the schema that provider would have
been given, and list the calls it would reject, with the JSON path and why.

Pure analysis: takes `Recording`s, returns a `ToolsReport`; reading the store is the
caller's business. Agents resend the same tools on every turn, so a `ConverterReplay`
converts each distinct tool set once (keyed by its canonical hash) and checks each
distinct (schema, arguments) pair once, across all the sessions it is given.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Iterator

import orjson

from .. import apis
from ..agents.validate import validate_call
from ..schemas.anthropic_tools import from_anthropic, to_anthropic
from ..schemas.gemini_tools import from_gemini, schema_from_gemini, to_gemini
from ..schemas.losses import Loss, join
from ..schemas.mcp_tools import from_mcp, to_mcp
from ..schemas.names import fix_name, mcp_identity
from ..schemas.openai_tools import from_openai, to_openai_chat, to_openai_responses
from ..schemas.sources import SourceError, from_document
from ..schemas.spec import SchemaError, ToolSpec, canonical, normalize
from .compare import same_value
from .recording import RecordedCall, Recording

# -- the target formats --------------------------------------------------------------------

# The MCP spec (2025-11-25, "Tool names") says names SHOULD be 1-128 characters of
# ASCII letters, digits, `_`, `-` and `.`; no client enforces more.
MCP_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


def _strict(spec: ToolSpec) -> tuple[dict, list[Loss]]:
    return to_openai_chat(replace(spec, meta={**spec.meta, "strict": True}))


def _open_object(_: dict) -> dict:
    return {"type": "object"}


@dataclass(frozen=True)
class Target:
    key: str
    label: str
    convert: Callable[[ToolSpec], "tuple[dict | None, list[Loss]]"]
    parse: Callable[[dict], "tuple[ToolSpec, list[Loss]]"]
    schema: Callable[[dict], Any]  # the JSON Schema a call's arguments are held to
    frame: str  # where the emitted tool keeps the name/description ("$.function" or "$")
    params: str  # where it keeps the parameters schema
    names: str  # whose name rules apply: "openai", "anthropic", "gemini" or "mcp"


def _gemini_schema(tool: dict) -> Any:
    # No `parameters` means a tool without arguments: nothing to hold a call to.
    return schema_from_gemini(tool["parameters"]) if "parameters" in tool else {"type": "object"}


TARGETS: tuple[Target, ...] = (
    Target("openai", "OpenAI chat", to_openai_chat, from_openai,
           lambda t: t["function"].get("parameters"), "$.function", "$.function.parameters", "openai"),
    Target("openai-strict", "OpenAI strict", _strict, from_openai,
           lambda t: t["function"].get("parameters"), "$.function", "$.function.parameters", "openai"),
    Target("openai-responses", "OpenAI Responses", to_openai_responses, from_openai,
           lambda t: t.get("parameters"), "$", "$.parameters", "openai"),
    Target("anthropic", "Anthropic", to_anthropic, from_anthropic,
           lambda t: t.get("input_schema"), "$", "$.input_schema", "anthropic"),
    Target("gemini", "Gemini parameters", to_gemini, from_gemini, _gemini_schema, "$", "$.parameters", "gemini"),
    Target("gemini-jsonschema", "Gemini parametersJsonSchema", lambda s: to_gemini(s, json_schema=True),
           from_gemini, lambda t: t.get("parametersJsonSchema"), "$", "$.parametersJsonSchema", "gemini"),
    Target("mcp", "MCP", to_mcp, from_mcp, lambda t: t.get("inputSchema"), "$", "$.inputSchema", "mcp"),
)
BY_KEY = {t.key: t for t in TARGETS}

# -- the report ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lost:
    """Something a tool definition did not keep in one format."""

    tool: str  # the name as offered
    label: str  # the name a user knows (decoded MCP names: "server/tool")
    path: str  # JSON path inside the emitted tool
    kind: str  # dropped | changed | rejected | added (Loss kinds, plus what a round trip added)
    reason: str
    via: str  # "converter" (it said so) or "round trip" (found by converting back)


@dataclass(frozen=True)
class Rejected:
    """A recorded call whose arguments the converted schema refuses."""

    turn_id: int
    call_index: int
    call_id: str | None
    tool: str  # decoded
    name: str  # raw, as the model emitted it
    path: str  # JSON path inside the arguments
    kind: str  # validate.py's kinds: additional_property, undeclared_parameter, wrong_type...
    reason: str
    place: int | None = None  # the turn's place in its session (1 for the first)


@dataclass(frozen=True)
class BadName:
    tool: str
    label: str
    reason: str
    renamed_to: str | None  # what the converter sends instead, when it renames


@dataclass
class ProviderReport:
    target: str
    label: str
    lost: list[Lost] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)
    invalid_names: list[BadName] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.rejected

    @property
    def rejected_calls(self) -> int:
        """Calls refused: one call refused for two reasons is two rejections, one call."""
        return len({(r.turn_id, r.call_index) for r in self.rejected})


@dataclass
class SessionReport:
    session_id: str
    title: str | None
    turns: int = 0
    calls: int = 0
    tool_sets: int = 0
    tools: int = 0  # distinct tool names offered
    providers: list[ProviderReport] = field(default_factory=list)
    # calls no offered tool matches (the model called something it was not given, or the
    # request offered no tools): nothing to convert, so no provider verdict
    unmatched: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # tool sets or tools that could not be read

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.providers)

    def to_dict(self) -> dict:
        return {"session_id": self.session_id, "title": self.title, "ok": self.ok, "turns": self.turns,
                "calls": self.calls, "tool_sets": self.tool_sets, "tools": self.tools,
                "providers": [{"target": p.target, "label": p.label, "ok": p.ok,
                               "counts": {"lost": len(p.lost), "rejected": len(p.rejected),
                                          "rejected_calls": p.rejected_calls,
                                          "invalid_names": len(p.invalid_names)},
                               # flat records: vars() is asdict() without its deep copy
                               "lost": [dict(vars(x)) for x in p.lost],
                               "rejected": [dict(vars(x)) for x in p.rejected],
                               "invalid_names": [dict(vars(x)) for x in p.invalid_names]}
                              for p in self.providers],
                "unmatched_calls": self.unmatched, "errors": self.errors}


@dataclass
class ToolsReport:
    sessions: list[SessionReport] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.sessions)

    def to_dict(self) -> dict:
        return {"kind": "tools", "target": "converters", "ok": self.ok,
                "targets": [{"target": t.key, "label": t.label} for t in TARGETS],
                "sessions": [s.to_dict() for s in self.sessions]}


# -- the analysis ----------------------------------------------------------------------------


@dataclass
class _Converted:
    """Tools (one, or a whole set) in one format: what was lost, the names that break the
    provider's rules, and the schema each tool's calls are held to."""

    lost: list[Lost]
    names: list[BadName]
    schemas: dict[str, tuple[str, Any]]  # raw tool name -> (schema hash, schema)


@dataclass
class _ToolSet:
    labels: dict[str, str]  # raw tool name -> label
    per_target: dict[str, _Converted]
    errors: list[str]


class ConverterReplay:
    """Runs converter replay over sessions, sharing its caches between them."""

    def __init__(self, targets: Iterable[Target] = TARGETS):
        self.targets = tuple(targets)
        self._sets: dict[str, _ToolSet] = {}
        self._tools: dict[str, dict[str, _Converted] | str] = {}
        self._verdicts: dict[tuple, list[dict]] = {}

    def session(self, recording: Recording) -> SessionReport:
        report = SessionReport(recording.session_id, recording.title, turns=len(recording.turns))
        providers = {t.key: ProviderReport(t.key, t.label) for t in self.targets}
        seen_sets: set[str] = set()
        seen_lost: dict[str, set] = {t.key: set() for t in self.targets}
        seen_names: dict[str, set] = {t.key: set() for t in self.targets}
        tool_names: set[str] = set()
        places = recording.places
        for turn in recording.turns:
            report.calls += len(turn.calls)
            tools_doc = _offered(turn.api, turn.request)
            key = _hash(tools_doc) if tools_doc else None
            tool_set = self._tool_set(key, tools_doc) if key else None
            if tool_set is not None and key not in seen_sets:
                seen_sets.add(key)
                tool_names.update(tool_set.labels)
                report.errors += [e for e in tool_set.errors if e not in report.errors]
                for t in self.targets:
                    conv = tool_set.per_target[t.key]
                    _extend_new(providers[t.key].lost, conv.lost, seen_lost[t.key])
                    _extend_new(providers[t.key].invalid_names, conv.names, seen_names[t.key])
            for call in turn.calls:
                if tool_set is None or call.name not in tool_set.labels:
                    report.unmatched.append({"turn_id": turn.id, "place": places[turn.id],
                                             "call_index": call.index, "tool": call.tool,
                                             "name": call.name, "reason": "no tool of that name was offered"
                                             if tool_set is not None else "the request offered no tools"})
                    continue
                for t in self.targets:
                    found = tool_set.per_target[t.key].schemas.get(call.name)
                    if found is None:  # the tool could not be converted: reported as an error
                        continue
                    for v in self._check(call, *found):
                        providers[t.key].rejected.append(Rejected(
                            turn.id, call.index, call.id, call.tool, call.name, v["path"], v["kind"], v["message"],
                            places[turn.id]))
        report.tool_sets = len(seen_sets)
        report.tools = len(tool_names)
        report.providers = list(providers.values())
        return report

    def run(self, recordings: Iterable[Recording]) -> ToolsReport:
        return ToolsReport([self.session(r) for r in recordings])

    # -- tool sets, once each --------------------------------------------------------------

    def _tool_set(self, key: str, tools_doc: Any) -> _ToolSet:
        if key not in self._sets:
            self._sets[key] = self._convert_set(tools_doc)
        return self._sets[key]

    def _convert_set(self, tools_doc: Any) -> _ToolSet:
        per_target = {t.key: _Converted([], [], {}) for t in self.targets}
        try:
            specs = from_document(tools_doc).tools
        except (SourceError, KeyError, TypeError, ValueError) as exc:
            return _ToolSet({}, per_target, [f"the tools offered cannot be read: {exc}"])
        labels, errors = {}, []
        for raw in specs:
            labels[raw.name] = _label(raw.name, raw.description)
            converted = self._tool(raw, labels[raw.name])
            if isinstance(converted, str):
                errors.append(converted)
                continue
            for key, one in converted.items():
                per_target[key].lost += one.lost
                per_target[key].names += one.names
                per_target[key].schemas.update(one.schemas)
        return _ToolSet(labels, per_target, errors)

    def _tool(self, raw: ToolSpec, label: str) -> dict[str, _Converted] | str:
        """One tool in every target format (or why it cannot be converted), once: most
        tools recur across tool sets that differ by one tool (a Cline MCP uid, say)."""
        key = _hash([raw.to_dict(), label])
        if key not in self._tools:
            try:
                spec = normalize(raw)
            except SchemaError as exc:
                self._tools[key] = str(exc)
            else:
                self._tools[key] = {t.key: _convert_one(t, spec, label) for t in self.targets}
        return self._tools[key]

    # -- calls, once per (schema, arguments) -------------------------------------------------

    def _check(self, call: RecordedCall, schema_hash: str, schema: Any) -> list[dict]:
        arguments, error = call.arguments, None
        if arguments is None:
            if call.arguments_raw.strip():
                error = "cannot be parsed"
            else:
                arguments = {}  # no arguments at all: an empty object
        key = (schema_hash, call.name, _hash(arguments), error)
        if key not in self._verdicts:
            self._verdicts[key] = _violations(call.name, arguments, error, schema)
        return self._verdicts[key]


def replay_tools(recordings: Iterable[Recording]) -> ToolsReport:
    """Converter replay over `recordings` (one report per session, in order)."""
    return ConverterReplay().run(recordings)


def _convert_one(t: Target, spec: ToolSpec, label: str) -> _Converted:
    out = _Converted([], [], {})
    emitted, losses = t.convert(spec)
    if emitted is None:
        out.lost.append(Lost(spec.name, label, "$", "omitted", f"{t.label} leaves this tool out", "converter"))
        return out
    bad = _name_problem(t, spec.name)
    if bad:
        out.names.append(BadName(spec.name, label, *bad))
    said = [loss for loss in losses if loss.kind != "renamed"]  # renames are reported as names
    out.lost += [Lost(spec.name, label, loss.path, loss.kind, loss.reason, "converter") for loss in said]
    covered = [loss.path for loss in losses]
    out.lost += [Lost(spec.name, label, path, kind, why, "round trip")
                 for path, kind, why in _round_trip(t, spec, emitted) if not _covered(path, covered)]
    schema = t.schema(emitted)
    out.schemas[spec.name] = (_hash(schema), schema)
    return out


def _name_problem(t: Target, name: str) -> tuple[str, str | None] | None:
    """(reason, renamed to) when `name` breaks the target provider's rules, else None."""
    if t.names == "mcp":
        if MCP_NAME.match(name):
            return None
        why = f"{len(name)} characters" if not 1 <= len(name) <= 128 else "characters outside [A-Za-z0-9_.-]"
        return f"the MCP spec says tool names SHOULD be 1-128 of A-Z a-z 0-9 _ - . ({why})", None
    new, loss = fix_name(name, t.names)
    return None if loss is None else (loss.reason, new)


def _round_trip(t: Target, spec: ToolSpec, emitted: dict) -> Iterator[tuple[str, str, str]]:
    """(path in the emitted tool, kind, reason) for each thing that came back different."""
    if t.key == "openai-strict":
        spec = replace(spec, meta={**spec.meta, "strict": True})
    try:
        back, _ = t.parse(emitted)
    except (KeyError, TypeError, ValueError) as exc:
        yield "$", "changed", f"{t.label}: the converted tool cannot be read back ({exc})"
        return
    parts = [("name", spec.name, back.name, t.frame), ("description", spec.description, back.description, t.frame)]
    for where, before, after, base in parts:
        if before != after:
            yield join(base, where), "changed", f"round trip changed the {where}: {_show(before)} -> {_show(after)}"
    for path, before, after in _diff(t.params, spec.parameters, back.parameters):
        yield path, *_describe(before, after)
    for key in set(spec.meta) | set(back.meta):
        before, after = spec.meta.get(key, ABSENT), back.meta.get(key, ABSENT)
        if key == "strict" and False in (before, after) and ABSENT in (before, after):
            continue  # strict: false is the default: absent says the same
        if before is ABSENT or after is ABSENT or not same_value(before, after):
            yield join("$", key), *_describe(before, after)


class _Absent:
    def __repr__(self) -> str:
        return "<absent>"


ABSENT: Any = _Absent()


def _diff(path: str, a: Any, b: Any) -> Iterator[tuple[str, Any, Any]]:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(a) + [k for k in b if k not in a]:
            yield from _diff(join(path, key), a.get(key, ABSENT), b.get(key, ABSENT))
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            yield from _diff(join(path, i), x, y)
    elif a is ABSENT and b in ([], {}) or b is ABSENT and a in ([], {}):
        return  # an empty `required` or `properties` says nothing: gone or added, same schema
    elif a is ABSENT or b is ABSENT or not same_value(a, b):
        yield path, a, b


def _describe(before: Any, after: Any) -> tuple[str, str]:
    if after is ABSENT:
        return "dropped", f"lost in the round trip (was {_show(before)})"
    if before is ABSENT:
        return "added", f"added by the round trip: {_show(after)}"
    return "changed", f"changed by the round trip: {_show(before)} -> {_show(after)}"


def _covered(path: str, said: list[str]) -> bool:
    """Whether the converter already reported a loss at, above or below `path`."""
    return any(path == p or path.startswith((p + ".", p + "[")) or p.startswith((path + ".", path + "["))
               for p in said)


def _violations(name: str, arguments: Any, error: str | None, schema: Any) -> list[dict]:
    if not isinstance(schema, dict):
        schema = {"type": "object"}
    out = validate_call(name, arguments, error, {name: {"schema": schema}})
    # validate.py also flags a task_progress the schema merely does not declare; a
    # provider only refuses it when the schema is closed.
    closed = schema.get("additionalProperties") is False
    return [v for v in out if v["kind"] != "undeclared_parameter" or closed]


def _offered(api_name: str, request: Any) -> Any:
    """The tools array in a request body, by its API's key; None when there is none."""
    api = apis.by_name(api_name)
    if api is None or not isinstance(request, dict) or not api.keys.tools:
        return None
    return request.get(api.keys.tools) or None


def _label(name: str, description: str | None) -> str:
    found = mcp_identity(name, description)
    if found is None:
        return name
    server, tool = found
    return f"{server}/{tool}" if server else tool


def _hash(value: Any) -> str:
    """A cache key for a JSON value (orjson: the tools array is hashed on every turn)."""
    try:
        return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()
    except TypeError:  # beyond orjson (an integer over 64 bits...)
        return hashlib.sha256(canonical(value).encode("utf-8")).hexdigest()


def _show(value: Any) -> str:
    text = "absent" if value is ABSENT else canonical(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _extend_new(out: list, items: list, seen: set) -> None:
    for item in items:
        if item not in seen:
            seen.add(item)
            out.append(item)
