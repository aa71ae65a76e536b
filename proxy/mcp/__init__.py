"""The MCP tap: the agent <-> MCP server traffic, recorded and tied to the LLM turns.

relay.py (the stdio wrapper), http.py (the streamable-HTTP reverse proxy), messages.py
(lines and their kinds), store.py (the recorder) and spool.py, read.py (reading it back),
correlate.py (each tools/call tied to the model's tool call), cli.py (`tooltap mcp`).
"""
