"""Semantic diff of two tool sets, with a verdict per change: breaking for a caller
(a call that was valid before can now fail or mean something else) or not.

Returns plain JSON-able data so the CLI, a web page or a test can render it.
"""

from __future__ import annotations

import json
from typing import Any

from .losses import join
from .names import mcp_identity
from .spec import ToolSpec, canonical, normalize

LOWER_BOUNDS = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties", "minContains")
UPPER_BOUNDS = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties", "maxContains")
# constraints that restrict values when added or changed, and free them when removed
RESTRICTIONS = ("pattern", "format", "multipleOf", "contentEncoding", "contentMediaType")
# structure we cannot judge key by key: any change is assumed breaking
OPAQUE = ("anyOf", "oneOf", "allOf", "not", "$ref", "$defs", "definitions", "if", "then", "else",
          "patternProperties", "prefixItems", "dependentRequired", "dependentSchemas", "propertyNames",
          "contains", "unevaluatedProperties", "unevaluatedItems")
# annotations: a change informs, never breaks
ANNOTATIONS = ("title", "default", "examples", "example", "deprecated", "readOnly", "writeOnly", "$comment")
HANDLED = {"type", "enum", "const", "description", "properties", "required", "additionalProperties",
           "items", "nullable", "uniqueItems", *LOWER_BOUNDS, *UPPER_BOUNDS, *RESTRICTIONS, *OPAQUE, *ANNOTATIONS}


def _change(path: str, kind: str, message: str, breaking: bool, before: Any = None, after: Any = None) -> dict:
    return {"path": path, "kind": kind, "message": message, "breaking": breaking, "before": before, "after": after}


def _types(schema: dict) -> set[str] | None:
    t = schema.get("type")
    if t is None:
        return None  # any type
    types = set(t) if isinstance(t, list) else {t}
    if schema.get("nullable") is True:
        types.add("null")
    return types


def _enum(schema: dict) -> list | None:
    if "const" in schema:
        return [schema["const"]]
    return schema["enum"] if isinstance(schema.get("enum"), list) else None


def _fmt(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _keyword_change(key: str, old: dict, new: dict) -> str:
    """`maximum 10 -> 5`, or `maximum 10 removed` / `maximum 5 added` when one side has no
    such key (a key that is there with null says `null`)."""
    if key not in new:
        return f"{key} {_fmt(old.get(key))} removed"
    if key not in old:
        return f"{key} {_fmt(new.get(key))} added"
    return f"{key} {_fmt(old[key])} -> {_fmt(new[key])}"


def compare_schemas(old: Any, new: Any, path: str = "$") -> list[dict]:
    """Changes from `old` to `new` (JSON Schemas), each with a breaking verdict."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        if canonical(old) != canonical(new):
            return [_change(path, "schema_changed", "schema replaced", True, old, new)]
        return []
    out: list[dict] = []

    if old.get("description") != new.get("description"):
        out.append(_change(join(path, "description"), "description_changed", "description changed", False,
                           old.get("description"), new.get("description")))

    ot, nt = _types(old), _types(new)
    if ot != nt:
        widened = nt is None or (ot is not None and all(t in nt or (t == "integer" and "number" in nt) for t in ot))
        out.append(_change(join(path, "type"), "type_changed",
                           f"type {_fmt(sorted(ot) if ot else 'any')} -> {_fmt(sorted(nt) if nt else 'any')}"
                           + (" (widened)" if widened else ""), not widened,
                           old.get("type"), new.get("type")))

    oe, ne = _enum(old), _enum(new)
    if oe is not None or ne is not None:
        if oe is None:
            out.append(_change(join(path, "enum"), "enum_added", f"now limited to {_fmt(ne)}", True, None, ne))
        elif ne is None:
            out.append(_change(join(path, "enum"), "enum_removed", "no longer limited to a set of values", False, oe, None))
        else:
            okeys, nkeys = {canonical(v) for v in oe}, {canonical(v) for v in ne}
            removed = [v for v in oe if canonical(v) not in nkeys]
            added = [v for v in ne if canonical(v) not in okeys]
            if removed:
                out.append(_change(join(path, "enum"), "enum_values_removed", f"values removed: {_fmt(removed)}", True, oe, ne))
            if added:
                out.append(_change(join(path, "enum"), "enum_values_added", f"values added: {_fmt(added)}", False, oe, ne))

    out += _compare_object(old, new, path)

    if "items" in old or "items" in new:
        oi, ni = old.get("items", {}), new.get("items", {})
        if isinstance(oi, dict) and isinstance(ni, dict):
            out += compare_schemas(oi, ni, join(path, "items"))
        elif canonical(oi) != canonical(ni):
            out.append(_change(join(path, "items"), "schema_changed", "items changed", True, oi, ni))

    out += _compare_constraints(old, new, path)
    return out


def _compare_object(old: dict, new: dict, path: str) -> list[dict]:
    out: list[dict] = []
    oprops, nprops = old.get("properties") or {}, new.get("properties") or {}
    oreq, nreq = set(old.get("required") or []), set(new.get("required") or [])
    for name in nprops:
        if name not in oprops:
            req = name in nreq
            out.append(_change(join(path, "properties", name), "param_added",
                               f"{'required' if req else 'optional'} parameter {name!r} added", req, None, nprops[name]))
    for name in oprops:
        if name not in nprops:
            out.append(_change(join(path, "properties", name), "param_removed",
                               f"parameter {name!r} removed", True, oprops[name], None))
    for name in oprops:
        if name in nprops:
            out += compare_schemas(oprops[name], nprops[name], join(path, "properties", name))
    for name in sorted(nreq - oreq):
        if name in oprops or name not in nprops:  # a new required param is reported as param_added
            out.append(_change(join(path, "required"), "required_added", f"{name!r} is now required", True, None, name))
    for name in sorted(oreq - nreq):
        if name in nprops or name not in oprops:
            out.append(_change(join(path, "required"), "required_removed", f"{name!r} is now optional", False, name, None))

    oa, na = old.get("additionalProperties"), new.get("additionalProperties")
    if isinstance(oa, dict) and isinstance(na, dict):
        out += compare_schemas(oa, na, join(path, "additionalProperties"))
    elif canonical(oa) != canonical(na):
        closed = na is False or (isinstance(na, dict) and oa in (None, True))
        out.append(_change(join(path, "additionalProperties"), "additional_properties_changed",
                           _keyword_change("additionalProperties", old, new), closed, oa, na))
    return out


def _compare_constraints(old: dict, new: dict, path: str) -> list[dict]:
    out: list[dict] = []

    def bound(key: str, tighter) -> None:
        o, n = old.get(key), new.get(key)
        if o == n:
            return
        # a bool here is the draft-4 exclusive flag: treat setting it as tightening
        if n is None:
            breaking = False
        elif o is None:
            breaking = True
        elif isinstance(o, bool) or isinstance(n, bool):
            breaking = bool(n)
        else:
            breaking = tighter(n, o)
        out.append(_change(join(path, key), "constraint_changed", _keyword_change(key, old, new), breaking, o, n))

    for key in LOWER_BOUNDS:
        bound(key, lambda n, o: n > o)
    for key in UPPER_BOUNDS:
        bound(key, lambda n, o: n < o)
    for key in RESTRICTIONS:
        o, n = old.get(key), new.get(key)
        if o != n:
            out.append(_change(join(path, key), "constraint_changed", _keyword_change(key, old, new), n is not None,
                               o, n))
    if bool(old.get("uniqueItems")) != bool(new.get("uniqueItems")):
        n = bool(new.get("uniqueItems"))
        out.append(_change(join(path, "uniqueItems"), "constraint_changed", f"uniqueItems -> {_fmt(n)}", n, old.get("uniqueItems"), new.get("uniqueItems")))
    for key in OPAQUE:
        if canonical(old.get(key)) != canonical(new.get(key)):
            out.append(_change(join(path, key), "schema_changed",
                               f"{key} changed (cannot prove it still accepts the same values)", True, old.get(key), new.get(key)))
    for key in ANNOTATIONS:
        if canonical(old.get(key)) != canonical(new.get(key)):
            out.append(_change(join(path, key), "annotation_changed", f"{key} changed", False, old.get(key), new.get(key)))
    for key in sorted((set(old) | set(new)) - HANDLED):
        if canonical(old.get(key)) != canonical(new.get(key)):
            # unknown keyword: a tool caller's validator ignores it, so it cannot break a call
            out.append(_change(join(path, key), "keyword_changed", f"{key} changed", False, old.get(key), new.get(key)))
    return out


def compare_tools(old: ToolSpec, new: ToolSpec) -> list[dict]:
    out: list[dict] = []
    if old.description != new.description:
        out.append(_change("$.description", "description_changed", "tool description changed", False, old.description, new.description))
    # absent and false mean the same (non-strict is every provider's default)
    if bool(old.meta.get("strict")) != bool(new.meta.get("strict")):
        out.append(_change("$.strict", "strict_changed", f"strict {_fmt(old.meta.get('strict'))} -> {_fmt(new.meta.get('strict'))}",
                           False, old.meta.get("strict"), new.meta.get("strict")))
    out += compare_schemas(old.parameters, new.parameters, "$.parameters")
    return out


def _match_renames(removed: dict[str, ToolSpec], added: dict[str, ToolSpec]) -> list[tuple[str, str, str]]:
    """Pair removed and added tools that are the same tool under a new name."""
    pairs: list[tuple[str, str, str]] = []

    def take(old: str, new: str, why: str) -> None:
        pairs.append((old, new, why))
        del removed[old], added[new]

    # 1. same MCP (server, tool) behind a different per-run uid
    by_identity: dict = {}
    for name, spec in added.items():
        ident = mcp_identity(name, spec.description)
        if ident:
            by_identity.setdefault(ident, []).append(name)
    for name, spec in list(removed.items()):
        ident = mcp_identity(name, spec.description)
        if ident and len(by_identity.get(ident, [])) == 1 and by_identity[ident][0] in added:
            take(name, by_identity[ident][0], f"same MCP tool {ident[1]!r} of server {ident[0] or '?'!r} under a new uid")
    # 2. same schema and description; 3. same schema alone, when the match is unique
    for with_description in (True, False):
        def key(spec: ToolSpec) -> str:
            return canonical([spec.parameters, spec.description if with_description else None])

        new_keys: dict[str, list[str]] = {}
        for name, spec in added.items():
            new_keys.setdefault(key(spec), []).append(name)
        old_keys: dict[str, list[str]] = {}
        for name, spec in removed.items():
            old_keys.setdefault(key(spec), []).append(name)
        for k, olds in old_keys.items():
            if len(olds) == 1 and len(new_keys.get(k, [])) == 1:
                take(olds[0], new_keys[k][0], "same schema and description" if with_description else "same schema")
    return pairs


def diff_toolsets(a: list[ToolSpec], b: list[ToolSpec]) -> dict:
    """Diff tool set `a` (before) against `b` (after), both normalized first."""
    old = {s.name: normalize(s) for s in a}
    new = {s.name: normalize(s) for s in b}
    removed = {n: s for n, s in old.items() if n not in new}
    added = {n: s for n, s in new.items() if n not in old}
    renames = _match_renames(removed, added)

    tools: list[dict] = []
    for name, spec in old.items():
        if name in new:
            changes = compare_tools(spec, new[name])
            tools.append({"name": name, "status": "changed" if changes else "unchanged", "changes": changes})
    for old_name, new_name, why in renames:
        # An MCP uid changes whenever Cline restarts, and the agent sends the new name with
        # the tools it offers: no caller holds the old one. Any other rename breaks callers.
        uid_only = why.startswith("same MCP tool")
        consequence = "the agent offers the new name itself" if uid_only else "calls using the old name fail"
        changes = [_change("$.name", "tool_renamed", f"renamed from {old_name!r} ({why}); {consequence}",
                           not uid_only, old_name, new_name)]
        changes += compare_tools(old[old_name], new[new_name])
        tools.append({"name": new_name, "from": old_name, "status": "renamed", "changes": changes})
    for name in removed:
        tools.append({"name": name, "status": "removed",
                      "changes": [_change("$", "tool_removed", f"tool {name!r} removed", True, name, None)]})
    for name in added:
        tools.append({"name": name, "status": "added",
                      "changes": [_change("$", "tool_added", f"tool {name!r} added", False, None, name)]})
    for tool in tools:
        tool["breaking"] = any(c["breaking"] for c in tool["changes"])

    flat = [{"tool": t["name"], **c} for t in tools for c in t["changes"]]
    count = lambda status: sum(1 for t in tools if t["status"] == status)  # noqa: E731
    summary = {s: count(s) for s in ("added", "removed", "renamed", "changed", "unchanged")}
    summary["changes"] = len(flat)
    summary["breaking_changes"] = sum(1 for c in flat if c["breaking"])
    return {"summary": summary, "breaking": summary["breaking_changes"] > 0, "tools": tools, "changes": flat}
