"""A converter-replay report as text (for a terminal), Markdown (for a PR) or JSON.

Text reads top-down in seconds: per session a table of counts per provider, then each
rejected call once with the providers that refuse it, then per provider the invalid
names and what was lost, grouped so one reason shared by fifteen tools is one line. Every captured string (tool names, titles, reasons
that quote schemas) is untrusted: control characters are shown escaped, never sent to
the terminal, and Markdown specials are escaped.
"""

from __future__ import annotations

import re
from collections import defaultdict

import orjson

from .recording import turn_name
from .tools import ProviderReport, SessionReport, ToolsReport

TEXT_LIMIT = 12  # lines per section in text; JSON and Markdown list everything
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def clean(text: object) -> str:
    """One line of untrusted text, safe for a terminal."""
    s = str(text).replace("\n", "\\n").replace("\t", " ")
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), s)


def tool_name(label: str, raw: str) -> str:
    """The name a user knows, with the raw one beside it when they differ."""
    return clean(label) if label == raw else f"{clean(label)} ({clean(raw)})"


# -- text -------------------------------------------------------------------------------------

def render_text(report: ToolsReport) -> str:
    out = []
    for s in report.sessions:
        out += _session_text(s)
        out.append("")
    out.append(_summary(report))
    return "\n".join(out)


def _session_text(s: SessionReport) -> list[str]:
    title = f"  {clean(s.title)[:80]}" if s.title else ""
    verdict = "ok" if s.ok else "REJECTED CALLS"
    lines = [f"session {clean(s.session_id)}{title}",
             f"  {verdict}: {_n(s.turns, 'turn')}, {_n(s.calls, 'tool call')}, {_n(s.tools, 'tool')} in "
             f"{_n(s.tool_sets, 'distinct tool set')}"]
    lines += ["  " + row for row in _table(
        ["provider", "rejected calls", "invalid names", "lost"],
        [[p.label, p.rejected_calls, len(p.invalid_names), len(p.lost)] for p in s.providers])]
    lines += _rejected_text(s)
    for p in s.providers:
        detail = _provider_text(p)
        if detail:
            lines.append(f"  {p.label}")
            lines += ["    " + d for d in detail]
    if s.unmatched:
        lines.append(f"  {len(s.unmatched)} call(s) matched no offered tool (not checked):")
        lines += [f"    {_turn(u)} call {u['call_index']}  {tool_name(u['tool'], u['name'])}: {u['reason']}"
                  for u in s.unmatched[:TEXT_LIMIT]]
        lines += _more(len(s.unmatched))
    lines += [f"  error: {clean(e)}" for e in s.errors]
    return lines


def _rejected_text(s: SessionReport) -> list[str]:
    """Each rejected call once, with the providers that would reject it (usually several
    refuse the same argument for the same reason)."""
    by = _rejections(s)
    if not by:
        return []
    lines = ["  rejected calls"]
    for (turn_id, place, index, tool, name, path, reason), labels in by[:TEXT_LIMIT]:
        lines.append(f"    {turn_name(place, turn_id)} call {index}  {tool_name(tool, name)}  {clean(path)}")
        lines.append(f"      {clean(reason)}")
        kept = [p.label for p in s.providers if p.label not in labels]
        lines.append(f"      rejected by {', '.join(labels)}" + (f"; accepted by {', '.join(kept)}" if kept else ""))
    lines += ["  " + m for m in _more(len(by))]
    return lines


def _rejections(s: SessionReport) -> list[tuple[tuple, list[str]]]:
    """[((turn id, place, call, tool, name, path, reason), [provider labels])], each
    rejection once."""
    by: dict[tuple, list[str]] = defaultdict(list)
    for p in s.providers:
        for r in p.rejected:
            by[(r.turn_id, r.place, r.call_index, r.tool, r.name, r.path, r.reason)].append(p.label)
    return list(by.items())


def _turn(u: dict) -> str:
    return turn_name(u.get("place"), u["turn_id"])


def _rejected_calls(report: ToolsReport) -> int:
    """Calls some provider would reject, each counted once however many refuse it and why."""
    return sum(len({(r.turn_id, r.call_index) for p in s.providers for r in p.rejected}) for s in report.sessions)


def _provider_text(p: ProviderReport) -> list[str]:
    lines = [f"name      {tool_name(n.label, n.tool)}  {clean(n.reason)}" for n in p.invalid_names[:TEXT_LIMIT]]
    lines += _more(len(p.invalid_names))
    groups = _lost_groups(p)
    for (path, kind, reason, via), tools in groups[:TEXT_LIMIT]:
        lines.append(f"lost      {kind:<8} {clean(path)}  {clean(reason)}" + ("  [round trip]" if via == "round trip" else ""))
        lines.append(f"          in {_tools_list(tools)}")
    lines += _more(len(groups), "kinds of loss")
    return lines


def _lost_groups(p: ProviderReport) -> list:
    """Lost items with the same path, kind and reason, whatever the tool: one group each."""
    groups: dict[tuple, list[str]] = defaultdict(list)
    for x in p.lost:
        groups[(x.path, x.kind, x.reason, x.via)].append(tool_name(x.label, x.tool))
    return list(groups.items())


def _tools_list(tools: list[str], shown: int = 6) -> str:
    head = ", ".join(tools[:shown])
    return head + (f" and {len(tools) - shown} more" if len(tools) > shown else "")


def _n(count: int, what: str) -> str:
    return f"{count} {what}{'' if count == 1 else 's'}"


def _more(n: int, what: str = "") -> list[str]:
    what = f" {what}" if what else ""
    return [f"... {n - TEXT_LIMIT} more{what} (see --format json)"] if n > TEXT_LIMIT else []


def _table(header: list[str], rows: list[list]) -> list[str]:
    """Columns padded to width, numbers to the right. (Plain: a rich Table costs ~8 ms
    to render, which is most of the time over a thousand sessions.)"""
    cells = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    out = []
    for n, r in enumerate(cells):
        out.append("  ".join(c.ljust(w) if i == 0 or n == 0 else c.rjust(w)
                             for i, (c, w) in enumerate(zip(r, widths))).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


def _summary(report: ToolsReport) -> str:
    sessions = _n(len(report.sessions), "session")
    bad = [s for s in report.sessions if not s.ok]
    if not bad:
        return f"{sessions}: no call would be rejected by any provider's converted schema"
    return (f"{sessions}: {len(bad)} with calls a provider would reject "
            f"({_n(_rejected_calls(report), 'rejected call')} in all)")


# -- markdown ---------------------------------------------------------------------------------

def md(text: object) -> str:
    """Untrusted prose inside a Markdown table cell: specials and HTML escaped, one line."""
    s = clean(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"([\\`*_\[\]|~])", r"\\\1", s)


def code(text: object) -> str:
    """An untrusted name or path as inline code in a table cell (no Markdown inside)."""
    s = clean(text).replace("|", "\\|")
    return f"`` {s} ``" if "`" in s else f"`{s}`"


def md_tool(label: str, raw: str) -> str:
    return code(label) if label == raw else f"{code(label)} ({code(raw)})"


def render_markdown(report: ToolsReport) -> str:
    lines = ["## Converter replay", "", _summary(report), ""]
    for s in report.sessions:
        lines += [f"### Session {md(s.session_id)}" + (f": {md(s.title[:80])}" if s.title else ""), "",
                  f"{'ok' if s.ok else '**calls would be rejected**'} · {_n(s.turns, 'turn')} · "
                  f"{_n(s.calls, 'tool call')} · "
                  f"{_n(s.tools, 'tool')} in {_n(s.tool_sets, 'tool set')}", "",
                  "| provider | rejected calls | invalid names | lost |", "|---|---:|---:|---:|"]
        lines += [f"| {p.label} | {p.rejected_calls} | {len(p.invalid_names)} | {len(p.lost)} |"
                  for p in s.providers]
        rejected = _rejections(s)
        if rejected:
            lines += ["", "Rejected calls:", "", "| turn | call | tool | path | reason | rejected by |",
                      "|---:|---:|---|---|---|---|"]
            lines += [f"| {turn_name(place, turn_id).removeprefix('turn ')} | {index} | {md_tool(tool, name)} | "
                      f"{code(path)} | {md(reason)} | {', '.join(labels)} |"
                      for (turn_id, place, index, tool, name, path, reason), labels in rejected]
        names = [(p, n) for p in s.providers for n in p.invalid_names]
        if names:
            lines += ["", "Invalid names:", "", "| provider | tool | reason |", "|---|---|---|"]
            lines += [f"| {p.label} | {md_tool(n.label, n.tool)} | {md(n.reason)} |" for p, n in names]
        lost = [(p, x) for p in s.providers for x in p.lost]
        if lost:
            lines += ["", "Lost:", "", "| provider | tool | path | kind | reason | found by |", "|---|---|---|---|---|---|"]
            lines += [f"| {p.label} | {md_tool(x.label, x.tool)} | {code(x.path)} | {x.kind} | "
                      f"{md(x.reason)} | {x.via} |" for p, x in lost]
        if s.unmatched:
            lines += ["", "Calls that matched no offered tool (not checked):", ""]
            lines += [f"- {_turn(u)} call {u['call_index']}: {md_tool(u['tool'], u['name'])}: "
                      f"{md(u['reason'])}" for u in s.unmatched]
        lines += [f"- error: {md(e)}" for e in s.errors]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


# -- json -------------------------------------------------------------------------------------

def render_json(report: ToolsReport) -> str:
    # orjson: the report over a thousand sessions is tens of MB, too slow for json's indenter
    return orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2).decode("utf-8")


RENDERERS = {"text": render_text, "markdown": render_markdown, "json": render_json}
