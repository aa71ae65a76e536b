"""A Loss: one thing a conversion could not carry over, located by a JSON path."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass

# kinds, so a UI can group them: a keyword or value gone, a value rewritten into a
# weaker or different form, a tool renamed to satisfy a provider, a whole tool left out,
# or something kept that the provider is known to reject.
# keys written as `.key` in a path ($ is allowed so `$ref`, `$defs` read naturally)
PLAIN_KEY = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$]*$")

KINDS = ("dropped", "changed", "renamed", "omitted", "rejected")


@dataclass(frozen=True)
class Loss:
    path: str  # JSON path inside the emitted tool, e.g. "$.parameters.properties.x.format"
    reason: str
    kind: str = "dropped"
    tool: str | None = None  # the tool's name in the source set

    def to_dict(self) -> dict:
        return asdict(self)

    def with_tool(self, tool: str) -> "Loss":
        return Loss(self.path, self.reason, self.kind, tool)


def join(path: str, *keys: str | int) -> str:
    """Extend a JSON path; keys that are not plain identifiers are bracket-quoted."""
    for key in keys:
        if isinstance(key, int):
            path += f"[{key}]"
        elif PLAIN_KEY.match(key):
            path += f".{key}"
        else:
            path += f"[{json.dumps(key)}]"
    return path
