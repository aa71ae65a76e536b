"""Recorded tool calls against replayed ones: which tool, then the arguments as JSON.

Arguments compare as values, not text: key order does not matter and 1 equals 1.0 (but
true is not 1). Order modes say how the two lists of calls must line up; argument modes
say how one call's arguments must match; both can be set per tool. Every mismatch says
why, in words a person reads at a glance, with the JSON path and both values.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

ORDER_MODES = ("strict", "unordered", "subset", "superset")
# subset: the replay made only calls that were recorded (it may omit some);
# superset: the replay made every recorded call (it may add more).
ARG_MODES = ("exact", "subset", "superset", "ignore")
# subset: every argument the replay sent was recorded with the same value;
# superset: the replay sent every recorded argument with the same value.


@dataclass(frozen=True)
class Call:
    """What comparison needs of a tool call: the decoded tool and the arguments."""

    tool: str
    arguments: Any
    name: str = ""  # the raw name, shown when it differs from the tool


@dataclass
class Mismatch:
    kind: str  # "other_tool" | "missing_call" | "extra_call" | "argument"
    index: int | None  # position of the recorded call (or of the replayed one for extra_call)
    tool: str
    reason: str
    path: str | None = None
    expected: Any = None
    actual: Any = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Rules:
    order: str = "strict"
    args: str = "exact"
    per_tool: dict[str, str] = field(default_factory=dict)  # tool -> argument mode
    ignore: tuple[str, ...] = ()  # argument paths: "task_progress", "$.a.b", "get_forecast:$.x"

    def __post_init__(self) -> None:
        if self.order not in ORDER_MODES:
            raise ValueError(f"order mode {self.order!r}: use one of {', '.join(ORDER_MODES)}")
        for mode in [self.args, *self.per_tool.values()]:
            if mode not in ARG_MODES:
                raise ValueError(f"argument mode {mode!r}: use one of {', '.join(ARG_MODES)}")

    def mode_for(self, tool: str) -> str:
        short = tool.rsplit("/", 1)[-1]
        return self.per_tool.get(tool, self.per_tool.get(short, self.args))

    def ignored_paths(self, tool: str) -> list[str]:
        short = tool.rsplit("/", 1)[-1]
        out = []
        for spec in self.ignore:  # "TOOL:PATH" scopes a path to one tool
            scope, sep, path = spec.partition(":") if not spec.startswith("$") else ("", "", spec)
            if not sep:
                path = spec
            if not sep or scope in (tool, short):
                out.append(normalize_path(path))
        return out


def normalize_path(path: str) -> str:
    path = path.strip()
    if path.startswith("$"):
        return path
    return "$" + ("" if path.startswith("[") else ".") + path


def compare_calls(expected: Iterable[Call], actual: Iterable[Call], rules: Rules | None = None) -> list[Mismatch]:
    """Every way `actual` differs from `expected` under `rules`; [] means they match."""
    rules = rules or Rules()
    expected, actual = list(expected), list(actual)
    if rules.order == "strict":
        return _strict(expected, actual, rules)
    return _matched(expected, actual, rules)


def _strict(expected: list[Call], actual: list[Call], rules: Rules) -> list[Mismatch]:
    out: list[Mismatch] = []
    for i, (e, a) in enumerate(zip(expected, actual)):
        if e.tool != a.tool:
            out.append(Mismatch("other_tool", i, e.tool, f"call {i}: the replay called {a.tool!r} "
                                f"where {e.tool!r} was recorded", None, e.tool, a.tool))
        else:
            out += argument_mismatches(i, e, a, rules)
    out += [_missing(i, e) for i, e in enumerate(expected[len(actual):], len(actual))]
    out += [_extra(i, a) for i, a in enumerate(actual[len(expected):], len(expected))]
    return out


def _matched(expected: list[Call], actual: list[Call], rules: Rules) -> list[Mismatch]:
    """Pair recorded calls with replayed calls of the same tool: first as many pairs whose
    arguments match as can be made, whatever the order the calls came in (taking the first
    that fits can leave a call unpaired that another pairing matches); then each recorded
    call left with the free call of its tool that differs least, its differences reported."""
    diffs = {(i, j): argument_mismatches(i, e, a, rules)
             for i, e in enumerate(expected) for j, a in enumerate(actual) if a.tool == e.tool}
    taken: dict[int, int] = {}  # replayed call -> the recorded call it matches

    def pair(i: int, tried: set[int]) -> bool:  # an augmenting path (Kuhn's algorithm)
        for j in range(len(actual)):
            if j not in tried and (i, j) in diffs and not diffs[i, j]:
                tried.add(j)
                if j not in taken or pair(taken[j], tried):
                    taken[j] = i
                    return True
        return False

    for i in range(len(expected)):
        pair(i, set())
    matched = set(taken.values())
    free = [j for j in range(len(actual)) if j not in taken]
    out: list[Mismatch] = []
    for i, e in enumerate(expected):
        if i in matched:
            continue
        same_tool = [j for j in free if (i, j) in diffs]
        if not same_tool:
            if rules.order != "subset":
                out.append(_missing(i, e))
            continue
        j = min(same_tool, key=lambda j: len(diffs[i, j]))
        free.remove(j)
        out += diffs[i, j]
    if rules.order != "superset":
        out += [_extra(j, actual[j]) for j in free]
    return out


def _missing(i: int, e: Call) -> Mismatch:
    return Mismatch("missing_call", i, e.tool, f"call {i}: {e.tool!r} was recorded, the replay did not call it",
                    None, e.arguments, None)


def _extra(j: int, a: Call) -> Mismatch:
    return Mismatch("extra_call", j, a.tool, f"the replay called {a.tool!r}, which was not recorded here",
                    None, None, a.arguments)


def argument_mismatches(i: int, e: Call, a: Call, rules: Rules) -> list[Mismatch]:
    mode = rules.mode_for(e.tool)
    if mode == "ignore":
        return []
    ignored = rules.ignored_paths(e.tool)
    out = []
    for path, want, got in value_diff("$", e.arguments, a.arguments):
        if any(path == p or path.startswith(p + ".") or path.startswith(p + "[") for p in ignored):
            continue
        if mode == "subset" and got is ABSENT:  # the replay left a recorded argument out
            continue
        if mode == "superset" and want is ABSENT:  # the replay added an argument
            continue
        out.append(Mismatch("argument", i, e.tool, f"call {i} {e.tool!r}: {path} {describe(want, got)}",
                            path, _shown(want), _shown(got)))
    return out


class _Absent:
    def __repr__(self) -> str:
        return "<absent>"


ABSENT: Any = _Absent()


def value_diff(path: str, a: Any, b: Any) -> list[tuple[str, Any, Any]]:
    """(path, expected, actual) for each place two JSON values differ; ABSENT marks a key
    one side lacks. Objects compare key by key, arrays element by element."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in list(a) + [k for k in b if k not in a]:
            out += value_diff(_join(path, key), a.get(key, ABSENT), b.get(key, ABSENT))
        return out
    if isinstance(a, list) and isinstance(b, list):
        out = []
        for i in range(max(len(a), len(b))):
            out += value_diff(f"{path}[{i}]", a[i] if i < len(a) else ABSENT, b[i] if i < len(b) else ABSENT)
        return out
    return [] if same_value(a, b) else [(path, a, b)]


def same_value(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or (a != a and b != b)  # NaN, which a model can write, is the same as itself
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    return a == b


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key) else f"{path}[{json.dumps(key)}]"


def _shown(value: Any) -> Any:
    return None if value is ABSENT else value


def describe(want: Any, got: Any, side: str = "replayed") -> str:
    """One difference in words: `want` as recorded, `got` as `side` saw it (ABSENT: the
    key is not there). Long strings are shown around where they first differ."""
    if got is ABSENT:
        return f"recorded {short(want)}, missing from the {side} one"
    if want is ABSENT:
        return f"not recorded, the {side} one has {short(got)}"
    if isinstance(want, str) and isinstance(got, str):
        want_text, got_text = around_difference(want, got)
        return f"recorded {want_text}, {side} {got_text}"
    return f"recorded {short(want)}, {side} {short(got)}"


def around_difference(a: str, b: str, context: int = 30) -> tuple[str, str]:
    """Two long strings shown around where they first differ."""
    i = next((n for n, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    start = max(0, i - context)

    def cut(s: str) -> str:
        piece = s[start:i + context]
        return ("…" if start else "") + json.dumps(piece, ensure_ascii=False) + ("…" if i + context < len(s) else "")

    return cut(a), cut(b)


def short(value: Any, width: int = 80) -> str:
    text = json.dumps(None if value is ABSENT else value, ensure_ascii=False)
    return text if len(text) <= width else text[:width - 1] + "…"


def pass_hat_k(verdicts: list[list[bool]]) -> float | None:
    """pass^k: the share of turns whose every one of k runs passed (tau-bench's measure
    of reliability, stricter than pass@k)."""
    if not verdicts:
        return None
    return sum(all(runs) for runs in verdicts) / len(verdicts)
