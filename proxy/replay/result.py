"""What a session replay found, turn by turn: the shape `recorded` and `live` return,
the CLI prints, `runs` stores and the inspector shows."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from .recording import turn_name


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
    place: int | None = None  # the turn's place in its session (1 for the first): what people call it

    @property
    def skipped(self) -> bool:
        """Left out, so neither identical nor different (a note says why)."""
        return self.note is not None

    @property
    def failed(self) -> bool:
        return not_replayed(asdict(self))

    @property
    def name(self) -> str:
        return turn_name(self.place, self.turn_id)


@dataclass
class ReplayResult:
    kind: str  # "recorded" | "live"
    session_id: str
    target: str  # "recorded" for recorded replay; the URL (and --to API) for live replay
    turns: list[TurnVerdict] = field(default_factory=list)
    settings: dict = field(default_factory=dict)  # speed, model, modes, repeat...
    interrupted: bool = False  # stopped by Ctrl-C: `turns` are those done before it

    @property
    def ok(self) -> bool:
        """Every turn compared matched, and at least one was compared: a run that compared
        nothing (every turn skipped) proves nothing, so it does not pass."""
        return all(t.ok for t in self.turns) and self.compared > 0

    @property
    def compared(self) -> int:
        return sum(not t.skipped for t in self.turns)

    @property
    def verdict(self) -> str:
        """What the run says of itself, in a word or three."""
        if self.ok:
            return same_word(self.settings)
        if not self.compared:
            return "nothing compared"
        return "could not replay" if all(t.failed for t in self.turns if not t.ok) else "differs"

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


def not_replayed(turn: dict) -> bool:
    """A turn (as stored: TurnVerdict's fields) replayed in no run at all (the endpoint
    unreachable, an HTTP error): nothing came back to compare, which says nothing of the
    model's answers. One rule for the report and the inspector's pages."""
    return (not turn.get("ok") and turn.get("error") is not None and not turn.get("differences")
            and turn.get("note") is None and not any(turn.get("runs") or []))


def same_word(settings: dict) -> str:
    """"identical" when the calls were held to the exact recording; "match" when modes or
    ignored paths let some differences through (those turns are not identical)."""
    loosened = (settings.get("order", "strict") != "strict" or settings.get("args", "exact") != "exact"
                or settings.get("per_tool") or settings.get("ignore"))
    return "match" if loosened else "identical"


def summary(result: ReplayResult) -> str:
    """`3 of 4 turns identical, 1 skipped; 1 differs`: skipped turns are neither, and turns
    that could not be replayed are counted apart from those that differ."""
    failed = sum(t.failed for t in result.turns)
    differing = sum(not t.ok for t in result.turns) - failed
    skipped = len(result.turns) - result.compared
    same = len(result.turns) - differing - failed - skipped
    out = f"{same} of {len(result.turns)} turns {same_word(result.settings)}"
    out += f", {skipped} skipped" if skipped else ""
    if result.pass_hat_k is not None and any(len(t.runs) > 1 for t in result.turns):
        out += f"; pass^{max(len(t.runs) for t in result.turns)} = {result.pass_hat_k:.2f}"
    if differing:
        out += f"; {differing} {'differs' if differing == 1 else 'differ'}"
    if failed:
        out += f"; {failed} could not be replayed (errors)"
    if not result.compared:
        out += "; no turn was compared"
    return out


def render_text(result: ReplayResult) -> str:
    """One line per turn, then one indented line per difference: read in seconds."""
    against = "" if result.kind == "recorded" else f" against {result.target}"  # (recorded: its target is "recorded")
    lines = [f"replay {result.kind} of session {result.session_id}{against}"]
    for t in result.turns:
        mark = "skip" if t.skipped else "ok  " if t.ok else "ERR " if t.failed else "DIFF"
        runs = f"  ({sum(t.runs)}/{len(t.runs)} runs passed)" if len(t.runs) > 1 else ""
        calls = ", ".join(c.get("tool", "?") for c in t.recorded_calls) or "no tool calls"
        lines.append(f"  {mark} {t.name}: {calls}{runs}")
        if t.error:
            lines.append(f"         error: {t.error}")
        if t.note:
            lines.append(f"         {t.note}")
        for d in t.differences:
            lines.append(f"         {d.field}: {d.reason}")
        for loss in t.lost:
            lines.append(f"         lost in translation: {loss}")
    lines.append(summary(result))
    return "\n".join(lines)


def render_markdown(result: ReplayResult) -> str:
    lines = [f"## Replay ({result.kind}) of session `{result.session_id}`", "",
             f"Target: `{result.target}` · {result.verdict} · {summary(result)}", "",
             "| turn | verdict | field | what differs |", "|---|---|---|---|"]
    for t in result.turns:
        rows = [(d.field, d.reason) for d in t.differences]
        rows += [("error", t.error)] if t.error else []
        rows += [("note", t.note)] if t.note else []
        rows += [("lost in translation", loss) for loss in t.lost]
        turn = t.name.removeprefix("turn ")
        verdict = "skipped" if t.skipped else "ok" if t.ok else "**error**" if t.failed else "**differs**"
        for f, why in rows or [("", "")]:
            lines.append(f"| {turn} | {verdict} | {f} | {_cell(why)} |")
    return "\n".join(lines)


def render_json(result: ReplayResult) -> str:
    return json.dumps(result.to_dict(), indent=2, ensure_ascii=False, default=str)


def _cell(text: str | None) -> str:
    return (text or "").replace("|", "\\|").replace("\n", " ")
