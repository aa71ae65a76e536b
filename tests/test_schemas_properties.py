"""Property-based: portable schemas round-trip OpenAI -> Anthropic -> OpenAI unchanged,
and every Gemini conversion keeps each feature or reports its loss."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.schemas.anthropic_tools import from_anthropic, to_anthropic
from proxy.schemas.gemini_tools import FORMATS, TYPES, to_gemini
from proxy.schemas.losses import join
from proxy.schemas.openai_tools import from_openai, to_openai_chat
from proxy.schemas.spec import ToolSpec, normalize

KEY = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True)
TEXT = st.text(max_size=20)
NAME = st.from_regex(r"[a-zA-Z0-9_-]{1,64}", fullmatch=True)


def _with(base: dict, extras: dict) -> dict:
    return {**base, **extras}


# --- the portable subset: what every provider takes as is -----------------------

def portable_leaf():
    string = st.fixed_dictionaries({"type": st.just("string")}, optional={
        "description": TEXT, "enum": st.lists(TEXT, min_size=1, max_size=4, unique=True),
        "minLength": st.integers(0, 5), "maxLength": st.integers(5, 50)})
    number = st.fixed_dictionaries({"type": st.sampled_from(["number", "integer"])}, optional={
        "description": TEXT, "minimum": st.integers(-10, 0), "maximum": st.integers(1, 10)})
    boolean = st.fixed_dictionaries({"type": st.just("boolean")}, optional={"description": TEXT})
    return st.one_of(string, number, boolean)


def portable_object(children):
    return st.dictionaries(KEY, children, max_size=4).flatmap(lambda props: st.fixed_dictionaries(
        {"type": st.just("object"), "properties": st.just(props)},
        optional={"required": st.lists(st.sampled_from(sorted(props)), unique=True) if props else st.just([]),
                  "description": TEXT}))


portable_schema = st.recursive(
    portable_leaf(),
    lambda children: st.one_of(
        portable_object(children),
        st.fixed_dictionaries({"type": st.just("array"), "items": children}, optional={"minItems": st.integers(0, 3)}),
    ),
    max_leaves=12,
)

openai_tool = st.builds(
    lambda name, desc, params: {"type": "function", "function": _with({"name": name}, desc) | {"parameters": params}},
    NAME,
    st.one_of(st.just({}), TEXT.map(lambda d: {"description": d})),
    portable_object(portable_schema),
)


@settings(max_examples=150, deadline=None)
@given(openai_tool)
def test_portable_round_trip_openai_anthropic_openai(tool):
    spec, _ = from_openai(tool)
    anthropic, losses1 = to_anthropic(normalize(spec))
    back, _ = from_anthropic(anthropic)
    again, losses2 = to_openai_chat(normalize(back))
    assert again == tool
    assert losses1 == [] and losses2 == []


# --- Gemini: keep or report ------------------------------------------------------

GEMINI_FIELDS = {"type", "format", "title", "description", "nullable", "enum", "items", "minItems", "maxItems",
                 "properties", "required", "minProperties", "maxProperties", "minLength", "maxLength", "pattern",
                 "minimum", "maximum", "example", "default", "anyOf", "propertyOrdering"}
JSON_TYPES = ["string", "number", "integer", "boolean", "array", "object"]


def rich_leaf():
    return st.fixed_dictionaries({}, optional={
        "type": st.one_of(st.sampled_from(JSON_TYPES), st.lists(st.sampled_from(JSON_TYPES + ["null"]), min_size=1, max_size=3, unique=True)),
        "description": TEXT,
        "format": st.sampled_from(["date-time", "email", "uri", "int32", "float", "enum", "uuid"]),
        "const": st.one_of(TEXT, st.integers()),
        "enum": st.lists(st.one_of(TEXT, st.integers(), st.none()), min_size=1, max_size=3),
        "minimum": st.integers(), "exclusiveMaximum": st.integers(), "multipleOf": st.integers(1, 5),
        "pattern": st.just("^a"), "examples": st.lists(TEXT, max_size=2), "deprecated": st.booleans(),
        "$ref": st.sampled_from(["#/$defs/A", "#/$defs/Loop", "#/$defs/Missing"]),
    })


def rich_schema():
    return st.recursive(rich_leaf(), lambda children: st.one_of(
        st.builds(lambda base, props, extra: {**base, "properties": props, **extra},
                  rich_leaf(), st.dictionaries(KEY, children, max_size=3),
                  st.fixed_dictionaries({}, optional={"additionalProperties": st.one_of(st.booleans(), children),
                                                      "required": st.lists(KEY, max_size=2)})),
        st.builds(lambda base, items: {**base, "items": items}, rich_leaf(), st.one_of(children, st.lists(children, max_size=2))),
        st.builds(lambda key, branches: {key: branches}, st.sampled_from(["anyOf", "oneOf", "allOf"]),
                  st.lists(children, min_size=1, max_size=3)),
    ), max_leaves=10)


DEFS = {"A": {"type": "string", "maxLength": 3}, "Loop": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Loop"}}}}

# where the converter keeps a sub-schema at the same relative place
STRUCTURAL = ("properties", "items", "anyOf")
# replaced wholesale (the loss at that keyword covers everything beneath it)
REWRITTEN = ("$ref", "allOf", "oneOf")


def kept(key, value, out):
    """Did the Gemini node `out` keep keyword `key` with this value?"""
    if key == "type":
        if isinstance(value, list):  # a one-type list is that type
            return len(value) == 1 and value[0] != "null" and out.get("type") == TYPES.get(value[0])
        return out.get("type") == TYPES.get(value)
    if key == "enum":
        return out.get("enum") == value and all(isinstance(v, str) for v in value)
    if key == "format":
        return out.get("format") == value
    return key in out and (key in STRUCTURAL or out[key] == value)


def check_node(node, out, path, loss_paths, problems):
    if not isinstance(node, dict):
        return
    if any(k in node for k in REWRITTEN):
        key = next(k for k in REWRITTEN if k in node)
        if not any(p.startswith(join(path, key)) for p in loss_paths):
            problems.append(f"{join(path, key)}: rewritten without a loss")
        return
    for key, value in node.items():
        reported = any(p == join(path, key) or p.startswith(join(path, key) + ".") or p.startswith(join(path, key) + "[")
                       for p in loss_paths)
        if not reported and not kept(key, value, out):
            problems.append(f"{join(path, key)}: lost without a report")
    for key in STRUCTURAL:
        sub, sub_out = node.get(key), out.get(key)
        if key == "properties" and isinstance(sub, dict) and isinstance(sub_out, dict):
            for name, child in sub.items():
                check_node(child, sub_out.get(name, {}), join(path, key, name), loss_paths, problems)
        elif key == "items" and isinstance(sub, dict) and isinstance(sub_out, dict):
            check_node(sub, sub_out, join(path, key), loss_paths, problems)
        elif key == "anyOf" and isinstance(sub, list) and isinstance(sub_out, list) and len(sub) == len(sub_out):
            for i, (child, child_out) in enumerate(zip(sub, sub_out)):
                check_node(child, child_out, join(path, key, i), loss_paths, problems)


def check_gemini_valid(node, path="$"):
    """The output uses only Gemini Schema fields, upper-case types, string enums."""
    assert isinstance(node, dict), path
    assert set(node) <= GEMINI_FIELDS, (path, set(node) - GEMINI_FIELDS)
    if "type" in node:
        assert node["type"] in TYPES.values(), (path, node["type"])
    if "format" in node:
        assert node["format"] in FORMATS.get(node.get("type"), ()), (path, node)
    if "enum" in node:
        assert all(isinstance(v, str) for v in node["enum"]), path
    for name, sub in (node.get("properties") or {}).items():
        check_gemini_valid(sub, join(path, "properties", name))
    if "items" in node:
        check_gemini_valid(node["items"], join(path, "items"))
    for i, sub in enumerate(node.get("anyOf") or []):
        check_gemini_valid(sub, join(path, "anyOf", i))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(KEY, rich_schema(), min_size=1, max_size=4), st.booleans())
def test_gemini_keeps_each_feature_or_reports_its_loss(props, closed):
    params = {"type": "object", "properties": props, "$defs": DEFS}
    if closed:
        params["additionalProperties"] = False
    tool, losses = to_gemini(normalize(ToolSpec("t", "d", params)))
    out = tool["parameters"]
    check_gemini_valid(out)
    loss_paths = [l.path for l in losses]
    problems: list[str] = []
    check_node(normalize(ToolSpec("t", "d", params)).parameters, out, "$.parameters", loss_paths, problems)
    assert problems == [], json.dumps({"problems": problems, "losses": loss_paths, "out": out})[:3000]
