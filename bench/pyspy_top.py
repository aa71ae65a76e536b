"""Summarize py-spy collapsed stacks (`py-spy record --format raw`): where a process spends
its samples, by thread, by function inclusive and by function self time.

    python bench/pyspy_top.py bench/results/profile/tooltap-load.txt [--top 30] [--match TEXT]
"""

from __future__ import annotations

import argparse
import collections
import re

_LINE = re.compile(r" \(([^)]*?)(?::\d+)?\)$")


def frame_name(frame: str) -> str:
    """'func (path/to/file.py:123)' -> 'func (file.py)' with the package path kept short."""
    m = _LINE.search(frame)
    if not m:
        return frame
    path = m.group(1)
    for marker in ("site-packages/", "/proxy/", "/lib/python3.11/"):
        if marker in path:
            path = (marker.strip("/") + "/" if marker == "/proxy/" else "") + path.split(marker, 1)[1]
            break
    return f"{frame[:m.start()]} ({path})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--match", help="only stacks containing this text")
    a = ap.parse_args()
    total = 0
    threads: collections.Counter = collections.Counter()
    incl: collections.Counter = collections.Counter()
    self_: collections.Counter = collections.Counter()
    with open(a.file) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack or (a.match and a.match not in stack):
                continue
            n = int(count)
            frames = stack.split(";")
            total += n
            threads[frames[0].split(" (")[0] if frames[0].startswith("thread") else frames[0][:40]] += n
            names = [frame_name(fr) for fr in frames[1:]] or [frames[0]]
            for name in set(names):
                incl[name] += n
            self_[names[-1]] += n
    print(f"{total} samples")
    print("\nby thread:")
    for t, n in threads.most_common():
        print(f"  {n / total:6.1%}  {t}")
    print(f"\ninclusive (top {a.top}):")
    for name, n in incl.most_common(a.top):
        print(f"  {n / total:6.1%}  {name}")
    print(f"\nself (top {a.top}):")
    for name, n in self_.most_common(a.top):
        print(f"  {n / total:6.1%}  {name}")


if __name__ == "__main__":
    main()
