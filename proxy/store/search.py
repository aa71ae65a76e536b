"""The full-text index over messages, tool call arguments and tool results (migration 0008).

What is indexed, and where it lives:

- Messages: one index entry per distinct message blob (blobs are content-addressed, so
  a history resent on every turn is indexed once); a hit reaches its sessions through
  chain_nodes.message_hash. The writer indexes the message blobs that are new in each
  batch, in the batch's transaction (`index_messages`). The blob is zlib JSON, so the
  index holds words of its own: on SQLite the FTS5 table `search_messages_fts` is
  contentless (content=''; only the index, no second copy of the text), its rowid the
  id of a `search_messages` row naming the blob; on Postgres `search_messages` holds
  the blob's tsvector itself, under a GIN index.
- Tool calls: arguments and results are columns of tool_calls, so the database keeps
  their index up to date by itself, whatever writes them (the writer, the decoders
  that fill in results later, `tooltap redecode`): on SQLite triggers feed the
  contentless FTS5 tables `search_tool_args` / `search_tool_results` (rowid =
  tool_calls.id); on Postgres they are stored generated tsvector columns with GIN
  indexes.

The text indexed is the JSON's values (strings, numbers), decoded: a newline inside a
string must not glue two words together, and an escaped non-ASCII character must be
the character. At most INDEX_CHARS characters of a value are indexed (a 20 MB file in
a tool result is not: Postgres refuses a tsvector over 1 MB, and the writer must stay
fast). Words are what SQLite's unicode61 tokenizer makes of the text: runs of letters
and digits; on Postgres ASCII punctuation is turned into spaces first, so both
dialects split `read_file`, `src/app.py` and `-77.0369` the same way. Postgres uses
the 'simple' configuration: no stemming, no stop words, as code needs.

A query is the user's words taken as phrases (`query_terms`): `read_file` is the
phrase "read file", a path is the phrase of its parts, text in double quotes is one
phrase, and every term must match. User text never reaches the FTS syntax as syntax
(it is always inside a quoted FTS5 string, or given to phraseto_tsquery), so quotes,
`*`, `-`, NEAR, AND or parentheses cannot raise a syntax error.
"""

from __future__ import annotations

import re
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import bindparam, text

from ..schemas.names import CLINE_MCP

INDEX_CHARS = 256 * 1024
_BASE64ISH = 1000  # a string this long without a space is data (an image), not words

# SQLite: what a JSON column contributes to the index, as an SQL expression (triggers).
# Not JSON (a model's broken arguments): the text as it is.


def sqlite_json_words(column: str) -> str:
    return (f"substr(CASE WHEN json_valid({column}) THEN (SELECT group_concat(atom, ' ') FROM json_tree({column}) "
            f"WHERE atom IS NOT NULL) ELSE {column} END, 1, {INDEX_CHARS})")


# Postgres: the same, as functions the generated columns and the queries call.
POSTGRES_FUNCTIONS = f"""
CREATE FUNCTION tooltap_json_text(doc text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
  RETURN (SELECT string_agg(v #>> '{{}}', ' ') FROM jsonb_path_query(doc::jsonb, 'strict $.**') AS v
          WHERE jsonb_typeof(v) IN ('string', 'number', 'boolean'));
EXCEPTION WHEN others THEN
  RETURN doc;  -- not JSON, or JSON jsonb refuses (a \\u0000 escape): the text as it is
END $$;
CREATE FUNCTION tooltap_search_words(doc text) RETURNS tsvector
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT to_tsvector('simple', regexp_replace(left(doc, {INDEX_CHARS}), '[!-/:-@[-`{{-~[:space:]]+', ' ', 'g'))
$$;
CREATE FUNCTION tooltap_search_phrase(words text) RETURNS tsquery
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT phraseto_tsquery('simple', regexp_replace(words, '[!-/:-@[-`{{-~[:space:]]+', ' ', 'g'))
$$;
"""
POSTGRES_DROP_FUNCTIONS = """
DROP FUNCTION IF EXISTS tooltap_search_phrase(text);
DROP FUNCTION IF EXISTS tooltap_search_words(text);
DROP FUNCTION IF EXISTS tooltap_json_text(text);
"""


# Cline's MCP tool names: the tool's own name must be found by a search for it.
_MANGLED = re.compile(r"[A-Za-z0-9]+" + CLINE_MCP + r"([A-Za-z0-9_.-]+)")


def message_text(value: Any) -> str:
    """The words of a message: its string and number values, in order, up to INDEX_CHARS."""
    out: list[str] = []
    size = 0
    stack = [value]
    while stack and size < INDEX_CHARS:
        v = stack.pop()
        if isinstance(v, str):
            if len(v) >= _BASE64ISH and " " not in v[:_BASE64ISH]:
                continue
            out.append(v)
            size += len(v) + 1
            if CLINE_MCP in v:  # `<uid>0mcp0get_forecast` is one word to the tokenizers
                out.extend(_MANGLED.findall(v))
        elif isinstance(v, dict):
            stack.extend(reversed(list(v.values())))
        elif isinstance(v, list):
            stack.extend(reversed(v))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append(str(v))
            size += 8
    return "\n".join(out)[:INDEX_CHARS]


# -- writing -------------------------------------------------------------------------------

_SQLITE_KNOWN = text("SELECT blob_hash FROM search_messages WHERE blob_hash IN :hashes").bindparams(
    bindparam("hashes", expanding=True))
_SQLITE_NAME = text("INSERT INTO search_messages (blob_hash) VALUES (:h)")
_SQLITE_WORDS = text("INSERT INTO search_messages_fts (rowid, body) "
                     "VALUES ((SELECT id FROM search_messages WHERE blob_hash = :h), :body)")
_POSTGRES_MESSAGES = text("INSERT INTO search_messages (blob_hash, body) VALUES (:h, tooltap_search_words(:body)) "
                          "ON CONFLICT (blob_hash) DO NOTHING")


def index_messages(conn, dialect: str, messages: dict[str, Any]) -> None:
    """Index message blobs (hash -> the message value) not indexed yet, in the caller's
    transaction. Another writer may have stored (and indexed) some of them already."""
    if not messages:
        return
    hashes = sorted(messages)
    if dialect == "postgresql":
        conn.execute(_POSTGRES_MESSAGES, [{"h": h, "body": message_text(messages[h])} for h in hashes])
        return
    # SQLite: the writer holds the database's write lock (BEGIN IMMEDIATE), so what is
    # not there now is ours to add.
    known = set(conn.execute(_SQLITE_KNOWN, {"hashes": hashes}).scalars())
    new = [h for h in hashes if h not in known]
    if new:
        conn.execute(_SQLITE_NAME, [{"h": h} for h in new])
        conn.execute(_SQLITE_WORDS, [{"h": h, "body": message_text(messages[h])} for h in new])


# -- querying ------------------------------------------------------------------------------

_TERM = re.compile(r'"([^"]*)"|(\S+)')
MAX_TERMS = 16


def query_terms(q: str) -> list[str]:
    """The user's query as phrases: quoted text is one phrase, every other run of
    non-space characters another; terms without a letter or digit are dropped (they
    hold no word to look for). A stray quote is just a character."""
    terms = []
    for quoted, bare in _TERM.findall(q or ""):
        term = (quoted if quoted else bare).strip()
        if any(ch.isalnum() for ch in term):
            terms.append(term)
    return terms[:MAX_TERMS]


def fts5_query(terms: list[str]) -> str:
    """An FTS5 query: each term one quoted string (a phrase of its words), all required."""
    return " AND ".join('"' + t.replace('"', '""') + '"' for t in terms)


# Per place, in the order the inspector names them: SQL giving the session_id of every
# match (for a query that matches little: the index first, then the sessions) and SQL
# saying whether the session `sessions.id` matches (for a query that matches much: the
# newest sessions first, a batch at a time, until a page is full).
#
# SQLite reads each place's match once, as row ids (`_SQLITE_INDEX`), and the first SQL
# takes them as a JSON list (`:rows`): a phrase with common words in it (`src/x/y.py`)
# costs tens of ms in FTS5 at a million turns, too much to pay twice. The second reads
# the match once per statement into a list that each session's rows are checked against
# (`+id IN (...)`: the plus keeps the planner from walking the list once per session
# instead); a lookup of one row in the index costs 30-400 us (it seeks in every
# segment), and a session whose rows hold no match would pay it for each row. The list
# starts at the first row the batch's sessions hold (`_SQLITE_FLOORS`): the newest
# sessions' rows are mostly the newest rows, so a common word's match is read from near
# its end, not whole (a session begun long ago, or a message first sent in an old
# session, moves the start back: slower, never wrong). Finding where the messages start
# costs a lookup per chain node of the batch (~25 ms for 50 sessions of 100 messages),
# so it is done only for a word in more than FLOOR_AT messages: a shorter list costs
# less read whole.
FLOOR_AT = 200_000
_SQLITE_INDEX = {"tool arguments": "search_tool_args", "tool results": "search_tool_results",
                 "messages": "search_messages_fts"}
PLACES = tuple(_SQLITE_INDEX)  # where a search looks, besides titles


def _sqlite_calls(index: str) -> tuple[str, str]:
    """A tool-call place (arguments or results: the same rows, another FTS5 table)."""
    return ("SELECT t.session_id FROM tool_calls c JOIN turns t ON t.id = c.turn_id "
            "WHERE c.id IN (SELECT value FROM json_each(:rows))",
            "EXISTS (SELECT 1 FROM turns t CROSS JOIN tool_calls c ON c.turn_id = t.id "
            f"WHERE t.session_id = sessions.id AND +c.id IN (SELECT rowid FROM {index} "
            f"WHERE {index} MATCH :fts AND rowid >= :calls_from))")


_SQLITE = {
    "tool arguments": _sqlite_calls(_SQLITE_INDEX["tool arguments"]),
    "tool results": _sqlite_calls(_SQLITE_INDEX["tool results"]),
    "messages": (
        "SELECT cn.session_id FROM search_messages m JOIN chain_nodes cn ON cn.message_hash = m.blob_hash "
        "WHERE m.id IN (SELECT value FROM json_each(:rows))",
        "EXISTS (SELECT 1 FROM chain_nodes cn CROSS JOIN search_messages m ON m.blob_hash = cn.message_hash "
        "WHERE cn.session_id = sessions.id "
        "AND +m.id IN (SELECT rowid FROM search_messages_fts WHERE search_messages_fts MATCH :fts "
        "AND rowid >= :messages_from))"),
}
_SQLITE_FLOORS = {
    "calls_from": "SELECT min(c.id) FROM turns t CROSS JOIN tool_calls c ON c.turn_id = t.id "
                  "WHERE t.session_id IN :ids",
    "messages_from": "SELECT min(m.id) FROM chain_nodes cn CROSS JOIN search_messages m "
                     "ON m.blob_hash = cn.message_hash WHERE cn.session_id IN :ids",
}
# Postgres: where each place's words are (a tsvector column under a GIN index).
_POSTGRES_WORDS = {"tool arguments": ("tool_calls", "search_args"), "tool results": ("tool_calls", "search_result"),
                   "messages": ("search_messages", "body")}


def _postgres_calls(column: str) -> tuple[str, str]:
    return (f"SELECT t.session_id FROM {{source}} c JOIN turns t ON t.id = c.turn_id WHERE c.{column} @@ {{q}}",
            "EXISTS (SELECT 1 FROM turns t JOIN tool_calls c ON c.turn_id = t.id "
            f"WHERE t.session_id = sessions.id AND c.{column} @@ {{q}})")


_POSTGRES = {
    "tool arguments": _postgres_calls(_POSTGRES_WORDS["tool arguments"][1]),
    "tool results": _postgres_calls(_POSTGRES_WORDS["tool results"][1]),
    "messages": (
        "SELECT cn.session_id FROM chain_nodes cn WHERE cn.message_hash IN "
        "(SELECT blob_hash FROM {source} m WHERE body @@ {q})",
        "EXISTS (SELECT 1 FROM chain_nodes cn JOIN search_messages m ON m.blob_hash = cn.message_hash "
        "WHERE cn.session_id = sessions.id AND m.body @@ {q})"),
}
# Postgres: a phrase with common words in it (the `src` and `py` of a path) costs its GIN
# scan a walk of their long lists (18-26 ms at a million turns, ~7 ms per million rows a
# word is in). Its other words alone find every match and a few more rows, from short
# lists (5-8 ms); the phrase is then checked on those rows only. The fence (OFFSET 0)
# keeps the planner from folding the phrase back into the index scan. Which words are
# common, the column's statistics say (ANALYZE's most common elements); without
# them, or with no word to leave out, the phrase goes to the index as it is.
COMMON_WORD = 0.1  # of a column's rows
FREQS_SECONDS = 300.0
_freqs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # engine -> (read at, freqs)
_POSTGRES_FREQS = text("SELECT tablename, attname, most_common_elems::text::text[], most_common_elem_freqs "
                       "FROM pg_stats WHERE schemaname = current_schema() AND most_common_elems IS NOT NULL")
_POSTGRES_LEXEMES = text("SELECT tsvector_to_array(tooltap_search_words(t)) "
                         "FROM unnest(CAST(:terms AS text[])) WITH ORDINALITY AS x(t, n) ORDER BY n")


def _postgres_probes(conn, terms: list[str]) -> dict[str, str]:
    """Per place where some term has both common words and others: the tsquery (as
    text, lexemes as indexed) of every term's words but the common ones."""
    freqs = _postgres_freqs(conn)
    if not freqs:
        return {}
    lexemes = [words or [] for words in conn.execute(_POSTGRES_LEXEMES, {"terms": terms}).scalars()]
    probes = {}
    for place, where in _POSTGRES_WORDS.items():
        share = freqs.get(where, {})
        rare = [[w for w in words if share.get(w, 0.0) < COMMON_WORD] for words in lexemes]
        if not any(0 < len(r) < len(words) for r, words in zip(rare, lexemes)):
            continue
        probes[place] = " & ".join(_tsquery_word(w) for r, words in zip(rare, lexemes)
                                   for w in (r if r else words))
    return probes


def _postgres_freqs(conn) -> dict[tuple[str, str], dict[str, float]]:
    """(table, column) -> word -> share of rows, for the most common words: read at most
    every FREQS_SECONDS per engine (3-7 ms at a million turns; ANALYZE changes them)."""
    now = time.monotonic()
    cached = _freqs.get(conn.engine)
    if cached is None or now - cached[0] > FREQS_SECONDS:
        cached = _freqs[conn.engine] = (now, {(table, column): dict(zip(words, shares))
                                              for table, column, words, shares in conn.execute(_POSTGRES_FREQS)})
    return cached[1]


def _postgres_source(place: str, probed: bool) -> str:
    """Where a place's matches are looked for: its table, or the rows its probe finds."""
    table, column = _POSTGRES_WORDS[place]
    if not probed:
        return table
    key = "blob_hash" if table == "search_messages" else "turn_id"
    return f"(SELECT {key}, {column} FROM {table} WHERE {column} @@ CAST(:probe AS tsquery) OFFSET 0)"


def _tsquery_word(word: str) -> str:
    return "'" + word.replace("\\", "\\\\").replace("'", "''") + "'"


# Matches at which the sessions are better walked than found from the index. SQLite
# reads them (up to this many): reading an FTS5 doclist is cheap. Postgres would read a
# heap row per match to count it, so the planner's estimate stands in (its statistics on
# tsvector columns keep the frequent words: within a few percent here); a wrong guess
# makes a search slower, never its answer different.
COMMON = 20_000


@dataclass
class Places:
    """The SQL of a search, per place (`matches`, `exists`), their parameters (per place:
    `place_params`), and whether it matches so much that the sessions are better walked
    newest first (`common`). `floors`: parameters of `exists` worked out for each batch
    of sessions (`:ids`)."""

    matches: dict[str, str]
    exists: dict[str, str]
    params: dict[str, Any]
    common: bool = False
    floors: dict[str, str] = field(default_factory=dict)
    place_params: dict[str, dict[str, Any]] = field(default_factory=dict)


def places(conn, dialect: str, terms: list[str]) -> Places:
    """The search for `terms` (none: nothing to look for, no places)."""
    if not terms:
        return Places({}, {}, {})
    if dialect == "postgresql":
        params: dict[str, Any] = {f"t{i}": t for i, t in enumerate(terms)}
        q = "(" + " && ".join(f"tooltap_search_phrase(:t{i})" for i in range(len(terms))) + ")"
        probes = _postgres_probes(conn, terms)
        found = Places({k: a.format(q=q, source=_postgres_source(k, k in probes)) for k, (a, _) in _POSTGRES.items()},
                       {k: b.format(q=q) for k, (_, b) in _POSTGRES.items()}, params,
                       place_params={k: {"probe": p} for k, p in probes.items()})
        estimate = "EXPLAIN (FORMAT JSON) SELECT 1 FROM {} WHERE {} @@ " + q
        plans = [conn.execute(text(estimate.format(table, column)), params).scalar()
                 for table, column in _POSTGRES_WORDS.values()]
        found.common = sum(plan[0]["Plan"]["Plan Rows"] for plan in plans) >= COMMON
        return found
    params = {"fts": fts5_query(terms)}
    found = Places({k: a for k, (a, _) in _SQLITE.items()}, {k: b for k, (_, b) in _SQLITE.items()}, params)
    left = COMMON
    for place, table in _SQLITE_INDEX.items():
        rows, n = conn.execute(text(f"SELECT json_group_array(rowid), count(*) FROM "  # a list, in C
                                    f"(SELECT rowid FROM {table} WHERE {table} MATCH :fts LIMIT :cap)"),
                               {**params, "cap": left}).one()
        found.place_params[place] = {"rows": rows}
        left -= n
        if left <= 0:
            found.common = True
            break
    return found


def prepare_walk(conn, dialect: str, found: Places) -> None:
    """Before `exists` is used: which starts of the index's lists (`floors`) are worth
    working out for each batch; the others read the whole list."""
    if dialect != "sqlite" or not found.exists:
        return
    found.floors = dict(_SQLITE_FLOORS)
    found.params.update(calls_from=0, messages_from=0)
    messages = conn.execute(text("SELECT count(*) FROM (SELECT 1 FROM search_messages_fts "
                                 "WHERE search_messages_fts MATCH :fts LIMIT :cap)"), {**found.params, "cap": FLOOR_AT})
    if messages.scalar() < FLOOR_AT:
        del found.floors["messages_from"]
