"""Cline's user-message structure, for the inspector.

Cline's user messages are a series of text blocks: the `<task>`, result blocks
(`[tool for 'arg'] Result:`), reminders it injects (`# task_progress RECOMMENDED`,
`# TODO LIST UPDATE REQUIRED`), the `[ERROR] You did not use a tool ...` nudge, and an
`<environment_details>` block with Markdown sections (mode, time, context usage...).
"""

from __future__ import annotations

import re
from typing import Any

from . import cline_results

_TASK = re.compile(r"<task>\s*(.*?)\s*</task>", re.S)
_ENV = re.compile(r"<environment_details>(.*?)(?:</environment_details>|\Z)", re.S)
_SECTION = re.compile(r"^# (.+)$", re.M)
_USAGE = re.compile(r"([\d,]+)\s*/\s*([\d.,]+)\s*([KkMm]?)\s*tokens used(?:\s*\((\d+(?:\.\d+)?)%\))?")
_CWD = re.compile(r"^Current Working Directory \((.*)\) Files$")
NO_TOOL_ERROR = "[ERROR] You did not use a tool"
REMINDERS = {
    "task_progress RECOMMENDED": "task_progress_recommended",
    "TODO LIST UPDATE REQUIRED": "todo_list_update_required",
}
_REMINDER = re.compile(r"^#\s*(task_progress RECOMMENDED|TODO LIST UPDATE REQUIRED)\b", re.M)


def task_text(texts: list[str]) -> str | None:
    for text in texts:
        m = _TASK.search(text)
        if m:
            return m.group(1)
    return None


def _usage(body: str) -> dict[str, Any] | None:
    m = _USAGE.search(body)
    if not m:
        return None
    scale = {"k": 1000, "m": 1_000_000}.get(m.group(3).lower(), 1)
    limit = float(m.group(2).replace(",", "")) * scale
    return {"used": int(m.group(1).replace(",", "")), "limit": int(limit),
            "percent": float(m.group(4)) if m.group(4) else None, "raw": body.strip()}


def environment(texts: list[str]) -> dict[str, Any] | None:
    """The last `<environment_details>` of these blocks, parsed; None when there is none."""
    found = None
    for text in texts:
        for m in _ENV.finditer(text):
            found = m.group(1)
    if found is None:
        return None
    sections: dict[str, str] = {}
    heads = list(_SECTION.finditer(found))
    for i, h in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(found)
        sections[h.group(1).strip()] = found[h.end():end].strip()
    mode_text = sections.get("Current Mode", "")
    mode = "PLAN" if "PLAN MODE" in mode_text else "ACT" if "ACT MODE" in mode_text else None
    cwd = next((m.group(1) for k in sections if (m := _CWD.match(k))), None)
    return {
        "mode": mode,
        "time": sections.get("Current Time"),
        "context_usage": _usage(sections.get("Context Window Usage", "")),
        "cwd": cwd,
        "sections": sections,
    }


def reminders(texts: list[str]) -> list[dict[str, str]]:
    out = []
    for text in texts:
        for m in _REMINDER.finditer(text):
            out.append({"kind": REMINDERS[m.group(1)], "text": text.strip()})
    return out


def no_tool_error(texts: list[str]) -> bool:
    return any(NO_TOOL_ERROR in t for t in texts)


def result_blocks(texts: list[str]) -> list[dict[str, Any]]:
    return [{"tool": s.tool, "arg": s.arg, "text": s.text, "status": cline_results.status_of(s.text)}
            for s in cline_results.segments(texts)]
