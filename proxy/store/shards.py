"""Several writer processes for one tooltap (`serve --writers N`).

One writer process stores a few hundred Cline-sized turns a second; a team's agents
behind one tooltap can send more. `Writers` runs N of them (`process.WriterProcess`,
each with its own journal slot and spool) behind the one writer's interface, and
sends every turn of a conversation to the same one, so each keeps the benefit of
having seen the turn before (a resent history is parsed and hashed only past what it
shares with it, and decoded from the parent it holds in memory).

Which conversation a turn belongs to is the database's business (store/sessions.py),
worked out after parsing; the choice here must cost the proxy next to nothing, so it
reads a few bytes: those after the first `"user"` in the body, up to the first `}`
(the opening of the first user message, in every wire API tooltap knows). A guess that puts a turn on
another writer costs that writer some speed, never correctness: writers sharing a
database thread a conversation the same whatever reaches which, in any order (as
`--workers` and separate instances do).
"""

from __future__ import annotations

import os
import threading
import time
import uuid

from ..capture import TurnRecord
from ..live import LiveHub
from ..workers import adopt_left_over_spools
from .peers import Own
from .process import MEMORY_BYTES, WriterProcess, env_number, journal_dir
from .resent import conversation_key

def shard_spool(spool_path: str, index: int) -> str:
    """Writer 0 keeps the spool; each other has its own beside it (a spool has one reader)."""
    return spool_path if index == 0 else f"{spool_path}.writer{index}"


class Writers:
    """`count` writer processes with the interface of one."""

    def __init__(self, db_url: str, spool_path: str, count: int, *, live: LiveHub | None = None,
                 busy_timeout: float = 2.0):
        self.spool_path = spool_path
        memory = int(env_number("TOOLTAP_WRITER_MEMORY_MB", MEMORY_BYTES / 2**20) * 2**20)
        journal = os.environ.get("TOOLTAP_JOURNAL") or journal_dir(spool_path)
        # One instance to the other tooltaps on the database, and to its own live view:
        # writer 1's turns are not a peer's, writer 0's listener must skip them.
        instance, own = uuid.uuid4().hex[:12], Own()
        self.shards = [
            WriterProcess(db_url, shard_spool(spool_path, i), busy_timeout=busy_timeout, live=live,
                          journal=journal, memory_bytes=max(memory // count, 1 << 16),
                          instance=instance, own=own, listen=i == 0)
            for i in range(count)]

    def start(self) -> None:
        # Fewer writers than last time: the spools of the ones gone go to writer 0.
        adopt_left_over_spools(self.spool_path, len(self.shards), "writer")
        for shard in self.shards:
            shard.start()

    def submit(self, record: TurnRecord) -> None:
        key = conversation_key(record.request_body, record.session_hint)
        self.shards[key % len(self.shards)].submit(record)

    def flush(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        for shard in self.shards:
            shard.flush(max(0.1, deadline - time.monotonic()))

    def close(self, timeout: float = 30.0) -> None:
        """All at once: a stop's grace is the same for each."""
        threads = [threading.Thread(target=shard.close, args=(timeout,), name=f"tooltap-writer-close-{i}")
                   for i, shard in enumerate(self.shards)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    @property
    def written(self) -> int:
        return sum(shard.written for shard in self.shards)

    @property
    def spooled(self) -> int:
        return sum(shard.spooled for shard in self.shards)

    def health(self) -> dict:
        each = [shard.health() for shard in self.shards]
        total = {key: sum(h[key] for h in each)
                 for key in ("backlog", "spool_bytes", "turns_per_s", "written", "spooled", "held_in_memory",
                             "lost", "journal_bytes", "memory_bound_bytes")}
        total["turns_per_s"] = round(total["turns_per_s"], 2)
        total["stalled_s"] = max(h["stalled_s"] for h in each)
        return {**each[0], **total, "alive": all(h["alive"] for h in each), "writers": len(each), "each": each}
