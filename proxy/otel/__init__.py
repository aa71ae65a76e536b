"""OpenTelemetry export: stored turns as spans that follow the GenAI semantic conventions.

- `spans.py`: a stored turn as plain span records (no SDK needed): one `chat` span per
  turn, one `execute_tool` child per tool call, a trace per session.
- `messages.py`: the opt-in content (`--otlp-content`): messages in the conventions' form.
- `source.py`: reading stored turns for export.
- `sdk.py`: the official SDK's side: span records as SDK spans, the OTLP/HTTP exporter.
- `live.py`: `tooltap serve --otlp-endpoint`: exports from the writer process, after commit.
- `cli.py`: `tooltap otel export`: stored sessions after the fact.

The SDK is an optional extra (`pip install '.[otel]'` in tooltap's folder): only `sdk.py` imports it.
"""

from __future__ import annotations

from urllib.parse import urlsplit

INSTALL_HINT = ("OpenTelemetry export needs the SDK and its OTLP exporter: pip install opentelemetry-sdk "
                "opentelemetry-exporter-otlp-proto-http (or '.[otel]' in tooltap's folder)")


class OtelUnavailable(RuntimeError):
    """The SDK is not installed (the message says what to install)."""


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL for an endpoint given as OTEL_EXPORTER_OTLP_ENDPOINT is
    (a base URL, `/v1/traces` appended), or as the traces URL itself. ValueError: not
    an http(s) URL."""
    endpoint = endpoint.strip()
    parts = urlsplit(endpoint)
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"bad OTLP endpoint {endpoint!r}: expected http(s)://host[:port][/path]")
    if endpoint.rstrip("/").endswith("/v1/traces"):
        return endpoint
    return endpoint.rstrip("/") + "/v1/traces"
