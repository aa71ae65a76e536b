"""tooltap's pytest plugin: the `tooltap_cassette` mark and fixture (testing.py serves the
cassette). Registered through the `pytest11` entry point named `tooltap`."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from .replay.cassette import Cassette, CassetteError
from .testing import CassetteMiss, ServedCassette, serve_cassette


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers", "tooltap_cassette(path, ignore=(), speed=0): serve this tooltap cassette (a path "
                   "relative to the test file) as the `tooltap_cassette` fixture")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A miss fails the test itself, not only its teardown, even when the code under test
    caught the error it was answered with; when that code raised instead (the SDK's 404),
    the miss is the failure, named once, with what the code then raised."""
    served = getattr(item, "funcargs", {}).get("tooltap_cassette")
    try:
        result = yield
    except (Exception, pytest.fail.Exception) as exc:  # pytest.fail, and pytest.raises' DID NOT RAISE
        missed = _misses(served)
        if missed is None:
            raise
        # Its first line only: an SDK's error repeats the cassette's answer, the miss itself.
        said = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        missed += (f"\n(the code under test then raised {type(exc).__name__}{_where(exc, item)}"
                   f"{': ' + said if said else ''})")
    else:
        missed = _misses(served)
        if missed is None:
            return result
    # Failed out here, not in the handler above: pytest would print the miss again with
    # every exception it chained to.
    pytest.fail(missed, pytrace=False)


def _where(exc: BaseException, item) -> str:
    """` at test_x.py:12`: the test's own line the exception passed through, if any."""
    import traceback

    path = str(getattr(item, "path", ""))
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == path]
    return f" at {Path(path).name}:{lines[-1]}" if lines else ""


def _misses(served) -> str | None:
    """The misses not reported yet, said; None when there are none."""
    if isinstance(served, ServedCassette):
        try:
            served.check()
        except CassetteMiss as exc:
            return str(exc)
    return None


@pytest.fixture
def tooltap_cassette(request) -> Iterator[ServedCassette]:
    """The cassette named by the test's `tooltap_cassette` mark, served on a free loopback
    port. Any request it has no answer for fails the test, even if the code under test
    caught the error."""
    mark = request.node.get_closest_marker("tooltap_cassette")
    if mark is None or not mark.args:
        pytest.fail("tooltap_cassette: mark the test (or module) with "
                    "@pytest.mark.tooltap_cassette('PATH.cassette.json')", pytrace=False)
    path = Path(mark.args[0])
    if not path.is_absolute():
        path = Path(request.path).parent / path
    try:
        cassette, damaged = Cassette.load(path), ""
    except CassetteError as exc:
        cassette, damaged = None, str(exc)
    if cassette is None:  # failed out here: pytest would print the exception it chained to
        pytest.fail(f"tooltap_cassette: {damaged}", pytrace=False)
    with serve_cassette(cassette, ignore=mark.kwargs.get("ignore"), speed=mark.kwargs.get("speed", 0.0)) as served:
        yield served
        missed = _misses(served)
        if missed is not None:
            pytest.fail(missed, pytrace=False)
