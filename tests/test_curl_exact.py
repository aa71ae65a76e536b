"""The turn page's "copy as curl": a body the store keeps as sent (not JSON) reaches the
upstream again byte for byte when the copied command runs, and nothing in it runs.
Bodies a page, a shell argument or curl itself would change go in the /request file."""

from __future__ import annotations

import os
import re
import shlex
import subprocess

import httpx
import pytest

from inspector_ui.curl import as_curl
from proxy.scripted import Reply

FILE_ARG = "--data-binary @tooltap-turn-7-request.txt"  # a text body: .txt


def text_turn(body: str) -> dict:
    return {"id": 7, "method": "POST", "path": "/echo", "request": body, "request_encoding": "text",
            "request_headers": [["content-type", "text/plain"]]}


@pytest.mark.parametrize("body", ["@notes.txt", "line one\r\nline two", "a\0b"])
def test_bodies_curl_would_not_get_as_sent_go_in_the_file(body):
    assert as_curl(text_turn(body), "http://tt").endswith(FILE_ARG)


def test_a_plain_text_body_stays_inline_and_quoted_whole():
    body = "it's $(touch pwned) `id` \\n é\n"
    command = as_curl(text_turn(body), "http://tt")
    words = shlex.split(command.replace("\\\n", " "))
    assert words[-2:] == ["--data-binary", body]


# A body for each case, sent as text/plain: the store keeps it as sent.
BODIES = [
    b"plain: it's $(touch pwned) `touch pwned` \xc3\xa9\n",  # inline, quoted whole
    b"first\r\nsecond\rthird\r\n",  # CR: a page's text would hand it over as LF
    b"before\0after",  # NUL: no shell argument holds it
    b"@decoy.txt",  # curl would send the file decoy.txt instead
    "rtl \u202egpj.exe".encode(),  # a bidirectional control: the page would show a mark
]


def run_copied_command(page, tooltap, turn_id: int, cwd) -> None:
    """What a person does: copy the command from the page (the copy button takes the
    element's textContent), fetch the body file if it names one, run it in a shell."""
    page.goto(f"{tooltap.url}/_tooltap/turns/{turn_id}")
    command = page.eval_on_selector("#curl", "e => e.textContent")
    file = re.search(r"@(tooltap-turn-\d+-request\.(?:json|txt|bin))$", command)
    if file:
        (cwd / file.group(1)).write_bytes(httpx.get(f"{tooltap.url}/_tooltap/turns/{turn_id}/request").content)
    env = {k: v for k, v in os.environ.items() if k != "API_KEY"}
    subprocess.run(["bash", "-c", command], cwd=cwd, env=env, check=True, timeout=30, capture_output=True)


@pytest.mark.parametrize("sent", BODIES)
def test_the_copied_command_sends_the_body_as_sent(tooltap, upstream, page, tmp_path, sent):
    upstream.routes["/echo"] = Reply(200, [("content-type", "text/plain")], [b"ok"])
    (tmp_path / "decoy.txt").write_bytes(b"not the body")
    r = httpx.post(f"{tooltap.url}/echo", content=sent, headers={"content-type": "text/plain"})
    assert r.status_code == 200
    turn = tooltap.api("/turns")["turns"][0]
    assert tooltap.api(f"/turns/{turn['id']}")["request_encoding"] == "text"
    run_copied_command(page, tooltap, turn["id"], tmp_path)
    assert len(upstream.received) == 2
    assert upstream.received[-1].body == sent
    assert not (tmp_path / "pwned").exists()


def test_a_compressed_request_stored_decoded_is_sent_decoded(tooltap, upstream, tmp_path):
    """A gzip request body is stored parsed: the command sends that JSON, without the
    Content-Encoding that no longer describes it."""
    import gzip
    import json

    upstream.routes["/chat/completions"] = Reply.json({"ok": True})
    request = {"model": "m", "messages": [{"role": "user", "content": "zipped"}]}
    r = httpx.post(f"{tooltap.url}/chat/completions", content=gzip.compress(json.dumps(request).encode()),
                   headers={"content-type": "application/json", "content-encoding": "gzip"})
    assert r.status_code == 200
    turn = tooltap.api(f"/turns/{tooltap.api('/turns')['turns'][0]['id']}")
    assert turn["request_encoding"] == "json"
    subprocess.run(["bash", "-c", as_curl(turn, tooltap.url)], cwd=tmp_path, check=True, timeout=30,
                   capture_output=True)
    assert upstream.received[-1].header("content-encoding") is None
    assert upstream.received[-1].json() == request


def test_bidirectional_controls_in_headers_and_json_go_as_sent(tooltap, upstream, page, tmp_path):
    """The page marks such controls; the copied command still sends them: a header as a
    $'\\u202e' word, a JSON body with the control as its escape (the same JSON)."""
    import json

    upstream.routes["/chat/completions"] = Reply.json({"ok": True})
    request = {"model": "m", "messages": [{"role": "user", "content": "run \u202egpj.exe"}]}
    r = httpx.post(f"{tooltap.url}/chat/completions", content=json.dumps(request).encode(),
                   headers={"content-type": "application/json", "x-title": "my\u202eapp".encode()})
    assert r.status_code == 200
    turn = tooltap.api("/turns")["turns"][0]
    run_copied_command(page, tooltap, turn["id"], tmp_path)
    assert upstream.received[-1].json() == request
    assert upstream.received[-1].header("x-title") == upstream.received[0].header("x-title")
