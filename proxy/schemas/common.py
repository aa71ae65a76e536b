"""Helpers shared by the per-format converters."""

from __future__ import annotations

from .losses import Loss
from .spec import ToolSpec


def meta_losses(spec: ToolSpec, fmt: str, own: tuple[str, ...]) -> list[Loss]:
    """Loss for each format-specific field of `spec` that `fmt` has no place for."""
    return [
        Loss(f"$.{key}", f"{fmt} tools have no `{key}` field (from the source format)", "dropped")
        for key, value in spec.meta.items()
        # `strict: false` is every provider's default, so dropping it changes nothing
        if key not in own and not (key == "strict" and value is False)
    ]


def description_of(obj: dict) -> str | None:
    d = obj.get("description")
    return d if isinstance(d, str) else None


def top_level_composition_losses(params: dict, path: str, fmt: str) -> list[Loss]:
    # Anthropic (and OpenAI for function parameters) refuse a schema whose root is a
    # composition instead of a plain object; we keep it, but say so.
    return [
        Loss(f"{path}.{key}", f"{fmt} rejects `{key}` at the top level of a tool's schema", "rejected")
        for key in ("anyOf", "oneOf", "allOf")
        if key in params
    ]


def count(n: int, what: str, plural: str | None = None) -> str:
    """`1 tool`, `2 tools`, `1 loss`, `3 losses`."""
    return f"{n} {what if n == 1 else plural or what + 's'}"
