"""Gemini FunctionDeclaration: `parameters` in Gemini's OpenAPI-3.0 subset, or
`parametersJsonSchema` (plain JSON Schema), both directions.

Facts used (Gemini `Schema` reference): types are upper-case STRING NUMBER INTEGER
BOOLEAN ARRAY OBJECT; fields are type, format, title, description, nullable, enum (strings
only), items, min/maxItems, properties, required, min/maxProperties, min/maxLength,
pattern, minimum, maximum, example, default, anyOf, propertyOrdering. Formats the
Developer API accepts: NUMBER float/double, INTEGER int32/int64, STRING enum/date-time.
There is no $ref, const, type list, oneOf, allOf or additionalProperties.
"""

from __future__ import annotations

import json
from typing import Any

from .common import description_of, meta_losses
from .losses import Loss, join
from .names import fix_name
from .spec import ToolSpec

OWN_META = ("behavior", "response", "responseJsonSchema")
TYPES = {"string": "STRING", "number": "NUMBER", "integer": "INTEGER", "boolean": "BOOLEAN", "array": "ARRAY", "object": "OBJECT"}
FORMATS = {"STRING": {"enum", "date-time"}, "NUMBER": {"float", "double"}, "INTEGER": {"int32", "int64"}}
# copied as they are (values need no translation)
PLAIN = (
    "title", "description", "nullable", "minItems", "maxItems", "minLength", "maxLength", "pattern",
    "minimum", "maximum", "minProperties", "maxProperties", "example", "default", "required", "propertyOrdering",
)
# handled explicitly below
HANDLED = {"type", "format", "enum", "const", "properties", "items", "anyOf", "oneOf", "allOf", "$ref",
           "$defs", "definitions", "exclusiveMinimum", "exclusiveMaximum", "examples", "additionalProperties"}


class _Converter:
    def __init__(self, root: dict, base: str):
        self.defs = {}
        for key in ("$defs", "definitions"):
            for name, sub in (root.get(key) or {}).items():
                self.defs[f"#/{key}/{name}"] = sub
        self.base = base
        self.losses: list[Loss] = []

    def loss(self, path: str, reason: str, kind: str = "dropped") -> None:
        self.losses.append(Loss(path, reason, kind))

    def convert(self, node: Any, path: str, stack: tuple[str, ...] = ()) -> dict:
        if not isinstance(node, dict):
            self.loss(path, f"not a schema object ({json.dumps(node)}); replaced by an empty schema")
            return {}
        if "$ref" in node:
            return self._ref(node, path, stack)
        if "allOf" in node:
            return self._all_of(node, path, stack)
        out: dict = {}
        self._type(node, out, path)
        for key in PLAIN:
            if key in node:
                out[key] = node[key]
        self._enum(node, out, path)
        self._format(node, out, path)
        self._bounds(node, out, path)
        if "examples" in node:
            if isinstance(node["examples"], list) and node["examples"] and "example" not in out:
                out["example"] = node["examples"][0]
            self.loss(join(path, "examples"), "Gemini has only `example`: kept the first of `examples`", "changed")
        if "additionalProperties" in node:
            self.loss(join(path, "additionalProperties"),
                      f"Gemini has no additionalProperties; dropped (was {json.dumps(node['additionalProperties'])})")
        if isinstance(node.get("properties"), dict):
            out["properties"] = {k: self.convert(v, join(path, "properties", k), stack) for k, v in node["properties"].items()}
        if "items" in node:
            if isinstance(node["items"], dict):
                out["items"] = self.convert(node["items"], join(path, "items"), stack)
            else:
                self.loss(join(path, "items"), "tuple-form items (a list of schemas) has no Gemini equivalent; dropped")
        branches = []
        for key in ("anyOf", "oneOf"):
            if isinstance(node.get(key), list):
                branches += [self.convert(b, join(path, key, i), stack) for i, b in enumerate(node[key])]
                if key == "oneOf":
                    self.loss(join(path, "oneOf"), "Gemini has no oneOf: became anyOf (exactly-one became at-least-one)", "changed")
        if branches:
            out["anyOf"] = branches
        for key in ("$defs", "definitions"):
            if key in node:
                self.loss(join(path, key), f"Gemini has no {key}: each $ref to it was inlined")
        for key in node:
            if key not in HANDLED and key not in PLAIN:
                self.loss(join(path, key), f"Gemini Schema has no `{key}`; dropped")
        return out

    def _ref(self, node: dict, path: str, stack: tuple[str, ...]) -> dict:
        ref = node["$ref"]
        rest = {k: v for k, v in node.items() if k != "$ref"}
        where = join(path, "$ref")
        if ref in stack:
            self.loss(where, f"$ref {ref} is recursive (cycle {' -> '.join(stack + (ref,))}); "
                             "the cycle was cut: replaced by an OBJECT with no properties")
            out = self.convert(rest, path, stack) if rest else {}
            out.setdefault("type", "OBJECT")
            return out
        target = self.defs.get(ref)
        if target is None:
            self.loss(where, f"$ref {ref} cannot be resolved inside the tool's schema; dropped")
            return self.convert(rest, path, stack)
        self.loss(where, f"Gemini has no $ref: inlined {ref}", "changed")
        return self.convert({**target, **rest}, path, stack + (ref,))

    def _all_of(self, node: dict, path: str, stack: tuple[str, ...]) -> dict:
        merged = {k: v for k, v in node.items() if k != "allOf"}
        for branch in node["allOf"] or []:
            if isinstance(branch, dict) and "$ref" in branch and branch["$ref"] in self.defs and branch["$ref"] not in stack:
                branch = {**self.defs[branch["$ref"]], **{k: v for k, v in branch.items() if k != "$ref"}}
            for key, value in (branch or {}).items():
                if key == "properties":
                    merged["properties"] = {**merged.get("properties", {}), **value}
                elif key == "required":
                    merged["required"] = list(dict.fromkeys(merged.get("required", []) + list(value)))
                else:
                    merged.setdefault(key, value)
        self.loss(join(path, "allOf"), "Gemini has no allOf: branches merged into one schema (conflicts: first wins)", "changed")
        return self.convert(merged, path, stack)

    def _type(self, node: dict, out: dict, path: str) -> None:
        t = node.get("type")
        if t is None:
            return
        types = t if isinstance(t, list) else [t]
        non_null = [x for x in types if x != "null"]
        if "null" in types:
            out["nullable"] = True
            self.loss(join(path, "type"), f"type {json.dumps(t)}: null became nullable: true", "changed")
        known = [TYPES[x] for x in non_null if x in TYPES]
        for x in non_null:
            if x not in TYPES:
                self.loss(join(path, "type"), f"unknown type {x!r}; dropped")
        if len(known) == 1:
            out["type"] = known[0]
        elif len(known) > 1:
            out["anyOf"] = [{"type": k} for k in known]
            self.loss(join(path, "type"), f"Gemini has no type list: {json.dumps(t)} became anyOf", "changed")

    def _enum(self, node: dict, out: dict, path: str) -> None:
        if "const" in node:
            values, key = [node["const"]], "const"
            self.loss(join(path, "const"), "Gemini has no const: became a one-value enum", "changed")
            if "enum" in node:  # one enum field, and const is the narrower of the two
                self.loss(join(path, "enum"), "dropped in favour of const (Gemini has a single enum)")
        elif isinstance(node.get("enum"), list):
            values, key = node["enum"], "enum"
        else:
            return
        if None in values:
            out["nullable"] = True
            self.loss(join(path, key), "null in the enum became nullable: true", "changed")
        strings = [v if isinstance(v, str) else json.dumps(v) for v in values if v is not None]
        if any(not isinstance(v, str) for v in values if v is not None):
            self.loss(join(path, key), "Gemini enums hold strings only: non-string values were turned into text", "changed")
        if not strings:  # only null was allowed: nullable says it, an empty enum would be refused
            return
        out["enum"] = strings
        if "type" not in out and "anyOf" not in out:
            out["type"] = "STRING"

    def _format(self, node: dict, out: dict, path: str) -> None:
        fmt = node.get("format")
        if fmt is None:
            return
        if fmt in FORMATS.get(out.get("type", ""), ()):
            out["format"] = fmt
        else:
            self.loss(join(path, "format"), f"format {fmt!r} is not one Gemini accepts for {out.get('type', 'an untyped value')}; dropped")

    def _bounds(self, node: dict, out: dict, path: str) -> None:
        for key, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
            if key not in node:
                continue
            value = node[key]
            if isinstance(value, bool):  # draft-4 form: a flag on minimum/maximum
                self.loss(join(path, key), f"Gemini has no {key}: the {plain} became inclusive")
            elif plain not in out:
                out[plain] = value
                self.loss(join(path, key), f"Gemini has no {key}: became an inclusive {plain}", "changed")
            else:
                self.loss(join(path, key), f"Gemini has no {key}; dropped ({plain} kept)")


def schema_to_gemini(schema: dict, base: str = "$.parameters") -> tuple[dict, list[Loss]]:
    conv = _Converter(schema, base)
    out = conv.convert(schema, base)
    return out, conv.losses


def to_gemini(spec: ToolSpec, json_schema: bool = False) -> tuple[dict, list[Loss]]:
    """FunctionDeclaration; with json_schema=True use `parametersJsonSchema` (no subset)."""
    name, renamed = fix_name(spec.name, "gemini")
    losses = [renamed] if renamed else []
    out: dict = {"name": name}
    if spec.description is not None:
        out["description"] = spec.description
    params = spec.parameters
    # An OBJECT with no properties is refused by Gemini ("should be non-empty for
    # OBJECT type"); a tool without arguments simply has no parameters.
    no_args = set(params) <= {"type", "properties", "required", "additionalProperties"} and not params.get("properties")
    if json_schema:
        out["parametersJsonSchema"] = params
    elif not no_args:
        out["parameters"], schema_losses = schema_to_gemini(params)
        losses += schema_losses
    elif "additionalProperties" in params:
        losses.append(Loss("$.parameters.additionalProperties", "a tool without arguments gets no parameters; "
                           f"additionalProperties {json.dumps(params['additionalProperties'])} dropped"))
    for key in OWN_META:
        if key in spec.meta:
            out[key] = spec.meta[key]
    losses += meta_losses(spec, "Gemini", OWN_META)
    return out, losses


def is_gemini(obj: dict) -> bool:
    if "name" not in obj or "type" in obj:
        return False
    if "parametersJsonSchema" in obj:
        return True
    return _has_upper_type(obj.get("parameters"))


def _has_upper_type(node: Any) -> bool:
    if isinstance(node, dict):
        if isinstance(node.get("type"), str) and node["type"].isupper():
            return True
        return any(_has_upper_type(v) for v in node.values())
    if isinstance(node, list):
        return any(_has_upper_type(v) for v in node)
    return False


def schema_from_gemini(node: Any) -> Any:
    """Gemini subset -> JSON Schema: lower-case types, nullable -> type [t, "null"]."""
    if isinstance(node, list):
        return [schema_from_gemini(v) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict = {}
    for key, value in node.items():
        if key == "type" and isinstance(value, str):
            out["type"] = value.lower()
        elif key in ("properties",) and isinstance(value, dict):
            out[key] = {k: schema_from_gemini(v) for k, v in value.items()}
        elif key in ("items", "anyOf"):
            out[key] = schema_from_gemini(value)
        elif key == "nullable" or key == "propertyOrdering" or (key == "format" and value == "enum"):
            continue  # no constraint in JSON Schema terms (nullable handled below)
        else:
            out[key] = value
    if node.get("nullable") is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


def from_gemini(obj: dict) -> tuple[ToolSpec, list[Loss]]:
    if "parametersJsonSchema" in obj:
        params = obj["parametersJsonSchema"]
    elif obj.get("parameters") is not None:
        params = schema_from_gemini(obj["parameters"])
    else:
        params = {"type": "object", "properties": {}}
    meta = {k: obj[k] for k in OWN_META if k in obj}
    return ToolSpec(obj["name"], description_of(obj), params, meta), []
