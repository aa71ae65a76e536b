"""Replay: stored sessions turned back into checks.

- `recording`: a stored session as plain data (requests, exact response bytes, timing,
  the tool calls as decoded), read once from the store by the caller's choice of database.
- `compare`: recorded tool calls against replayed ones, with order and argument modes.
- `tools`: converter replay (each turn's tools and calls through every provider format).
- `recorded`: the stored bytes served as an upstream, sent through a fresh tooltap.
- `live`: the stored requests sent to another endpoint, translated when needed.
- `cassette` / `export`: a session written out as a cassette and a pytest module that
  `proxy.testing` serves.
- `runs`: replay runs kept in the store for the inspector.
"""
