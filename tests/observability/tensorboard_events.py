"""What TensorBoard shows from a log folder's event files, read without TensorBoard (not installed
here): the records of every events.out.tfevents.* in name order, with TensorBoard's purge rule
(EventAccumulator._MaybePurgeOrphanedData: a SessionLog START at step s hides every event at or
after s read before it, across tags)."""

from __future__ import annotations

import struct
from collections import defaultdict
from pathlib import Path

from tensorboardX.proto.event_pb2 import Event, SessionLog


def records(path: Path):
    """The payloads of a TFRecord file: u64 length, u32 crc, payload, u32 crc (crcs not checked)."""
    data = path.read_bytes()
    at = 0
    while at + 12 <= len(data):
        (n,) = struct.unpack("<Q", data[at : at + 8])
        yield data[at + 12 : at + 12 + n]
        at += 12 + n + 4


def shown_scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] as TensorBoard would plot them."""
    out: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for path in sorted(Path(logdir).glob("events.out.tfevents.*")):
        for raw in records(path):
            e = Event.FromString(raw)
            if e.HasField("session_log") and e.session_log.status == SessionLog.START:
                for tag in out:
                    out[tag] = [(s, v) for s, v in out[tag] if s < e.step]
            elif e.HasField("summary"):
                for v in e.summary.value:
                    out[v.tag].append((e.step, v.simple_value))
    return dict(out)
