"""A resent history, read once: a request body as the part it shares with an earlier
request of its conversation and the bytes that follow.

An agent sends its whole history on every turn: at turn 200 a Cline request is 1.2 MB,
of which the last turn added a few kilobytes. The journal (journal.py) still writes
every body whole, so that each frame stands alone, but says of one that extends an
earlier body of its conversation "its first N bytes are turn X's". The writer, which
read X's body, then reads only the rest of the frame and takes the new body as a
`Spliced` over X's: the shared megabyte is neither read, copied, decoded nor compared
again there (store/requests.py trusts N, which the proxy found by comparing the bytes).

- `conversation_key` picks, cheaply, which earlier body to compare with;
- `shared_prefix` compares, without holding the GIL (the journal's thread runs beside
  the proxy's event loop);
- `Recent` is the proxy's memory of the last body of each conversation;
- `Spliced` is the writer's view of a body made of such parts.
"""

from __future__ import annotations

import ctypes
import zlib
from collections import OrderedDict
from dataclasses import dataclass

OPENING = 96  # bytes after the first "user" that tell conversations apart
_USER = b'"user"'
MIN_SHARED = 16 << 10  # below this a body is journaled whole: a reference would save little
BUDGET = 24 << 20  # bytes of bodies the proxy remembers, per journal
WINDOW = 64 << 10  # the end of the shorter body, where two requests most often part
SMALL = 16 << 10  # below this, bytes are compared in Python


def conversation_key(body: bytes, hint: str | None = None) -> int:
    """The same number for every turn of a conversation, as far as cheap looks tell
    (a session named by the client, X-Tooltap-Session, is named by that)."""
    if hint:
        return zlib.crc32(hint.encode("utf-8", "surrogateescape"))
    at = body.find(_USER)
    if at < 0:
        return 0
    opening = body[at:at + OPENING]
    end = opening.find(b"}")  # a short first message ends here; what follows it changes every turn
    return zlib.crc32(opening[:end] if end > 0 else opening)


# -- comparing ---------------------------------------------------------------------------


def _libc_memcmp():
    try:
        fn = ctypes.CDLL(None).memcmp  # a ctypes call releases the GIL for its duration
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


_memcmp = _libc_memcmp()


def shared_prefix(a: bytes, b: bytes) -> int:
    """How many leading bytes `a` and `b` have in common. Two requests of a conversation
    most often part near the end of the shorter one (its messages end there, the new
    ones begin), so that is looked at first: about one pass over the bytes, 0.1 ms a
    megabyte here, 0.3 when the earlier body has left the caches. With libc's memcmp
    through ctypes, the proxy's event loop runs meanwhile."""
    n = min(len(a), len(b))
    fast = _memcmp is not None and isinstance(a, bytes) and isinstance(b, bytes)
    if fast:
        pa = ctypes.cast(ctypes.c_char_p(a), ctypes.c_void_p).value  # no copy: the bytes' own buffer
        pb = ctypes.cast(ctypes.c_char_p(b), ctypes.c_void_p).value

    def same(lo: int, hi: int) -> bool:
        if fast and hi - lo >= SMALL:
            return _memcmp(pa + lo, pb + lo, hi - lo) == 0
        return a[lo:hi] == b[lo:hi]  # a few kilobytes copied cost less than a call through ctypes

    lo, hi = 0, n + 1  # a[:lo] == b[:lo]; they differ within hi bytes (n + 1: not known to)
    if n > WINDOW:
        if same(0, n - WINDOW):
            lo = n - WINDOW
        else:
            hi = n - WINDOW
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if same(lo, mid):
            lo = mid
        else:
            hi = mid
    return lo


# -- the proxy's side ----------------------------------------------------------------------


@dataclass(frozen=True)
class Base:
    """The turn whose body a new one extends, and how many bytes they share."""

    uid: str
    shared: int


class Recent:
    """The last body the journal wrote for each conversation (by `conversation_key`),
    at most `budget` bytes of them."""

    def __init__(self, budget: int = BUDGET) -> None:
        self.budget = budget
        self._last: OrderedDict[int, tuple[bytes, str]] = OrderedDict()  # body, uid
        self._bytes = 0

    def base_for(self, body: bytes, hint: str | None) -> Base | None:
        """The body of this conversation written last, if this one starts with enough of it."""
        if len(body) < MIN_SHARED:
            return None
        kept = self._last.get(conversation_key(body, hint))
        if kept is None:
            return None
        shared = shared_prefix(body, kept[0])
        # Most of it: a body spliced over one it shares little with would keep that one alive.
        return Base(kept[1], shared) if shared >= max(MIN_SHARED, len(kept[0]) // 2) else None

    def wrote(self, body: bytes, hint: str | None, uid: str) -> None:
        if len(body) < MIN_SHARED or len(body) > self.budget:
            return
        key = conversation_key(body, hint)
        old = self._last.pop(key, None)
        if old is not None:
            self._bytes -= len(old[0])
        self._last[key] = (body, uid)
        self._bytes += len(body)
        while self._bytes > self.budget:
            _, (gone, _) = self._last.popitem(last=False)
            self._bytes -= len(gone)


# -- the writer's side ---------------------------------------------------------------------


class Spliced:
    """The bytes `base[:shared] + rest`, without copying `base`. A base may be spliced
    itself (`depth` links down to bytes); `bytes()` copies each byte of the chain once.
    `held` is what the chain keeps alive: every base whole, every rest whole (a view
    keeps all of what it views)."""

    __slots__ = ("base", "shared", "rest", "depth", "held", "_len")

    def __init__(self, base: bytes | Spliced, shared: int, rest: bytes) -> None:
        if shared > len(base):
            raise ValueError(f"a spliced body shares {shared} bytes of a {len(base)}-byte one")
        self.base, self.shared, self.rest = base, shared, rest
        self.depth = base.depth + 1 if isinstance(base, Spliced) else 1
        own = len(rest.obj) if isinstance(rest, memoryview) else len(rest)
        self.held = (base.held if isinstance(base, Spliced) else len(base)) + own
        self._len = shared + len(rest)

    def __len__(self) -> int:
        return self._len

    def _pieces(self, start: int, stop: int) -> list:
        """Views of the bytes [start, stop), last first."""
        pieces = []
        node: bytes | Spliced = self
        while isinstance(node, Spliced) and stop > start:
            if stop > node.shared:
                lo = max(start, node.shared)
                pieces.append(memoryview(node.rest)[lo - node.shared:stop - node.shared])
                stop = node.shared
            node = node.base
        if stop > start:
            pieces.append(memoryview(node)[start:stop])
        return pieces

    def __bytes__(self) -> bytes:
        return self.slice(0, self._len)

    def slice(self, start: int, stop: int | None = None) -> bytes:
        stop = self._len if stop is None else min(stop, self._len)
        return b"".join(reversed(self._pieces(start, stop)))

    def head(self, stop: int) -> Spliced:
        """The first `stop` bytes, still without a copy of what they share."""
        if stop >= self.shared:
            return Spliced(self.base, self.shared, memoryview(self.rest)[:stop - self.shared])
        node = self.base
        return node.head(stop) if isinstance(node, Spliced) else Spliced(node, stop, b"")

    def startswith(self, prefix: bytes) -> bool:
        return self.slice(0, len(prefix)) == prefix

    def begins(self, body: bytes) -> bool:
        """Whether `body` starts with these bytes, compared piece by piece."""
        if len(body) < self._len:
            return False
        at = 0
        for piece in reversed(self._pieces(0, self._len)):
            if not body.startswith(piece, at):
                return False
            at += len(piece)
        return True
