"""The benchmarks are scripts, not tests, so an API they call can change under them
unseen (bench/writer.py stopped at its first turn once `Capture.response_started` lost
an argument). Their shared pieces are exercised here."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _bench(name: str):
    """A bench script as a module, loaded from its file (bench/ is not put on sys.path,
    where its `common` and `upstream` would shadow other modules for the whole run)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


captured = _bench("common").captured
chat_stream = _bench("upstream").chat_stream


def test_a_turn_captured_as_the_benchmarks_make_them_is_assembled():
    body = json.dumps({"model": "bench-model", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    from proxy import apis
    from proxy.capture import assemble

    rec = captured(body.encode(), chat_stream(20, 200))
    assert rec.status == "ok" and rec.http_status == 200 and rec.response is None  # the writer assembles
    assemble(rec, apis.by_name("openai.chat"), None)
    assert not rec.error
    message = rec.response["choices"][0]["message"]
    assert message["tool_calls"][0]["function"]["name"] == "write_file"
    assert rec.raw_size == sum(len(e) for e in chat_stream(20, 200))
