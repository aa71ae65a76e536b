"""Credentials by rule, not by list: every gateway's and cloud's header, key-shaped values
anywhere in headers and query, names the operator adds. Through a real tooltap, with
the database file read byte by byte."""

from __future__ import annotations

import re
import secrets as random
import subprocess
import sys
import time
from pathlib import Path

import httpx

from proxy.capture import Capture, TurnRecord
from proxy.scripted import Reply
from proxy.secrets import fingerprint, is_secret_name
from tests.conftest import free_port

# Credential headers seen in the wild: providers, gateways, clouds, proxies.
CREDENTIAL_HEADERS = [
    "Authorization", "x-api-key", "api-key", "x-goog-api-key", "Cookie",
    "helicone-auth", "x-helicone-api-key", "x-amz-security-token", "x-litellm-api-key", "x-portkey-api-key",
    "x-portkey-virtual-key", "cf-aig-authorization", "ocp-apim-subscription-key", "x-functions-key",
    "x-goog-iam-authorization-token", "x-aws-ec2-metadata-token", "cf-access-client-secret",
    "x-auth-token", "x-access-token", "x-refresh-token", "x-session-token", "x-csrf-token",
    "x-api-token", "x-client-secret", "x-db-password", "x-upstream-credentials", "x-request-signature",
    "x-jwt-assertion", "x-oauth-token", "openrouter-api-key", "x-braintrust-api-key", "x-session-id",
    "X-Vault-Token", "apiKey", "X-Auth-Key", "X-Sentry-Auth", "x-workspace-secret",
]
# Headers that carry no credential: they must stay readable.
PLAIN_HEADERS = {
    "openai-organization": "org-Abc123", "openai-project": "proj_abc", "anthropic-version": "2023-06-01",
    "anthropic-beta": "tools-2024-04-04", "x-stainless-retry-count": "0", "x-goog-api-client": "genai-py/1.0",
    "x-portkey-provider": "openai", "x-request-id": "req-42", "x-amz-date": "20250101T000000Z",
    "http-referer": "https://example.com", "x-title": "My agent", "idempotency-key": "stainless-python-retry-1f2e",
}
KEYS = {  # values shaped like real keys, sent under names that say nothing
    "x-custom-forward": "Bearer sk-ant-api03-" + "A" * 40 + "xyzQ",
    "x-model-config": '{"provider":"openai","api_key":"sk-proj-' + "b" * 40 + 'k3y9"}',
    "x-debug-note": "google AIzaSy" + "C" * 33 + " slack xoxb-1234567890-0987654321-" + "d" * 24,
    "x-gh": "ghp_" + "E" * 36,
    "x-assertion": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJlLWJ5dGVz",
    "x-aws": "AKIAIOSFODNN7EXAMPLE",
}
FINGERPRINT = re.compile(r"^(?:(?:Bearer|Basic|Token|Bot) )?…(?:\S{4})?#[0-9a-f]{8}$")


def chat_reply():
    return Reply(200, [("content-type", "application/json"), ("set-cookie", "sid=" + "S" * 30),
                       ("x-ratelimit-remaining-tokens", "149984"), ("anthropic-ratelimit-tokens-limit", "400000"),
                       ("x-litellm-response-cost", "0.0021")],
                 [b'{"id":"r","object":"chat.completion","model":"m","choices":[]}'])


def db_bytes(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))


def test_credentials_by_rule_never_reach_the_database(tooltap, upstream):
    upstream.routes["/v1/chat/completions"] = chat_reply()
    sent = {name: ("Bearer " if name == "Authorization" else "") + f"val{i:02d}-{random.token_hex(12)}"
            for i, name in enumerate(CREDENTIAL_HEADERS)}
    query_secrets = {"key": "AIzaSy" + random.token_hex(16), "X-Amz-Signature": random.token_hex(32),
                     "X-Amz-Credential": "AKIAIOSFODNN7EXAMPLE/20250101/us-east-1/s3/aws4_request",
                     "sig": random.token_hex(16), "access_token": random.token_hex(16),
                     "sessionToken": random.token_hex(16)}
    query = "&".join(f"{k}={v}" for k, v in query_secrets.items()) + "&api-version=2024-10-21&note=sk-" + "q" * 30
    r = httpx.post(f"{tooltap.url}/v1/chat/completions?{query}", json={"model": "m", "messages": []},
                   headers={**sent, **PLAIN_HEADERS, **KEYS})
    assert r.status_code == 200
    got = upstream.received[0]
    for name, value in {**sent, **KEYS}.items():
        assert got.header(name) == value, name  # forwarded untouched
    assert got.query == query

    turn = tooltap.api(f"/turns/{tooltap.api('/turns')['turns'][0]['id']}")
    stored = db_bytes(tooltap.db_path)
    assert len(stored) > 10_000
    secret_parts = [v.removeprefix("Bearer ") for v in sent.values()] + list(query_secrets.values()) + [
        "A" * 40, "b" * 40, "C" * 33, "d" * 24, "E" * 36, "c2lnbmF0dXJlLWJ5dGVz", "AKIAIOSFODNN7EXAMPLE", "q" * 30,
        "S" * 30]
    for part in secret_parts:
        assert part.encode() not in stored, part
        assert part not in str(turn), part

    headers = {k.lower(): v for k, v in turn["request_headers"]}
    for name, value in sent.items():
        assert FINGERPRINT.match(headers[name.lower()]), (name, headers[name.lower()])
    assert headers["authorization"] == "Bearer " + fingerprint(sent["Authorization"].removeprefix("Bearer "))
    for name, value in PLAIN_HEADERS.items():
        assert headers[name] == value, name
    # Key-shaped values are fingerprinted in place; the text around them stays.
    assert re.fullmatch(r"Bearer …xyzQ#[0-9a-f]{8}", headers["x-custom-forward"])
    assert re.fullmatch(r'\{"provider":"openai","api_key":"…k3y9#[0-9a-f]{8}"\}', headers["x-model-config"])
    assert headers["x-debug-note"].startswith("google …") and " slack …" in headers["x-debug-note"]
    assert headers["x-aws"] == fingerprint("AKIAIOSFODNN7EXAMPLE")

    path_query = turn["path"].split("?", 1)[1]
    assert "api-version=2024-10-21" in path_query
    for name, value in query_secrets.items():
        assert f"{name}={fingerprint(value)}" in path_query.split("&"), name
    assert f"note={fingerprint('sk-' + 'q' * 30)}" in path_query

    response_headers = {k.lower(): v for k, v in turn["response_headers"]}
    assert FINGERPRINT.match(response_headers["set-cookie"])
    assert response_headers["x-ratelimit-remaining-tokens"] == "149984"  # counts of tokens are not tokens
    assert response_headers["anthropic-ratelimit-tokens-limit"] == "400000"
    assert response_headers["x-litellm-response-cost"] == "0.0021"


def test_the_turn_handed_to_the_store_holds_only_fingerprinted_headers():
    # The hot path passes the headers on as they came and redacts them after the stream:
    # what finish() hands to the journal must be redacted all the same.
    key = "sk-" + "K" * 40
    capture = Capture(TurnRecord(started_at=time.time(), method="POST", path="/v1/chat/completions",
                                 upstream="http://up", request_body=b"{}",
                                 request_headers=[("authorization", "Bearer " + key), ("accept", "*/*")]), None)
    capture.response_started(200, [("content-type", "application/json"), ("set-cookie", "sid=" + "S" * 30),
                                   ("x-request-id", "req_8f3a")], "application/json")
    capture.feed(b"{}")
    record = capture.finish()
    headers = dict(record.response_headers)
    assert FINGERPRINT.match(headers["set-cookie"]) and "S" * 30 not in str(record.response_headers)
    assert headers["content-type"] == "application/json" and headers["x-request-id"] == "req_8f3a"
    sent = dict(record.request_headers)
    assert sent["authorization"] == "Bearer " + fingerprint(key) and key not in str(record.request_headers)
    assert sent["accept"] == "*/*"


def test_the_name_rule_on_its_own():
    for name in CREDENTIAL_HEADERS + ["key", "api_key", "client_secret", "password", "X-Goog-Signature", "sessionid"]:
        assert is_secret_name(name), name
    for name in [*PLAIN_HEADERS, "x-ratelimit-limit-tokens", "www-authenticate", "x-tooltap-session", "keep-alive",
                 "x-portkey-config", "api-version", "alt", "monkey", "x-honeycomb-team"]:
        assert not is_secret_name(name), name


def _serve(tmp_path, upstream, *args, env=None):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--upstream", upstream.url, "--db", str(tmp_path / "t.db"),
         "--port", str(port), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env={**__import__("os").environ, **(env or {})})
    deadline = time.monotonic() + 20
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/_tooltap/api/turns", timeout=1)
            return proc, f"http://127.0.0.1:{port}"
        except httpx.TransportError:
            assert time.monotonic() < deadline and proc.poll() is None, proc.stdout.read().decode()
            time.sleep(0.1)


def test_operator_names_more_secret_headers(tmp_path, upstream):
    """`--secret-header` and TOOLTAP_SECRET_HEADERS (added together), on a real `tooltap serve`."""
    upstream.routes["/chat/completions"] = chat_reply()
    team, tenant, plain = "hny_" + random.token_hex(12), "tenant-" + random.token_hex(12), "plain-" + random.token_hex(8)
    proc, url = _serve(tmp_path, upstream, "--secret-header", "X-Honeycomb-Team",
                       env={"TOOLTAP_SECRET_HEADERS": "x-other, X-Tenant"})
    try:
        r = httpx.post(f"{url}/chat/completions?x-tenant={tenant}", json={"model": "m", "messages": []},
                       headers={"x-honeycomb-team": team, "x-tenant": tenant, "x-plain": plain})
        assert r.status_code == 200
        deadline = time.monotonic() + 10
        while not (turns := httpx.get(f"{url}/_tooltap/api/turns").json()["turns"]):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        turn = httpx.get(f"{url}/_tooltap/api/turns/{turns[0]['id']}").json()
    finally:
        proc.terminate()
        proc.wait(20)
    headers = dict(turn["request_headers"])
    assert headers["x-honeycomb-team"] == fingerprint(team)
    assert headers["x-tenant"] == fingerprint(tenant)
    assert turn["path"].endswith("?x-tenant=" + fingerprint(tenant))
    assert headers["x-plain"] == plain
    stored = db_bytes(tmp_path / "t.db")
    assert team.encode() not in stored and tenant.encode() not in stored and plain.encode() in stored



def test_what_tooltap_writes_captures_to_is_its_owners_alone(tmp_path, upstream):
    """Prompts, code and answers are in the database, its WAL, the journal and the spool:
    other users of the machine cannot read them."""
    import os
    import signal
    import stat

    from proxy.store.spool import Spool
    from tests.processes import start

    upstream.routes["/chat/completions"] = Reply.json({"id": "c", "object": "chat.completion", "choices": []})
    tt = start(tmp_path, "--upstream", upstream.url)
    try:
        assert httpx.post(f"{tt.url}/chat/completions", json={"model": "m", "messages": []}).status_code == 200
        deadline = time.monotonic() + 15
        while not httpx.get(f"{tt.url}/_tooltap/api/turns").json()["turns"]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        files = [tt.db, Path(f"{tt.db}-wal"), *Path(tmp_path).glob(".tooltap.db.journal/*/*.seg")]
        assert len(files) >= 3
        for f in files:
            assert stat.S_IMODE(os.stat(f).st_mode) == 0o600, f
        folders = [tmp_path / ".tooltap.db.journal", *Path(tmp_path).glob(".tooltap.db.journal/*/")]
        assert len(folders) >= 2
        for folder in folders:  # their names say when turns came: the owner's alone too
            assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700, folder
    finally:
        tt.signal(signal.SIGTERM)
        tt.wait(10)
    spool = Spool(str(tmp_path / "s.jsonl"))
    spool.append([TurnRecord(started_at=1.0, method="POST", path="/x", upstream="u", request_headers=[],
                             request_body=b"{}")])
    assert stat.S_IMODE(os.stat(tmp_path / "s.jsonl").st_mode) == 0o600
