"""decode_session: every decoder step over one session's turns.

Steps, each a pure function of the turns: detect the agent per turn; resolve Cline uids
to server names (descriptions first, result headers second, once per session); decode
names; pair each turn's calls with the results in its child turn; follow task_progress
along each branch; validate arguments; describe Cline's message structure. A step that
raises is recorded in that turn's `errors` and the rest still decodes.
"""

from __future__ import annotations

import traceback
from typing import Any, Callable

from . import cline, cline_messages, cline_results, cline_xml, pairing, progress, registry, validate
from .base import SessionDecoding, TurnInput
from .generic import builtin
from .view import TurnView


class _Turn:
    """A turn being decoded: its view, its call records, its errors."""

    def __init__(self, turn: TurnInput, uids: dict[str, str]) -> None:
        self.turn = turn
        self.view = TurnView(turn, uids)
        self.agent = "generic"
        self.errors: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {
            c.index: {"decoded": builtin(c.name), "task_progress": None, "result": None, "violations": []}
            for c in turn.tool_calls
        }
        self.text_calls: list[dict[str, Any]] = []
        self.structure: dict[str, Any] = {}

    def guard(self, step: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:  # a decoder bug must never lose the turn
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            self.errors.append(f"{step}: {type(exc).__name__}: {exc} ({frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})")
            return None


def decode_session(turns: list[TurnInput], known_uids: dict[str, str] | None = None) -> SessionDecoding:
    """Decode a session's turns (in arrival order). Deterministic: the same turns give
    the same decoding, live or in `tooltap redecode`. `known_uids` carries Cline uids
    already resolved in this session when only some of its turns are passed."""
    uids: dict[str, str] = dict(known_uids or {})  # shared by every view, filled before names decode
    work = [_Turn(t, uids) for t in turns]
    # Branches (retries, edits) share a parent: the first child in arrival order answers.
    children: dict[int, _Turn] = {}
    for w in work:
        if w.turn.parent_id is not None and w.turn.parent_id != w.turn.id:
            children.setdefault(w.turn.parent_id, w)
    for w in work:
        w.agent = w.guard("agent", lambda w=w: _memo(w, "agent", lambda: registry.detect_agent(w.view))) or "generic"
        w.text_calls = w.guard("text_calls", lambda w=w: _text_calls(w)) or []

    for w in work:
        w.guard("uids", lambda w=w: _uids_from_descriptions(w, uids))
    for w in work:
        w.guard("names", lambda w=w: _decode_names(w))
    header_uids: dict[str, str] = {}
    for w in work:
        child = children.get(w.turn.id)
        w.guard("results", lambda w=w, child=child: _pair(w, child, header_uids))
    if any(uid not in uids for uid in header_uids):
        for uid, server in header_uids.items():
            uids.setdefault(uid, server)
        for w in work:
            w.guard("names", lambda w=w: _decode_names(w))

    _progress(work)
    for w in work:
        w.guard("validation", lambda w=w: _validate(w))
        w.structure = w.guard("structure", lambda w=w: _structure(w, children.get(w.turn.id))) or {}

    out = SessionDecoding(uids=dict(uids))
    for w in work:
        for index, call in w.calls.items():
            out.calls[(w.turn.id, index)] = call
        out.turns[w.turn.id] = _turn_dict(w)
    return out


def decode_turn(turns: list[TurnInput], turn_id: int) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """One turn decoded in the context of its session: (turn dict, calls by index)."""
    d = decode_session(turns)
    return d.turns[turn_id], {i: c for (t, i), c in d.calls.items() if t == turn_id}


def _text_calls(w: _Turn) -> list[dict[str, Any]]:
    if w.agent != "cline" or not w.view.response_text:
        return []
    calls = cline_xml.extract(w.view.response_text)
    for c in calls:
        c.update({"task_progress": None, "result": None})
    return calls


def _uids_from_descriptions(w: _Turn, uids: dict[str, str]) -> None:
    for name, tool in (w.view.tools or {}).items():
        uid = registry.uid_of(name)
        if uid and uid not in uids:
            server = cline.server_from_description(tool.get("description") or "")
            if server:
                uids[uid] = server


def _decode_names(w: _Turn) -> None:
    for c in w.turn.tool_calls:
        w.calls[c.index]["decoded"] = registry.decode_name(c.name, w.view, w.agent)


def _pair(w: _Turn, child: _Turn | None, header_uids: dict[str, str]) -> None:
    native = [pairing.PairCall(("call", c.index), c.id, c.name,
                               cline_results.header_key(c.name, c.arguments, w.calls[c.index]["decoded"]))
              for c in w.turn.tool_calls]
    text = [pairing.PairCall(("text", t["index"]), None, t["name"],
                             cline_results.header_key(t["name"], t["arguments"], t["decoded"]))
            for t in w.text_calls]
    if child is None:  # no later turn (yet): nothing answered these calls
        results = {c.key: pairing.missing() for c in native + text}
        matched = {}
    else:
        history = len(w.view.messages) if child.view.resends_history else 0
        results, matched = pairing.pair(history, child.view.messages, native + text)
    for (kind, index), res in results.items():
        target = w.calls[index] if kind == "call" else w.text_calls[index]
        target["result"] = res
    # A uid the descriptions did not name is named by the header that answered it.
    for c in w.turn.tool_calls:
        seg = matched.get(("call", c.index))
        decoded = w.calls[c.index]["decoded"]
        if seg and seg.tool == "use_mcp_tool" and seg.arg and decoded.get("resolved") is False and decoded.get("uid"):
            header_uids.setdefault(decoded["uid"], seg.arg)


def _progress(work: list[_Turn]) -> None:
    """Each checklist against the previous one on the same branch (parents first)."""
    last: dict[int, dict[str, Any] | None] = {}
    for w in work:
        parent = w.turn.parent_id
        previous = last.get(parent) if parent is not None else None

        def step(w: _Turn = w, previous: Any = previous) -> Any:
            entries = [(c.arguments, w.calls[c.index]) for c in sorted(w.turn.tool_calls, key=lambda c: c.index)]
            entries += [(t["arguments"], t) for t in w.text_calls]
            for args, target in entries:
                raw = args.get(validate.TASK_PROGRESS) if isinstance(args, dict) else None
                tp = progress.parse(raw)
                if tp is None:
                    continue
                if previous is not None:
                    tp["change"] = progress.change(previous, tp)
                target["task_progress"] = tp
                previous = tp
            return previous

        result = w.guard("task_progress", step)
        last[w.turn.id] = result if result is not None else previous


def _validate(w: _Turn) -> None:
    for c in w.turn.tool_calls:
        w.calls[c.index]["violations"] = validate.validate_call(c.name, c.arguments, c.arguments_error, w.view.tools)


def _memo(w: _Turn, name: str, compute: Callable[[], Any]) -> Any:
    """A result that depends on the turn alone, kept on it (TurnInput.memo): the writer
    decodes each turn again as the parent and grandparent of the next ones."""
    memo = w.turn.memo
    if name not in memo:
        memo[name] = compute()
    return memo[name]


def _own_structure(w: _Turn) -> dict[str, Any]:
    user = w.view.last_user
    texts = user.texts() if user else []
    first = w.view.first_user
    return {
        "task": cline_messages.task_text(first.texts()) if first else None,
        "environment": cline_messages.environment(texts),
        "tool_result_blocks": cline_messages.result_blocks(texts),
        "reminders": cline_messages.reminders(texts),
        "no_tool_error": cline_messages.no_tool_error(texts),
    }


def _structure(w: _Turn, child: _Turn | None) -> dict[str, Any]:
    if w.agent != "cline":
        return {}
    child_user = child.view.last_user if child else None
    return {
        **_memo(w, "cline_structure", lambda: _own_structure(w)),
        # This turn's reply used no tool, as the next request tells the model.
        "answered_without_tool": bool(child_user and cline_messages.no_tool_error(child_user.texts())),
    }


def _turn_dict(w: _Turn) -> dict[str, Any]:
    s = w.structure
    return {
        "agent": w.agent,
        "task": s.get("task"),
        "environment": s.get("environment"),
        "tool_result_blocks": s.get("tool_result_blocks", []),
        "reminders": s.get("reminders", []),
        "no_tool_error": s.get("no_tool_error", False),
        "answered_without_tool": s.get("answered_without_tool", False),
        "text_tool_calls": w.text_calls,
        "errors": w.errors,
    }
