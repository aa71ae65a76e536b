"""`tooltap export SESSION --pytest DIR`: a stored session as a cassette and a pytest module.

The module writes the recorded tool calls out as literals, so a reviewer reads what the
test expects in the diff that adds it. It replays each turn through `proxy.testing`:
the recorded request goes to the cassette served on a loopback port, the recorded answer
is reassembled and decoded, and its tool calls must equal the literals.

Nothing is written when anything key-like is left in what would be written.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from ..store.files import FolderError, make_folders, remove_folders, write_private
from .cassette import Cassette, find_secrets, secrets_in_text
from .recording import turn_name
from .upstream import CLINE_VOLATILE


class ExportError(Exception):
    """The export cannot be written (the message says why; nothing was written)."""


def export_pytest(recording, directory: str | Path) -> list[Path]:
    """Write `session_<id>.cassette.json` and `test_session_<id>.py` into `directory`."""
    directory = Path(directory)
    if not recording.turns:  # an empty module would pass without checking anything
        raise ExportError(f"session {recording.session_id} has no turns to export")
    cassette = Cassette.from_recording(recording)
    if recording.agent == "cline" or any(t.decoding and t.decoding.get("agent") == "cline" for t in recording.turns):
        cassette.ignore = list(CLINE_VOLATILE)  # an agent's fresh run still matches
    stem = "session_" + (re.sub(r"\W+", "_", recording.session_id, flags=re.ASCII).strip("_")[:48] or "x")
    cassette_name, module_name = f"{stem}.cassette.json", f"test_{stem}.py"
    cassette_text = cassette.dumps()
    cut_short = {i.turn_id for i in cassette.interactions if i.cut_short}
    module_text = pytest_module(recording, cassette_name, cut_short)

    found = [str(f) for f in find_secrets(cassette)]
    found += [f"{module_name} line {n}: {kind}" for n, line in enumerate(module_text.splitlines(), 1)
              for kind, _ in secrets_in_text(line)]
    if found:
        shown = "; ".join(found[:5]) + (f"; and {len(found) - 5} more" if len(found) > 5 else "")
        raise ExportError(f"refusing to export session {recording.session_id}: {len(found)} key-like "
                          f"string(s) left in it: {shown}. Nothing was written.")
    try:
        made = make_folders(directory)
    except FolderError as exc:
        raise ExportError(f"cannot write into {directory}: {exc}") from None
    try:
        written = [directory / cassette_name, directory / module_name]
        for path, text in zip(written, (cassette_text, module_text)):  # owner-only, as the database is
            write_private(path, text.encode("utf-8"))
    except OSError as exc:
        remove_folders(made)
        raise ExportError(f"cannot write into {directory}: {exc.strerror or exc}") from exc
    return written


def pytest_module(recording, cassette_name: str, cut_short: set | frozenset = frozenset()) -> str:
    """The module's text; `cut_short` holds the ids of the turns whose connection the
    upstream dropped mid-answer (their replay must end the same way)."""
    turns = []
    places = recording.places
    for turn in recording.turns:
        calls = "".join(
            f"        Call(\n            tool={literal(c.tool)},\n            name={literal(c.name)},\n"
            f"            arguments={literal(c.arguments, 12)},\n        ),\n" for c in turn.calls)
        status, place = turn.http_status or 502, places[turn.id]
        # The place names the test (turn1, turn2...): the same in every database the session
        # is exported from; the id, in the comment, finds the turn in this one.
        ending = ", CUT_SHORT" if turn.id in cut_short else ""
        turns.append(f"    # {turn_name(place, turn.id)}: {_comment(turn.method + ' ' + turn.path)}\n"
                     + (f"    ({place}, {status}, [\n{calls}    ]{ending}),\n" if calls
                        else f"    ({place}, {status}, []{ending}),\n"))
    session = {"id": recording.session_id, "title": recording.title, "agent": recording.agent}
    return _MODULE.format(session=literal(session), cassette=literal(cassette_name),
                          session_id=_comment(recording.session_id), turns="".join(turns))


_MODULE = '''"""A tooltap regression test, exported from a recorded session by `tooltap export`.

Each test sends one recorded request to the cassette beside this file (served on a free
loopback port by tooltap's `tooltap_cassette` fixture, never the network), reassembles
the recorded answer and checks its tool calls against the ones written below: the
decoded tool, the raw name and the arguments. A turn marked CUT_SHORT is one whose
connection the upstream dropped mid-answer: its replay must end the same way, after the
same bytes; any other turn must end whole. When the cassette's answers or the code that
reads them change, the failure names the turn, the tool, the argument path and both
values. Regenerate with `tooltap export SESSION --pytest DIR`.
"""

import pytest

from proxy.testing import Call, assert_calls

SESSION = {session}
pytestmark = pytest.mark.tooltap_cassette({cassette})

CUT_SHORT = "cut short"  # the upstream dropped the connection mid-answer, as recorded

# (turn: its place in the session, HTTP status, tool calls[, CUT_SHORT]), in recorded order.
TURNS = [
{turns}]


@pytest.mark.parametrize("index", range(len(TURNS)), ids=[f"turn{{t[0]}}" for t in TURNS])
def test_turn(tooltap_cassette, index):
    turn, status, expected, *ending = TURNS[index]
    answer = tooltap_cassette.send(index)
    assert answer.status == status, f"turn {{turn}}: HTTP {{answer.status}}, recorded {{status}}"
    if CUT_SHORT in ending:  # the same bytes, then the same abrupt end
        recorded = tooltap_cassette.interactions[index].body
        assert answer.cut_short, f"turn {{turn}}: the answer ended whole, the recorded one was cut short"
        assert answer.body == recorded, (f"turn {{turn}}: {{len(answer.body)}} bytes came before the cut, "
                                         f"recorded {{len(recorded)}}")
    else:
        assert not answer.cut_short, (f"turn {{turn}}: the connection dropped after {{len(answer.body)}} bytes, "
                                      "the recorded answer ended whole")
    assert_calls(expected, answer.calls, label=f"turn {{turn}}")
'''


def _comment(text: str) -> str:
    return re.sub(r"[\r\n\x00-\x1f]", " ", text)[:120]


def literal(value: Any, indent: int = 0, width: int = 88) -> str:
    """A Python literal for a JSON value, laid out for reading: short values on one line,
    longer objects and arrays one entry per line."""
    flat = _flat(value)
    if len(flat) + indent <= width:
        return flat
    if isinstance(value, str) and "\n" in value.rstrip("\n"):  # a checklist reads one item a line
        lines = value.splitlines(keepends=True)
        pad = " " * (indent + 4)
        return "(\n" + "".join(f"{pad}{_flat(line)}\n" for line in lines) + " " * indent + ")"
    if not isinstance(value, (dict, list)) or not value:
        return flat
    pad = " " * (indent + 4)
    if isinstance(value, dict):
        items = [f"{pad}{_flat(str(k))}: {literal(v, indent + 4, width)}," for k, v in value.items()]
        return "{\n" + "\n".join(items) + "\n" + " " * indent + "}"
    items = [f"{pad}{literal(v, indent + 4, width)}," for v in value]
    return "[\n" + "\n".join(items) + "\n" + " " * indent + "]"


def _flat(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_flat(str(k))}: {_flat(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_flat(v) for v in value) + "]"
    if isinstance(value, float) and not math.isfinite(value):
        return f'float("{value}")'
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    return repr(str(value))
