"""Text and Markdown renderings of tool sets, diffs and losses for the CLI."""

from __future__ import annotations

import json
from typing import Any

from .common import count
from .losses import Loss
from .sources import ToolSet


def _type_label(schema: Any) -> str:
    if not isinstance(schema, dict):
        return "?"
    t = schema.get("type")
    label = "|".join(t) if isinstance(t, list) else (t or ("anyOf" if "anyOf" in schema else "any"))
    if label == "array" and isinstance(schema.get("items"), dict):
        label = f"array<{_type_label(schema['items'])}>"
    if "enum" in schema:
        label += " " + json.dumps(schema["enum"], ensure_ascii=False)
    return label


def first_line(text: str | None, width: int = 100) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"


def toolset_text(ts: ToolSet, loss_counts: dict[str, int] | None = None) -> str:
    lines = [f"{ts.source}: {count(len(ts.tools), 'tool')} ({ts.format})"]
    for note in ts.skipped:
        lines.append(f"  skipped {note}")
    for spec in ts.tools:
        lines.append(f"\n{spec.name}  {first_line(spec.description)}")
        params = spec.parameters if isinstance(spec.parameters, dict) else {}
        required = set(params.get("required") or [])
        for name, sub in (params.get("properties") or {}).items():
            mark = "*" if name in required else " "
            desc = first_line(sub.get("description") if isinstance(sub, dict) else "", 70)
            lines.append(f"  {mark} {name}: {_type_label(sub)}" + (f"  {desc}" if desc else ""))
    if loss_counts:
        lines.append("\nlosses per target: " + ", ".join(f"{k} {v}" for k, v in loss_counts.items()))
    return "\n".join(lines)


def loss_lines(losses: list[Loss]) -> list[str]:
    return [f"{l.tool or '?'} {l.path}: [{l.kind}] {l.reason}" for l in losses]


def _verdict(change: dict) -> str:
    return "BREAKING" if change["breaking"] else "ok"


def diff_text(result: dict, a: str, b: str) -> str:
    s = result["summary"]
    lines = [f"--- {a}", f"+++ {b}",
             f"{s['added']} added, {s['removed']} removed, {s['renamed']} renamed, {s['changed']} changed, "
             f"{s['unchanged']} unchanged; {s['breaking_changes']} breaking of {s['changes']} changes"]
    for tool in result["tools"]:
        if tool["status"] == "unchanged":
            continue
        head = {"added": "+", "removed": "-", "renamed": "~", "changed": "*"}[tool["status"]]
        title = f"{tool['from']} -> {tool['name']}" if tool["status"] == "renamed" else tool["name"]
        lines.append(f"\n{head} {title} ({tool['status']}{', BREAKING' if tool['breaking'] else ''})")
        for c in tool["changes"]:
            if c["kind"] in ("tool_added", "tool_removed"):
                continue
            lines.append(f"    {_verdict(c):8} {c['path']}: {c['message']}")
    return "\n".join(lines)


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def diff_markdown(result: dict, a: str, b: str) -> str:
    s = result["summary"]
    lines = [f"## Tool schema diff: `{a}` → `{b}`", "",
             f"**{s['breaking_changes']} breaking** of {s['changes']} changes — {s['added']} added, "
             f"{s['removed']} removed, {s['renamed']} renamed, {s['changed']} changed, {s['unchanged']} unchanged.", ""]
    if result["changes"]:
        lines += ["| Tool | Change | Path | Verdict |", "|---|---|---|---|"]
        for c in result["changes"]:
            lines.append(f"| `{_md(c['tool'])}` | {_md(c['message'])} | `{_md(c['path'])}` | "
                         f"{'**breaking**' if c['breaking'] else 'compatible'} |")
    return "\n".join(lines)
