"""The DataLoader's trace: the last N intervals of each thread and stage,
written as Chrome trace JSON (the Trace Event Format Perfetto and
chrome://tracing open).

Invariant: each (thread, stage) ring holds at most ``batches`` intervals, so
a trace costs a bounded amount of memory however long the loader runs; the
intervals are the very ``perf_counter`` readings ``stats()`` sums, so a trace
that still holds every batch sums to ``stats()``'s stage seconds exactly
(up to the microsecond rounding of the JSON).

The rings are only touched under the stats lock (``dataloader._Stats``);
with tracing off the loader pays one ``is None`` test per interval.
"""

from __future__ import annotations

import json
import os
from collections import deque
from typing import Any

__all__ = ["STAGES", "TRACE_BATCHES_MAX", "Trace", "process_read_bytes"]

#: The stages a trace names: the workers' three, and the consumer's wait
#: inside ``next()`` (its stall).
STAGES = ("sample", "gather", "transform", "wait")
#: Intervals kept per thread and stage. Each is a small tuple (~100 bytes):
#: 2**20 of them for 4 stages and a few workers stay in the hundreds of MB,
#: and a trace viewer slows down well before that many events.
TRACE_BATCHES_MAX = 1 << 20
_CONSUMER = "consumer"


class Trace:
    """Bounded rings of ``(step, start, end)`` per (thread name, stage);
    times are ``perf_counter`` seconds, ``origin`` the loader's creation."""

    def __init__(self, batches: int, origin: float) -> None:
        assert 1 <= batches <= TRACE_BATCHES_MAX
        self.batches = batches
        self.origin = origin
        self.rings: dict[tuple[str, str], deque[tuple[int, float, float]]] = {}

    def add(self, thread: str, stage: str, step: int, start: float, end: float) -> None:
        """Records one interval (the caller holds the stats lock)."""
        assert stage in STAGES and end >= start
        ring = self.rings.get((thread, stage))
        if ring is None:
            ring = self.rings[(thread, stage)] = deque(maxlen=self.batches)
        ring.append((step, start, end))

    def copy(self) -> dict[tuple[str, str], list[tuple[int, float, float]]]:
        """The rings as lists (the caller holds the stats lock)."""
        return {key: list(ring) for key, ring in self.rings.items()}


def chrome_events(
    rings: dict[tuple[str, str], list[tuple[int, float, float]]], origin: float
) -> list[dict[str, Any]]:
    """Trace Event Format events: one "M" naming each thread, then one "X"
    complete event per interval (``ts``, ``dur`` in microseconds from
    ``origin``; ``tid`` 0 the consumer, then the workers by name)."""
    pid = os.getpid()
    threads = sorted({thread for thread, _ in rings}, key=lambda name: (name != _CONSUMER, name))
    tids = {thread: number for number, thread in enumerate(threads)}
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "loaderx"}}
    ]
    events += [
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": thread}}
        for thread, tid in tids.items()
    ]
    for (thread, stage), ring in sorted(rings.items()):
        events += [
            {
                "name": stage,
                "cat": "loaderx",
                "ph": "X",
                "ts": round((start - origin) * 1e6, 3),
                "dur": round((end - start) * 1e6, 3),
                "pid": pid,
                "tid": tids[thread],
                "args": {"step": step},
            }
            for step, start, end in ring
        ]
    return events


def write_chrome_trace(
    path: str | os.PathLike[str],
    rings: dict[tuple[str, str], list[tuple[int, float, float]]],
    origin: float,
) -> int:
    """Writes the rings to ``path`` as Chrome trace JSON; returns the number
    of "X" events written."""
    events = chrome_events(rings, origin)
    document = {"traceEvents": events, "displayTimeUnit": "ms"}
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(document, handle, separators=(",", ":"))
    return sum(1 for event in events if event["ph"] == "X")


def consumer_name() -> str:
    """The thread name the consumer's intervals are filed under."""
    return _CONSUMER


def process_read_bytes() -> int | None:
    """Bytes this process read from storage so far (its page-cache misses:
    ``read_bytes`` of ``/proc/self/io``, all threads), or None where the
    kernel does not say (not Linux, or the file unreadable)."""
    try:
        with open("/proc/self/io", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None
