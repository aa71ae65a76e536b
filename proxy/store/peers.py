"""Turns that other tooltap processes store in the same database, for this one's live view.

Several instances (separate hosts, or `serve --workers N`) may share a database, and
the inspector of any of them shows every turn as it lands. On Postgres each writer
announces the turns of a batch with NOTIFY, inside the batch's transaction (so a turn
is announced once committed, never before), and every instance LISTENs. SQLite has no
notifications: the turns table is polled each second for ids past the last one seen,
published a poll later while someone watches the live view. An instance's own turns
reach its live view from its own writer (with the id that names a turn while it
streams), so they are skipped here; the poll's delay lets that writer's word arrive.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
from typing import Any

from sqlalchemy import text

from .db import make_engine

log = logging.getLogger("tooltap.store")

CHANNEL = "tooltap_turns"
PAYLOAD_MAX = 7900  # Postgres refuses a NOTIFY payload of 8000 bytes or more
POLL_SECONDS = 1.0
RETRY_SECONDS = 2.0
_NOTIFY = text("SELECT pg_notify(:channel, :payload)")


def announce(conn, instance: str, events: list[dict[str, Any]]) -> None:
    """Tell the other instances which turns this transaction stores (Postgres)."""
    turns = [[e["turn_id"], e["session_id"]] for e in events]
    while turns:
        chunk, size = [], 40
        while turns and size + len(turns[0][1]) + 24 < PAYLOAD_MAX:
            size += len(turns[0][1]) + 24
            chunk.append(turns.pop(0))
        conn.execute(_NOTIFY, {"channel": CHANNEL,
                               "payload": json.dumps({"instance": instance, "turns": chunk}, separators=(",", ":"))})


class Own:
    """The ids of the turns this instance's writer announced itself (the latest ones)."""

    def __init__(self, size: int = 20_000):
        self._order: collections.deque[int] = collections.deque()
        self._ids: set[int] = set()
        self.size = size

    def add(self, turn_id: int) -> None:
        if turn_id in self._ids:
            return
        self._ids.add(turn_id)
        self._order.append(turn_id)
        if len(self._order) > self.size:
            self._ids.discard(self._order.popleft())

    def __contains__(self, turn_id: int) -> bool:
        return turn_id in self._ids


class PeerTurns:
    """A thread that publishes `turn_stored` for the other instances' turns."""

    def __init__(self, db_url: str, live, instance: str, own: Own):
        self.db_url, self.live, self.instance, self.own = db_url, live, instance, own
        self.postgres = db_url.startswith("postgresql")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "PeerTurns":
        target = self._listen if self.postgres else self._poll
        self._thread = threading.Thread(target=target, name="tooltap-peer-turns", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(POLL_SECONDS + 1)

    def _publish(self, turn_id: int, session_id: str) -> None:
        self.live.publish_threadsafe({"type": "turn_stored", "turn_id": turn_id, "session_id": session_id,
                                      "live_id": None})

    def _listen(self) -> None:
        import psycopg

        from ..config import normalize_db_url

        conninfo = normalize_db_url(self.db_url).replace("postgresql+psycopg://", "postgresql://", 1)
        while not self._stop.is_set():
            try:
                with psycopg.connect(conninfo, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=POLL_SECONDS):
                            self._received(note.payload)
            except Exception as exc:  # the database restarts, the network drops: listen again
                if not self._stop.is_set():
                    log.info("live view: not listening to the other instances (%s); retrying", exc)
                    self._stop.wait(RETRY_SECONDS)

    def _received(self, payload: str) -> None:
        try:
            data = json.loads(payload)
        except ValueError:
            return
        if data.get("instance") == self.instance:
            return
        for turn_id, session_id in data.get("turns") or []:
            self._publish(turn_id, session_id)

    def _poll(self) -> None:
        engine = make_engine(self.db_url)
        last = None
        # Read at the last poll, published at this one: this instance's own writer announces
        # a turn just after its commit, and a poll in between must not take it for another's.
        held: list = []
        try:
            while True:
                rows = []
                try:
                    with engine.connect() as conn:
                        if last is None or not self.live.watched:
                            # Kept current while nobody watches (one cheap read a second): a view
                            # that opens is shown every turn stored since, even a burst that
                            # lands before the next poll.
                            last = conn.execute(text("SELECT coalesce(max(id), 0) FROM turns")).scalar()
                            held = []
                        else:
                            rows = conn.execute(text("SELECT id, session_id FROM turns WHERE id > :last "
                                                     "ORDER BY id LIMIT 1000"), {"last": last}).all()
                except Exception as exc:  # locked, being migrated: next time
                    log.debug("live view: cannot read new turns (%s)", exc)
                for turn_id, session_id in held:
                    if turn_id not in self.own:
                        self._publish(turn_id, session_id)
                held = rows
                if rows:
                    last = rows[-1][0]
                if self._stop.wait(POLL_SECONDS):
                    return
        finally:
            engine.dispose()
