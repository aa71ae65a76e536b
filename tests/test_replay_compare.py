"""How recorded and replayed tool calls are paired when their order does not count."""

from __future__ import annotations

import itertools

from proxy.replay.compare import Call, Rules, compare_calls

PARIS, TOKYO = {"city": "Paris", "unit": "c"}, {"city": "東京", "unit": "c"}


def test_unordered_pairing_does_not_depend_on_the_order_the_replay_called_in():
    """A replayed call that fits two recorded ones must not take the one only it could
    match: `{unit}` fits Paris and Tokyo under --args subset, `{Paris}` fits Paris only."""
    recorded = [Call("get_weather", PARIS), Call("get_weather", TOKYO)]
    replayed = [Call("get_weather", {"unit": "c"}), Call("get_weather", PARIS)]
    rules = Rules(order="unordered", args="subset")
    for order in itertools.permutations(replayed):
        assert compare_calls(recorded, list(order), rules) == [], order


def test_calls_that_differ_are_paired_with_the_closest_and_only_their_differences_named():
    recorded = [Call("get_weather", PARIS), Call("get_weather", TOKYO)]
    replayed = [Call("get_weather", {**TOKYO, "unit": "f"}), Call("get_weather", PARIS)]
    (only,) = compare_calls(recorded, replayed, Rules(order="unordered"))
    assert (only.index, only.path, only.expected, only.actual) == (1, "$.unit", "c", "f")


def test_unpaired_calls_are_missing_or_extra_as_the_order_mode_says():
    recorded = [Call("read", {"p": 1}), Call("write", {"p": 2})]
    replayed = [Call("write", {"p": 2}), Call("list", {})]
    kinds = lambda rules: sorted(m.kind for m in compare_calls(recorded, replayed, rules))  # noqa: E731
    assert kinds(Rules(order="unordered")) == ["extra_call", "missing_call"]
    assert kinds(Rules(order="subset")) == ["extra_call"]
    assert kinds(Rules(order="superset")) == ["missing_call"]
