"""What a session replay found, turn by turn: the shape `recorded` and `live` return,
the CLI prints, `runs` stores and the inspector shows."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Difference:
    """One thing that differs in one turn: which field, both values, and why in words."""

    field: str  # "status", "tool_calls", "tool_calls[0].arguments", "decoding.task_progress", ...
    reason: str
    expected: Any = None
    actual: Any = None
    path: str | None = None  # a JSON path inside the field, when there is one
    kind: str | None = None  # for tool calls: other_tool | missing_call | extra_call | argument


@dataclass
class TurnVerdict:
    turn_id: int  # the recorded turn
    ok: bool
    differences: list[Difference] = field(default_factory=list)
    recorded_calls: list[dict] = field(default_factory=list)  # [{tool, name, arguments}]
    replayed_calls: list[dict] = field(default_factory=list)  # of the last run
    runs: list[bool] = field(default_factory=list)  # one verdict per repeat (live --repeat K)
    lost: list[str] = field(default_factory=list)  # what translating the request lost
    error: str | None = None  # the turn could not be replayed at all (e.g. upstream unreachable)
    note: str | None = None  # why the turn was left out (live replay skips turns that are not conversations)


@dataclass
class ReplayResult:
    kind: str  # "recorded" | "live"
    session_id: str
    target: str  # "recorded" for recorded replay; the URL (and --to API) for live replay
    turns: list[TurnVerdict] = field(default_factory=list)
    settings: dict = field(default_factory=dict)  # speed, model, modes, repeat...

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.turns)

    @property
    def pass_hat_k(self) -> float | None:
        runs = [t.runs for t in self.turns if t.runs]
        return sum(all(r) for r in runs) / len(runs) if runs else None

    def to_dict(self) -> dict:
        return {"kind": self.kind, "session_id": self.session_id, "target": self.target, "ok": self.ok,
                "pass_hat_k": self.pass_hat_k, "settings": self.settings,
                "turns": [asdict(t) for t in self.turns]}

    @classmethod
    def from_dict(cls, d: dict) -> "ReplayResult":
        turns = [TurnVerdict(**{**t, "differences": [Difference(**x) for x in t.get("differences", [])]})
                 for t in d.get("turns", [])]
        return cls(d["kind"], d["session_id"], d["target"], turns, d.get("settings") or {})


def render_text(result: ReplayResult) -> str:
    """One line per turn, then one indented line per difference: read in seconds."""
    lines = [f"replay {result.kind} of session {result.session_id} against {result.target}"]
    for t in result.turns:
        mark = "ok  " if t.ok else "DIFF"
        runs = f"  ({sum(t.runs)}/{len(t.runs)} runs passed)" if len(t.runs) > 1 else ""
        calls = ", ".join(c.get("tool", "?") for c in t.recorded_calls) or "no tool calls"
        lines.append(f"  {mark} turn {t.turn_id}: {calls}{runs}")
        if t.error:
            lines.append(f"         error: {t.error}")
        if t.note:
            lines.append(f"         {t.note}")
        for d in t.differences:
            lines.append(f"         {d.field}: {d.reason}")
        for loss in t.lost:
            lines.append(f"         lost in translation: {loss}")
    differing = sum(not t.ok for t in result.turns)
    summary = f"{len(result.turns) - differing} of {len(result.turns)} turns identical"
    if result.pass_hat_k is not None and any(len(t.runs) > 1 for t in result.turns):
        summary += f"; pass^{max(len(t.runs) for t in result.turns)} = {result.pass_hat_k:.2f}"
    lines.append(summary + ("" if result.ok else f"; {differing} differ"))
    return "\n".join(lines)


def render_markdown(result: ReplayResult) -> str:
    lines = [f"## Replay ({result.kind}) of session `{result.session_id}`", "",
             f"Target: `{result.target}` · {'identical' if result.ok else 'differs'}", "",
             "| turn | verdict | field | what differs |", "|---|---|---|---|"]
    for t in result.turns:
        rows = [(d.field, d.reason) for d in t.differences]
        rows += [("error", t.error)] if t.error else []
        rows += [("note", t.note)] if t.note else []
        rows += [("lost in translation", loss) for loss in t.lost]
        for f, why in rows or [("", "")]:
            lines.append(f"| {t.turn_id} | {'ok' if t.ok else '**differs**'} | {f} | {_cell(why)} |")
    if result.pass_hat_k is not None and any(len(t.runs) > 1 for t in result.turns):
        lines += ["", f"pass^{max(len(t.runs) for t in result.turns)} = {result.pass_hat_k:.2f}"]
    return "\n".join(lines)


def render_json(result: ReplayResult) -> str:
    return json.dumps(result.to_dict(), indent=2, ensure_ascii=False, default=str)


def _cell(text: str | None) -> str:
    return (text or "").replace("|", "\\|").replace("\n", " ")
