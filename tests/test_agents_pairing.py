"""Result pairing across turns, for every case issue 3 names."""

from __future__ import annotations

import json

from proxy.agents import CallInput, TurnInput, decode_session

SYSTEM = {"role": "system", "content": "You are Cline, a highly skilled software engineer."}
TASK = {"role": "user", "content": [{"type": "text", "text": "<task>\ndo it\n</task>"}]}
ENV = {"type": "text", "text": "<environment_details>\n# Current Mode\nACT MODE\n</environment_details>"}
TOOLS = [{"type": "function", "function": {"name": n, "description": d, "parameters": {"type": "object", "properties": {}}}}
         for n, d in [("read_file", ""), ("execute_command", ""), ("search_files", ""), ("attempt_completion", ""),
                      ("write_to_file", ""), ("cUID010mcp0get", "weather: forecast")]]


def calls(*specs):
    return [CallInput(i, cid, name, json.dumps(args), args, None) for i, (cid, name, args) in enumerate(specs)]


def chat_session(specs, results, user_blocks, api_extra=None):
    """Turn 1 makes `specs` calls; turn 2's request carries `results` (tool messages) and
    a user message of `user_blocks`."""
    cs = calls(*specs)
    base = [SYSTEM, TASK]
    assistant = {"role": "assistant", "content": None, "tool_calls": [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments_raw}} for c in cs]}
    tool_msgs = [{"role": "tool", "tool_call_id": cid, "content": text} for cid, text in results]
    user = [{"role": "user", "content": [{"type": "text", "text": b} for b in user_blocks] + [ENV]}] if user_blocks is not None else []
    t1 = TurnInput(1, None, "openai.chat", {"messages": base, "tools": TOOLS}, {"choices": []}, cs)
    t2 = TurnInput(2, 1, "openai.chat", {"messages": base + [assistant] + tool_msgs + user, "tools": TOOLS}, None, [])
    return decode_session([t1, t2])


def test_denied():
    out = chat_session([("a", "execute_command", {"command": "rm -rf /"})], [("a", "result missing")],
                       ["[execute_command for 'rm -rf /'] Result:\nThe user denied this operation."])
    r = out.call(1, 0)["result"]
    assert r == {"text": "The user denied this operation.", "source": "user_text_block",
                 "placeholder": "result missing", "status": "denied"}


def test_tool_error():
    out = chat_session([("a", "read_file", {"path": "nope.txt"})], [("a", "result missing")],
                       ["[read_file for 'nope.txt'] Result:\nThe tool execution failed with the following error:\n<error>\nENOENT\n</error>"])
    r = out.call(1, 0)["result"]
    assert r["status"] == "error" and "ENOENT" in r["text"]


def test_empty_result_text_and_empty_header_block():
    out = chat_session([("a", "execute_command", {"command": "true"}), ("b", "execute_command", {"command": "false"})],
                       [("a", "result missing"), ("b", "")],
                       ["[execute_command for 'true'] Result:\n(tool did not return anything)",
                        "[execute_command for 'false'] Result:"])
    a, b = out.call(1, 0)["result"], out.call(1, 1)["result"]
    assert (a["status"], a["text"]) == ("empty", "(tool did not return anything)")
    assert (b["status"], b["text"], b["placeholder"]) == ("empty", "", "")


def test_header_and_result_in_separate_blocks():
    out = chat_session([("a", "read_file", {"path": "a.py"})], [("a", "result missing")],
                       ["[read_file for 'a.py'] Result:", "print('hi')"])
    assert out.call(1, 0)["result"]["text"] == "print('hi')"


def test_never_answered_with_a_child_and_without():
    out = chat_session([("a", "read_file", {"path": "a.py"}), ("b", "read_file", {"path": "b.py"})],
                       [("a", "result missing"), ("b", "result missing")],
                       ["[read_file for 'a.py'] Result:\nA"])
    assert out.call(1, 0)["result"]["text"] == "A"
    assert out.call(1, 1)["result"] == {"text": None, "source": None, "placeholder": "result missing", "status": "missing"}
    # The last turn of a session: nothing has answered it.
    cs = calls(("z", "read_file", {"path": "z"}))
    last = decode_session([TurnInput(7, None, "openai.chat", {"messages": [SYSTEM, TASK], "tools": TOOLS}, None, cs)])
    assert last.call(7, 0)["result"]["status"] == "missing"


def test_repeats_pair_by_order_and_arguments_pick_the_block():
    out = chat_session(
        [("a", "read_file", {"path": "x.py"}), ("b", "execute_command", {"command": "ls"}), ("c", "read_file", {"path": "x.py"})],
        [("a", "result missing"), ("b", "result missing"), ("c", "result missing")],
        ["[execute_command for 'ls'] Result:\nLS", "[read_file for 'x.py'] Result:\nfirst", "[read_file for 'x.py'] Result:\nsecond"])
    assert [out.call(1, i)["result"]["text"] for i in range(3)] == ["first", "LS", "second"]


def test_search_files_with_pattern_mcp_and_argumentless_headers():
    out = chat_session(
        [("a", "search_files", {"path": ".", "regex": "it's", "file_pattern": "*.py"}),
         ("b", "cUID010mcp0get", {"latitude": 1}), ("c", "attempt_completion", {"result": "done"})],
        [("a", "result missing"), ("b", "result missing"), ("c", "result missing")],
        ["[attempt_completion] Result:\nThe user is happy", "[use_mcp_tool for 'weather'] Result:\nRAIN",
         "[search_files for 'it's' in '*.py'] Result:\nFound 1 result."])
    assert [out.call(1, i)["result"]["text"] for i in range(3)] == ["Found 1 result.", "RAIN", "The user is happy"]


def test_tool_message_with_real_content_is_taken_as_is():
    out = chat_session([("a", "read_file", {"path": "a"})], [("a", "contents of a")], None)
    assert out.call(1, 0)["result"] == {"text": "contents of a", "source": "tool_message", "placeholder": None, "status": "ok"}


def test_branches_use_the_first_child():
    cs = calls(("a", "read_file", {"path": "a"}))
    base = [SYSTEM, TASK]
    asst = {"role": "assistant", "content": None, "tool_calls": [{"id": "a", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]}
    t1 = TurnInput(1, None, "openai.chat", {"messages": base, "tools": TOOLS}, None, cs)
    t2 = TurnInput(2, 1, "openai.chat", {"messages": base + [asst, {"role": "tool", "tool_call_id": "a", "content": "first branch"}], "tools": TOOLS}, None, [])
    t3 = TurnInput(3, 1, "openai.chat", {"messages": base + [asst, {"role": "tool", "tool_call_id": "a", "content": "retry"}], "tools": TOOLS}, None, [])
    assert decode_session([t1, t2, t3]).call(1, 0)["result"]["text"] == "first branch"


def test_anthropic_tool_result_blocks():
    tools = [{"name": "read_file", "description": "", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]
    cs = [CallInput(0, "toolu_1", "read_file", '{"path":"a"}', {"path": "a"}), CallInput(1, "toolu_2", "read_file", '{"path":"b"}', {"path": "b"})]
    msgs = [{"role": "user", "content": "read a and b"}]
    asst = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a"}},
                                             {"type": "tool_use", "id": "toolu_2", "name": "read_file", "input": {"path": "b"}}]}
    results = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "B!"}]},
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "no such file", "is_error": True}]}
    t1 = TurnInput(1, None, "anthropic.messages", {"messages": msgs, "tools": tools}, None, cs)
    t2 = TurnInput(2, 1, "anthropic.messages", {"messages": msgs + [asst, results], "tools": tools}, None, [])
    out = decode_session([t1, t2])
    assert out.call(1, 0)["result"] == {"text": "no such file", "source": "tool_result_block", "placeholder": None, "status": "error"}
    assert out.call(1, 1)["result"]["text"] == "B!"
    assert out.call(1, 0)["violations"] == []


def test_gemini_function_response_and_responses_output():
    g_tools = [{"functionDeclarations": [{"name": "lookup", "parameters": {"type": "OBJECT", "properties": {"q": {"type": "STRING"}}}}]}]
    contents = [{"role": "user", "parts": [{"text": "find"}]}]
    g1 = TurnInput(1, None, "gemini", {"contents": contents, "tools": g_tools}, None, [CallInput(0, None, "lookup", '{"q":"x"}', {"q": "x"})])
    g2 = TurnInput(2, 1, "gemini", {"contents": contents + [
        {"role": "model", "parts": [{"functionCall": {"name": "lookup", "args": {"q": "x"}}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "lookup", "response": {"output": "42"}}}]}], "tools": g_tools}, None, [])
    r = decode_session([g1, g2]).call(1, 0)["result"]
    assert (r["text"], r["source"], r["status"]) == ("42", "function_response", "ok")

    r_tools = [{"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}]
    r1 = TurnInput(1, None, "openai.responses", {"input": "find", "tools": r_tools}, None, [CallInput(0, "fc_1", "lookup", '{"q":"x"}', {"q": "x"})])
    # With previous_response_id the next request carries only the new items.
    r2 = TurnInput(2, 1, "openai.responses", {"previous_response_id": "resp_1", "tools": r_tools,
                                              "input": [{"type": "function_call_output", "call_id": "fc_1", "output": "43"}]}, None, [])
    r = decode_session([r1, r2]).call(1, 0)["result"]
    assert (r["text"], r["source"]) == ("43", "function_call_output")
