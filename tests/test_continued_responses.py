"""OpenAI Responses conversations continued by reference (`previous_response_id`): each
request sends only what is new, the server holds the rest. They thread into one session
below the turn whose answer they continue, their tool results pair with that turn's
calls, and each request is kept as it was sent."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, text
from sqlmodel import Session as DB

from proxy.capture import TurnRecord
from proxy.cli import main
from proxy.scripted import Reply
from proxy.store.db import open_database
from proxy.store.ingest import Ingestor
from proxy.store.read import Reader
from proxy.store.writer import Writer
from tests.conftest import postgres_url
from tests.test_cli_errors import migrated_to
from tests.test_replay_live import serve

TOOL = {"type": "function", "name": "get_forecast",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


def answer(rid: str, *calls: tuple[str, str], say: str | None = None) -> dict:
    """A finished Response: function calls (call id, city), or one message."""
    if calls:
        output = [{"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": "get_forecast",
                   "arguments": json.dumps({"city": city}), "status": "completed"} for call_id, city in calls]
    else:
        output = [{"type": "message", "id": f"msg_{rid}", "role": "assistant", "status": "completed",
                   "content": [{"type": "output_text", "text": say, "annotations": []}]}]
    return {"id": rid, "object": "response", "created_at": 1, "model": "gpt-test", "status": "completed",
            "output": output, "usage": {"input_tokens": 5, "output_tokens": 7, "total_tokens": 12}}


def result(*outputs: tuple[str, str]) -> list[dict]:
    return [{"type": "function_call_output", "call_id": call_id, "output": output} for call_id, output in outputs]


ANSWERS = [answer("resp_a", ("call_1", "Paris")), answer("resp_b", ("call_2", "Lyon"), ("call_3", "Nice")),
           answer("resp_c", say="Sunny in Paris, rain in Lyon, wind in Nice.")]
LYON_NICE = result(("call_2", "rain, 15 C"), ("call_3", "wind, 19 C"))


def converse(tooltap, upstream) -> None:
    """Three turns continued by reference, through tooltap with the official SDK."""
    upstream.routes["/v1/responses"] = [Reply.json(a) for a in ANSWERS] + [Reply.json(answer("resp_x", say="hi"))]
    client = openai.OpenAI(base_url=f"{tooltap.url}/v1", api_key="sk-test-0123456789abcdef")
    first = client.responses.create(model="gpt-test", input="Weather in Paris and Lyon?", tools=[TOOL])
    tooltap.flush()  # each parent stored before its child arrives: found in the database
    second = client.responses.create(model="gpt-test", previous_response_id=first.id, tools=[TOOL],
                                     input=result(("call_1", "sunny, 24 C")))
    tooltap.flush()
    # Two results, where the turn it continues sent one message: all of them are new.
    client.responses.create(model="gpt-test", previous_response_id=second.id, tools=[TOOL], input=LYON_NICE)
    tooltap.flush()


def test_a_conversation_continued_by_reference_is_one_session_with_its_results_paired(tooltap, upstream):
    converse(tooltap, upstream)
    client = openai.OpenAI(base_url=f"{tooltap.url}/v1", api_key="sk-test-0123456789abcdef")
    # Its parent never went through tooltap: a session of its own, not a lost turn.
    client.responses.create(model="gpt-test", previous_response_id="resp_elsewhere", input="and tomorrow?")
    # One that sends only a result has no words of its own: its title says what it continues.
    upstream.routes["/v1/responses"].append(Reply.json(answer("resp_y", say="fine")))
    client.responses.create(model="gpt-test", previous_response_id="resp_<b>", input=result(("call_8", "ok")))

    sessions = tooltap.api("/sessions")["sessions"]
    assert sorted(s["turns"] for s in sessions) == [1, 1, 3]
    assert {s["title"] for s in sessions if s["turns"] == 1} == {"and tomorrow?", "(continues resp_<b>, not recorded)"}
    assert "(continues resp_&lt;b&gt;, not recorded)" in httpx.get(f"{tooltap.url}/_tooltap/").text
    weather = next(s for s in sessions if s["turns"] == 3)
    assert weather["title"] == "Weather in Paris and Lyon?"
    turns = tooltap.api(f"/sessions/{weather['id']}")["turns"]
    assert [t["parent_id"] for t in turns] == [None, turns[0]["id"], turns[1]["id"]]

    one, two, three = (tooltap.api(f"/turns/{t['id']}") for t in turns)
    assert [(c["id"], c["result"]["text"], c["result"]["status"]) for c in one["tool_calls"]] == [
        ("call_1", "sunny, 24 C", "ok")]
    assert [(c["id"], c["result"]["text"]) for c in two["tool_calls"]] == [
        ("call_2", "rain, 15 C"), ("call_3", "wind, 19 C")]
    # Each request as it was sent: only the new items, and the answer it continues.
    assert two["request"]["input"] == result(("call_1", "sunny, 24 C"))
    assert two["request"]["previous_response_id"] == "resp_a" and two["request"]["tools"] == [TOOL]
    assert three["request"]["input"] == LYON_NICE

    page = httpx.get(f"{tooltap.url}/_tooltap/sessions/{weather['id']}").text
    for shown in ("Weather in Paris and Lyon?", "sunny, 24 C", "rain, 15 C", "wind, 19 C", "wind in Nice."):
        assert shown in page, shown
    found = httpx.get(f"{tooltap.url}/_tooltap/api/search", params={"q": "rain 15"}).json()["sessions"]
    assert [s["id"] for s in found] == [weather["id"]]


def test_a_live_replay_sends_the_conversation_written_out(tooltap, upstream):
    """The endpoint replayed against holds none of the recorded answers: each request goes
    with the recorded conversation in its input instead of the reference."""
    converse(tooltap, upstream)
    (session,) = tooltap.api("/sessions")["sessions"]
    recorded = CliRunner().invoke(main, ["replay", "session", session["id"], "--db", f"sqlite:///{tooltap.db_path}",
                                         "--recorded"])
    assert recorded.exit_code == 0 and "3 of 3 turns identical" in recorded.output, recorded.output  # threaded alike
    with serve({"/v1/responses": [Reply.json(a) for a in ANSWERS]}) as target:
        out = CliRunner().invoke(main, ["replay", "session", session["id"], "--db", f"sqlite:///{tooltap.db_path}",
                                        "--against", target.url + "/v1"])
        assert out.exit_code == 0, out.output
        assert "3 of 3 turns identical" in out.output
        sent = [r.json() for r in target.received]
    assert all("previous_response_id" not in body for body in sent)
    assert sent[0]["input"] == "Weather in Paris and Lyon?"
    user = {"role": "user", "content": "Weather in Paris and Lyon?"}
    # Without their ids: a reasoning model refuses a function call's id sent without the
    # reasoning item it came with ("provided without its required 'reasoning' item").
    calls = [{k: v for k, v in item.items() if k != "id"} for a in ANSWERS[:2] for item in a["output"]]
    assert sent[1]["input"] == [user, calls[0], *result(("call_1", "sunny, 24 C"))]
    assert sent[2]["input"] == [user, calls[0], *result(("call_1", "sunny, 24 C")), *calls[1:], *LYON_NICE]
    assert sent[2]["tools"] == [TOOL]



def test_a_conversation_the_server_keeps_is_one_session_turn_after_turn(tooltap, upstream):
    """`conversation`: every request names the same id; each turn's parent is the one
    before it, even when two of them send the very same words."""
    said = ["Plan my week.", "continue", "continue", "continue"]
    replies = [dict(answer(f"resp_{i}", say=f"part {i}"), conversation={"id": "conv_1"}) for i in range(len(said))]
    replies[1] = dict(answer("resp_1", ("call_9", "Oslo")), conversation={"id": "conv_1"})
    upstream.routes["/v1/responses"] = [Reply.json(r) for r in replies]
    client = openai.OpenAI(base_url=f"{tooltap.url}/v1", api_key="sk-test-0123456789abcdef")
    for i, words in enumerate(said):
        new = result(("call_9", "snow")) + [{"role": "user", "content": words}] if i == 2 else words
        client.responses.create(model="gpt-test", conversation="conv_1", input=new, tools=[TOOL])
        if i == 1:
            tooltap.flush()  # a parent stored, and parents in the same batch
    (session,) = tooltap.api("/sessions")["sessions"]
    assert session["turns"] == 4 and session["title"] == "Plan my week."
    page = httpx.get(f"{tooltap.url}/_tooltap/sessions/{session['id']}").text
    assert page.count("part 2") == 1  # each answer once: the last turn reads on from the third
    turns = tooltap.api(f"/sessions/{session['id']}")["turns"]
    assert [t["parent_id"] for t in turns] == [None] + [t["id"] for t in turns[:-1]]
    (call,) = tooltap.api(f"/turns/{turns[1]['id']}")["tool_calls"]
    assert call["result"]["text"] == "snow"
    third = tooltap.api(f"/turns/{turns[2]['id']}")["request"]
    assert third["conversation"] == "conv_1" and third["input"][-1] == {"role": "user", "content": "continue"}

    with serve({"/v1/responses": [Reply.json(r) for r in replies]}) as target:
        out = CliRunner().invoke(main, ["replay", "session", session["id"], "--db", f"sqlite:///{tooltap.db_path}",
                                        "--against", target.url + "/v1"])
        assert out.exit_code == 0, out.output
        sent = [r.json() for r in target.received]
    assert all("conversation" not in body for body in sent)
    assert sent[0]["input"] == "Plan my week."
    assert [i.get("content") or i.get("output") or i["name"] for i in sent[3]["input"]] == [
        "Plan my week.", [{"type": "output_text", "text": "part 0", "annotations": []}], "continue",
        "get_forecast", "snow", "continue", [{"type": "output_text", "text": "part 2", "annotations": []}], "continue"]
    # The conversation was made before its first turn (perhaps with items): said once.
    assert out.output.count("what came before conv_1 is not in the recording") == 1


def record(i: int, body: dict, response: dict) -> TurnRecord:
    raw = json.dumps(response).encode()
    return TurnRecord(started_at=1_700_000_000 + i, method="POST", path="/v1/responses", upstream="http://up",
                      request_headers=[["content-type", "application/json"]], request_body=json.dumps(body).encode(),
                      api="openai.responses", http_status=200, raw=raw, raw_size=len(raw),
                      response_headers=[["content-type", "application/json"]])


def bodies() -> list[dict]:
    return [{"model": "gpt-test", "input": "Weather in Paris and Lyon?", "tools": [TOOL]},
            {"model": "gpt-test", "previous_response_id": "resp_a", "input": result(("call_1", "sunny"))},
            {"model": "gpt-test", "previous_response_id": "resp_b", "input": LYON_NICE},
            # A retry of the second request: a second child of the first turn, in its session.
            {"model": "gpt-test", "previous_response_id": "resp_a", "input": result(("call_1", "sunny"))}]


@pytest.mark.parametrize("backend", ["sqlite"] + (["postgres"] if postgres_url() else []))
def test_a_parent_earlier_in_the_same_batch_is_found_there(tmp_path, backend):
    url = f"sqlite:///{tmp_path / 't.db'}" if backend == "sqlite" else postgres_url()
    if backend == "postgres":
        with create_engine(url).begin() as conn:  # a clean schema for this run
            conn.execute(text("DROP SCHEMA public CASCADE; CREATE SCHEMA public"))
    engine = open_database(url)
    ingestor = Ingestor(engine.dialect.name)
    responses = ANSWERS + [answer("resp_d", ("call_2", "Lyon"))]
    items = [ingestor.add(record(i, b, r)) for i, (b, r) in enumerate(zip(bodies(), responses))]
    with DB(engine) as db:
        ingestor.check_epoch(db.connection())
        ingestor.write(db, items)
        db.commit()
    turns = [it.turn for it in items]
    assert len({t.session_id for t in turns}) == 1
    assert [t.parent_id for t in turns] == [None, turns[0].id, turns[1].id, turns[0].id]
    assert [t.message_count for t in turns] == [1, 2, 4, 2]  # their depth in the conversation
    reader = Reader(engine)
    assert reader.turn(turns[2].id)["request"]["input"] == LYON_NICE
    assert reader.session(turns[0].session_id)["turns"][-1]["id"] == turns[3].id
    # A later batch finds its parent stored.
    later = ingestor.add(record(9, {"model": "gpt-test", "previous_response_id": "resp_c", "input": "thanks"},
                                answer("resp_e", say="You are welcome.")))
    with DB(engine) as db:
        ingestor.check_epoch(db.connection())
        ingestor.write(db, [later])
        db.commit()
    assert (later.turn.session_id, later.turn.parent_id, later.turn.message_count) == (
        turns[0].session_id, turns[2].id, 5)
    engine.dispose()


def test_turns_stored_before_the_upgrade_are_found_by_their_answer(tmp_path):
    url = f"sqlite:///{tmp_path / 't.db'}"
    writer = Writer(url, spool_path=str(tmp_path / "spool"))
    writer.start()
    writer.submit(record(0, bodies()[0], ANSWERS[0]))
    writer.flush()
    writer.close()
    engine = writer.engine
    with engine.begin() as conn:
        assert conn.execute(text("SELECT continue_id FROM turns")).scalar() == "resp_a"
    from alembic import command

    from proxy.store.db import alembic_config

    with engine.begin() as conn:  # as a tooltap before migration 0011 left it
        cfg = alembic_config(url)
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0010")
    migrated_to(engine, "head")
    with engine.begin() as conn:
        assert conn.execute(text("SELECT continue_id FROM turns")).scalar() == "resp_a"

    writer = Writer(url, spool_path=str(tmp_path / "spool"))
    writer.start()
    writer.submit(record(1, bodies()[1], ANSWERS[1]))
    writer.flush()
    writer.close()
    turns = Reader(writer.engine).turns()
    assert len({t["session_id"] for t in turns}) == 1
    assert {t["parent_id"] for t in turns} == {None, min(t["id"] for t in turns)}


def test_an_id_of_any_characters_is_looked_up_as_it_is(tmp_path):
    """Ids are the upstream's: quotes and backslashes must neither break the batch nor miss."""
    engine = open_database(f"sqlite:///{tmp_path / 't.db'}")
    ingestor = Ingestor(engine.dialect.name)
    odd = 'resp_"quoted\\slash'
    asked = [({"model": "m", "input": "first"}, answer(odd, say="one")),
             ({"model": "m", "previous_response_id": odd, "input": "second"}, answer("resp_2", say="two"))]
    items = []
    for i, (body, response) in enumerate(asked):  # one batch each: the second finds the first stored
        items.append(ingestor.add(record(i, body, response)))
        with DB(engine) as db:
            ingestor.check_epoch(db.connection())
            ingestor.write(db, items[-1:])
            db.commit()
    assert items[1].turn.parent_id == items[0].turn.id
    assert items[1].turn.session_id == items[0].turn.session_id
    engine.dispose()
