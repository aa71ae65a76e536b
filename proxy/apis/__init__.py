"""Wire APIs: one module per provider API, each satisfying `base.WireAPI`."""

from __future__ import annotations

from .base import Assembler, RequestKeys, ToolCall, WireAPI

REGISTRY: list[WireAPI] = []


def register(api: WireAPI) -> WireAPI:
    REGISTRY.append(api)
    return api


def detect(method: str, path: str) -> WireAPI | None:
    """The wire API a request speaks, or None for anything else ("other")."""
    for api in REGISTRY:
        if api.matches(method, path):
            return api
    return None


def by_name(name: str) -> WireAPI | None:
    return next((api for api in REGISTRY if api.name == name), None)


# Importing a module registers it.
from . import openai_chat  # noqa: E402,F401
from . import anthropic_messages  # noqa: E402,F401
from . import openai_responses  # noqa: E402,F401
from . import gemini  # noqa: E402,F401

__all__ = ["Assembler", "RequestKeys", "ToolCall", "WireAPI", "REGISTRY", "detect", "by_name"]
