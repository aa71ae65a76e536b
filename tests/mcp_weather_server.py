"""A real MCP server for the tests, built with the official SDK (mcp 2.x: MCPServer, the
FastMCP of mcp 1.x): the seed's weather server, answering from local data.

`get_forecast` returns the forecast the cline-weather capture recorded for Washington
(read from tests/fixtures/cline-weather/mcp_stdio.jsonl) and declares
`additionalProperties: false`, as Cline's copy of the schema does. `get_radar` answers
with `megabytes` of text; `crash` ends the process with exit code 3.

    python tests/mcp_weather_server.py            # stdio
    python tests/mcp_weather_server.py --http PORT  # streamable HTTP at /mcp
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools.base import Tool

CAPTURE = Path(__file__).parent / "fixtures" / "cline-weather" / "mcp_stdio.jsonl"


def recorded_forecast() -> str:
    for line in CAPTURE.read_text(encoding="utf-8").splitlines():
        msg = json.loads(line)["message"]
        if "result" in msg:
            return msg["result"]["content"][0]["text"]
    raise RuntimeError("no forecast in the capture")


FORECASTS = {(38.9072, -77.0369): recorded_forecast()}


def get_alerts(state: str) -> str:
    """Get weather alerts for a US state.

    Args:
        state: Two-letter US state code (e.g. CA, NY)
    """
    return "No active alerts for this state."


def get_forecast(latitude: float, longitude: float) -> str:
    """Get weather forecast for a location.

    Args:
        latitude: Latitude of the location
        longitude: Longitude of the location
    """
    found = FORECASTS.get((round(latitude, 4), round(longitude, 4)))
    if found is None:
        raise ToolError(f"no forecast for {latitude},{longitude}")
    return found


def get_radar(megabytes: float) -> str:
    """A radar image as text: `megabytes` of it."""
    line = "0123456789abcdef" * 4 + "\n"
    return line * int(megabytes * (1 << 20) // len(line))


def crash() -> str:
    """End the server abruptly."""
    sys.stderr.write("weather: crashing on purpose\n")
    sys.stderr.flush()
    os._exit(3)


def build() -> MCPServer:
    tools = []
    for fn in (get_alerts, get_forecast, get_radar, crash):
        tool = Tool.from_function(fn)
        tool.parameters["additionalProperties"] = False  # as Cline's copy of the schema says
        tools.append(tool)
    return MCPServer("weather", log_level="ERROR", tools=tools)


if __name__ == "__main__":
    server = build()
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        import uvicorn

        uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=int(sys.argv[2]), log_level="error")
    else:
        server.run("stdio")
