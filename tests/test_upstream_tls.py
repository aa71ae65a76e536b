"""An HTTPS upstream, as every real provider is: its certificate is checked against the
trust store (here a test CA, given as SSL_CERT_FILE like any other custom CA) and its
host name verified; a certificate nobody vouches for is a 502 that says so, and nothing
is sent."""

from __future__ import annotations

import openai
import pytest
import trustme

from proxy import upstream as upstream_client
from proxy.scripted import Reply, ScriptedUpstream
from tests.conftest import Server

ANSWER = {"id": "c", "object": "chat.completion", "created": 1, "model": "m",
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "over TLS"}, "finish_reason": "stop"}]}


@pytest.fixture
def https_upstream(tmp_path):
    ca = trustme.CA()
    cert = ca.issue_cert("localhost")
    key, chain = tmp_path / "key.pem", tmp_path / "chain.pem"
    cert.private_key_pem.write_to_path(str(key))
    cert.cert_chain_pems[0].write_to_path(str(chain))
    for extra in cert.cert_chain_pems[1:]:
        with open(chain, "ab") as f:
            f.write(extra.bytes())
    scripted = ScriptedUpstream()
    with Server(scripted, ssl_keyfile=str(key), ssl_certfile=str(chain)) as server:
        scripted.url = f"https://localhost:{server.port}"
        ca_file = tmp_path / "ca.pem"
        ca.cert_pem.write_to_path(str(ca_file))
        yield scripted, str(ca_file)


@pytest.fixture
def fresh_trust(monkeypatch):
    """The client reads the trust store once per process: read it again with this test's."""
    monkeypatch.setattr(upstream_client, "_tls", None)
    return monkeypatch


def test_a_verified_https_upstream(make_tooltap, https_upstream, fresh_trust):
    up, ca_file = https_upstream
    fresh_trust.setenv("SSL_CERT_FILE", ca_file)
    up.routes["/chat/completions"] = Reply.json(ANSWER)
    tt = make_tooltap(up.url)
    client = openai.OpenAI(base_url=tt.url, api_key="sk-test", max_retries=0)
    for _ in range(2):  # the second on the kept-alive TLS connection
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert r.choices[0].message.content == "over TLS"
    assert len(up.received) == 2
    assert {t["status"] for t in tt.api("/turns")["turns"]} == {"ok"}


def test_a_certificate_nobody_vouches_for_is_a_502_naming_it(make_tooltap, https_upstream, fresh_trust):
    up, _ = https_upstream  # the test CA is not in the trust store this time
    up.routes["/chat/completions"] = Reply.json(ANSWER)
    tt = make_tooltap(up.url)
    client = openai.OpenAI(base_url=tt.url, api_key="sk-test", max_retries=0)
    with pytest.raises(openai.APIStatusError) as failed:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert failed.value.status_code == 502
    assert "certificate verify failed" in failed.value.response.text
    assert up.received == []
    (turn,) = tt.api("/turns")["turns"]
    assert turn["status"] == "proxy_error" and "ConnectError" in turn["error"]
