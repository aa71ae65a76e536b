"""task_progress: Cline's Markdown checklist, parsed, and its change between calls."""

from __future__ import annotations

import re
from typing import Any

_ITEM = re.compile(r"^-\s*\[([ xX])\]\s*(.+)$")


def parse(raw: Any) -> dict[str, Any] | None:
    """{raw, items: [{text, done}], done, total}, or None when there is no checklist
    value. A string with no checklist lines still parses (0 items): the model sent one."""
    if not isinstance(raw, str):
        return None
    items = []
    for line in raw.splitlines():
        m = _ITEM.match(line.strip())
        if m:
            items.append({"text": m.group(2).strip(), "done": m.group(1) in "xX"})
    done = sum(1 for i in items if i["done"])
    return {"raw": raw, "items": items, "done": done, "total": len(items)}


def change(before: dict[str, Any], after: dict[str, Any]) -> dict[str, list[str]]:
    """Items added, removed, checked and unchecked from one checklist to the next, by
    item text (a reworded item reads as one removed and one added)."""
    old = {i["text"]: i["done"] for i in before["items"]}
    new = {i["text"]: i["done"] for i in after["items"]}
    return {
        "added": [t for t in new if t not in old],
        "removed": [t for t in old if t not in new],
        "checked": [t for t in new if t in old and new[t] and not old[t]],
        "unchecked": [t for t in new if t in old and old[t] and not new[t]],
    }
