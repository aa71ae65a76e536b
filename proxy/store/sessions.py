"""Thread turns into sessions without the client's help.

Agents resend their whole history each turn, so turn N+1's message list starts with turn
N's. Each message list is a path of chain hashes (content.chain); the longest prefix
already known names the session, and the deepest earlier turn whose whole message list
is a strict prefix of this one is its parent. A retry or an edited history shares a
prefix with the original, so it lands in the same session as a branch (a second child of some
turn). The system prompt is not part of the chain: two tasks that share one stay apart,
and a task whose system prompt changes (new MCP servers, new rules) stays one session.
The chain starts from the wire API and the upstream: an Anthropic and an OpenAI
conversation that open with the same words are two sessions, not one.

A request that continues a conversation the server holds (Responses: an earlier answer
by `previous_response_id`, or a `conversation`) sends only what is new. Its parent is
the newest turn that gave the id it names, found by it (turns.continue_id): it joins the
parent's session, and its chain goes on from the parent's last hash, so the conversation
reads whole up the chain (while the request is kept as sent) and only a retry of the
same request below the same turn shares its nodes. Until its parent is stored, its chain
starts from the id it names.

Several writers may share the database (tooltap instances behind one address), and
consecutive turns of a conversation may reach different ones and be stored in any
order. So the answer must not depend on that order: a new session's id derives from its
conversation's first message (two writers that start it name it the same), and a turn
stored after a later turn of its conversation says so (`Placement.adopt`): the writer
then makes it the parent of the turns below it that were threaded to a shallower one.

`Placer` places a whole batch with two lookups (the chain nodes and the turns at the
last few depths of every chain), turns earlier in the batch included; only a chain
whose last PROBE hashes are all unknown needs a lookup of its own.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass, field

from sqlalchemy import text

from .content import chain as chained, digest

OTHER_PREFIX = "other-"
OTHER_TITLE = "Requests without a conversation"
PROBE = 16  # chain depths looked up per turn in the batch's one query (Cline adds 2-3 per turn)


@dataclass
class Ask:
    """What placing a turn needs to know of it."""

    chain: list[str]
    hint: str | None = None  # the session the client named (X-Tooltap-Session)
    hashes: list[str] = field(default_factory=list)  # its messages' (the chain's links)
    continues: str | None = None  # the id it names to continue a conversation (apis.base.continues)
    continue_id: str | None = None  # the id a later request would name to continue from it
    at: float | None = None  # when the turn began (unix seconds)


@dataclass
class Placement:
    session_id: str
    parent_id: int | None = None  # a stored turn
    parent_index: int | None = None  # or the turn at this index earlier in the same batch
    parent_depth: int = 0  # the parent's message count (0: no parent)
    new_session: bool = False
    adopt: bool = False  # its whole chain was known: later turns may be waiting for it
    known_depth: int = 0  # its chain's first nodes that are stored, or new in this batch already
    # Continuing a conversation the server holds: its chain goes on from `base` (the
    # parent's last chain hash), `offset` messages deep, as `chain`.
    base: str | None = None
    offset: int = 0
    chain: list[str] | None = None


def session_key(hint: str | None) -> str | None:
    """An X-Tooltap-Session value as a session id: kept as given when short and
    printable, else replaced by a hash of it (ids are at most 64 characters). `.` and `..`
    too: in a page's link, a browser resolves them as a path, however they are escaped (in
    a longer name the link's `/` is escaped, so `team/..` is one segment)."""
    hint = (hint or "").strip()
    if not hint:
        return None
    if len(hint) <= 64 and hint.isprintable() and hint not in (".", ".."):
        return hint
    return "h-" + digest(hint.encode("utf-8", "surrogateescape"))


def chain_root(api: str, upstream: str, continues: str | None = None) -> str:
    """Where a request's message chain starts: its wire API and upstream, and the id it
    names to continue a conversation, if it does."""
    after = f"\ncontinues {continues}" if continues else ""
    return digest(f"{api}\n{upstream}{after}".encode("utf-8", "surrogateescape"))


def new_session_id(chain: list[str]) -> str:
    """The id of a session its conversation's first message starts: the same on every
    writer that sees it first."""
    return digest(f"session\n{chain[0]}".encode())[:16]


def lock_key(chain: list[str]) -> int:
    """A conversation's key for Postgres advisory locks (63 bits, positive)."""
    return int(chain[0][:15], 16)


def other_session(at: float | None = None) -> str:
    # No conversation (a model list, a health check, an embedding): one session per day
    # gathers them rather than one session each; the turn's day (an import's may be old).
    return OTHER_PREFIX + time.strftime("%Y-%m-%d", time.gmtime(at))


class Placer:
    """Places the turns of one batch, inside the transaction that stores them."""

    def __init__(self, conn, dialect: str):
        self.conn = conn
        self.postgres = dialect == "postgresql"
        cond = "= ANY(:hashes)" if self.postgres else "IN (SELECT value FROM json_each(:hashes))"
        self._nodes_sql = text(f"SELECT hash, session_id, depth FROM chain_nodes WHERE hash {cond}")
        self._turns_sql = text(f"SELECT id, session_id, chain_hash, message_count FROM turns WHERE chain_hash {cond}")
        self._continued_sql = text("SELECT continue_id, id, session_id, chain_hash, message_count FROM turns "
                                   f"WHERE continue_id {cond} AND chain_hash IS NOT NULL ORDER BY id")

    def _list(self, hashes, *, escape: bool = False) -> object:
        if self.postgres:
            return list(hashes)
        if escape:  # ids as the upstream wrote them
            return json.dumps(list(hashes))
        return "[" + ",".join(f'"{h}"' for h in hashes) + "]"  # hex digests: nothing to escape

    def _nodes(self, hashes) -> dict[str, tuple[str, int]]:
        if not hashes:
            return {}
        rows = self.conn.execute(self._nodes_sql, {"hashes": self._list(hashes)})
        return {h: (s, d) for h, s, d in rows}

    def _turns(self, hashes) -> dict[str, list[tuple[int, str]]]:
        found: dict[str, list[tuple[int, str]]] = defaultdict(list)
        if hashes:
            for turn_id, session_id, chain_hash, _count in self.conn.execute(
                    self._turns_sql, {"hashes": self._list(hashes)}):
                found[chain_hash].append((turn_id, session_id))
        return found

    def _continuable(self, ids) -> dict[str, tuple[None, int, str, str, int]]:
        """The newest stored turn a later request may name by each id (a conversation's
        id names each of its turns in turn)."""
        if not ids:
            return {}
        rows = self.conn.execute(self._continued_sql, {"hashes": self._list(ids, escape=True)})
        return {rid: (None, turn_id, session_id, last, count) for rid, turn_id, session_id, last, count in rows}

    def place_all(self, asks: list[Ask]) -> list[Placement]:
        """Where each turn of the batch goes, given in arrival order."""
        probe_nodes: set[str] = set()
        probe_turns: set[str] = set()
        for ask in asks:
            if ask.chain:
                probe_nodes.update(ask.chain[-PROBE:] if ask.hint is None else ask.chain[-1:])
                probe_turns.update(ask.chain[-PROBE - 1:-1])
        self.nodes = self._nodes(probe_nodes)  # stored before this batch
        self.turns = self._turns(probe_turns)
        continued = self._continuable({ask.continues for ask in asks if ask.continues})
        self.local_nodes: dict[str, str] = {}  # first stored by this batch: hash -> session
        self.local_turns: dict[str, list[tuple[int, str]]] = defaultdict(list)  # chain hash -> (index, session)
        by_root: dict[str, list[list[str]]] = defaultdict(list)  # the batch's chains so far, by first hash
        out: list[Placement] = []
        for i, ask in enumerate(asks):
            chain, hint = ask.chain, ask.hint
            if not chain:
                out.append(Placement(hint or other_session(ask.at)))
                continue
            parent = continued.get(ask.continues) if ask.continues else None
            if parent is not None:
                placement = self._below(ask, parent)
                chain = placement.chain
            elif hint is None:
                session_id, depth = self._deepest(chain)
                placement = Placement(session_id or new_session_id(chain), new_session=session_id is None,
                                      known_depth=depth)
            else:
                placement = Placement(hint)
            placement.adopt = chain[-1] in self.nodes
            if not placement.new_session and placement.base is None:
                self._parent(chain, placement)
            # A chain hash names its whole prefix: an earlier chain holds this one's last
            # hash only at this depth. (Checked so, not against every hash of the batch:
            # the cost of a turn must not grow with its session.)
            depth = len(chain)
            if any(len(c) > depth and c[depth - 1] == chain[-1] for c in by_root[chain[0]]):
                self._adopt_in_batch(i, chain, placement, asks, out)
            for h in chain[placement.known_depth:]:  # nodes above the known depth are stored already
                if h not in self.nodes:
                    self.local_nodes.setdefault(h, placement.session_id)
            by_root[chain[0]].append(chain)
            self.local_turns[chain[-1]].append((i, placement.session_id))
            if ask.continue_id:  # stored after anything already in the database: the newest
                continued[ask.continue_id] = (i, None, placement.session_id, chain[-1], placement.offset + len(chain))
            out.append(placement)
        return out

    def _below(self, ask: Ask, parent: tuple) -> Placement:
        """A turn that continues `parent` (a batch index or a stored id, its session, last
        chain hash and message count): in its session, below it."""
        index, turn_id, session_id, last, depth = parent
        chain = chained(ask.hashes, last)
        _, known = self._deepest(chain)  # a retry of this very request: its nodes exist
        placement = Placement(ask.hint or session_id, known_depth=known, base=last, offset=depth, chain=chain)
        if placement.session_id == session_id:
            placement.parent_id, placement.parent_index, placement.parent_depth = turn_id, index, depth
        return placement

    def _deepest(self, chain: list[str]) -> tuple[str | None, int]:
        """The session of the longest known prefix of `chain`, and its depth."""
        for j in range(len(chain) - 1, max(-1, len(chain) - 1 - PROBE), -1):
            h = chain[j]
            if h in self.nodes:
                return self.nodes[h][0], j + 1
            if h in self.local_nodes:
                return self.local_nodes[h], j + 1
        rest = chain[:-PROBE]
        if not rest:
            return None, 0
        stored = self._nodes(rest)  # rare: a conversation first seen many messages deep
        for j in range(len(rest) - 1, -1, -1):
            h = rest[j]
            if h in stored:
                return stored[h][0], j + 1
            if h in self.local_nodes:
                return self.local_nodes[h], j + 1
        return None, 0

    def _parent(self, chain: list[str], placement: Placement) -> None:
        """The deepest turn of the session whose whole chain is a strict prefix of this
        one (the newest, when a retry made several)."""
        prefixes = chain[:-1]
        window = range(len(prefixes) - 1, max(-1, len(prefixes) - 1 - PROBE), -1)
        if self._parent_among(prefixes, window, self.turns, placement):
            return
        rest = prefixes[:-PROBE]
        if rest:
            self._parent_among(prefixes, range(len(rest) - 1, -1, -1), self._turns(rest), placement)

    def _parent_among(self, prefixes: list[str], depths, stored, placement: Placement) -> bool:
        session = placement.session_id
        for j in depths:
            h = prefixes[j]
            local = [i for i, s in self.local_turns.get(h, ()) if s == session]
            if local:  # stored after anything already in the database: the newest
                placement.parent_index, placement.parent_depth = local[-1], j + 1
                return True
            ids = [t for t, s in stored.get(h, ()) if s == session]
            if ids:
                placement.parent_id, placement.parent_depth = max(ids), j + 1
                return True
        return False

    def _adopt_in_batch(self, i: int, chain: list[str], placement: Placement,
                        asks: list[Ask], placed: list[Placement]) -> None:
        """A turn earlier in this batch that extends this one's chain and was threaded to
        a shallower parent is this one's child (its turns reached the writers out of order)."""
        depth, last = len(chain), chain[-1]
        for j, other in enumerate(placed):
            longer = asks[j].chain
            if (len(longer) > depth and longer[depth - 1] == last and other.session_id == placement.session_id
                    and other.parent_depth < depth):
                other.parent_id, other.parent_index, other.parent_depth = None, i, depth


# The turns below a late turn's chain node, down to the first turn on each branch.
ADOPTABLE = text(
    "WITH RECURSIVE below(hash) AS ("
    " SELECT hash FROM chain_nodes WHERE parent = :h"
    " UNION SELECT c.hash FROM chain_nodes c JOIN below b ON c.parent = b.hash"
    "  WHERE NOT EXISTS (SELECT 1 FROM turns t WHERE t.chain_hash = b.hash AND t.session_id = :s))"
    " SELECT t.id, p.message_count FROM below b JOIN turns t ON t.chain_hash = b.hash AND t.session_id = :s"
    " LEFT JOIN turns p ON p.id = t.parent_id"
)


def adoptable(conn, chain_hash: str, session_id: str, depth: int) -> list[int]:
    """Stored turns of the session that extend the chain ending at `chain_hash` (of
    `depth` messages) and were threaded to a shallower parent, or to none."""
    rows = conn.execute(ADOPTABLE, {"h": chain_hash, "s": session_id})
    return [turn_id for turn_id, parent_depth in rows if parent_depth is None or parent_depth < depth]
