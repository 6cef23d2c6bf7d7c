"""Receiving weights: a header, the chunks, then (when the header has no digest) a trailer.

The bytes are a safetensors file. They go where the engine loads them from as they arrive, never
held whole twice: into tensors (`TensorSink`: one flat buffer, the tensors are views of it), or
into a file (`FileSink`, for an engine that reloads from disk). A data message is read as a view
of the bytes gRPC received (`read_chunk`: no protobuf copy), then written and digested in a worker
thread while the next one arrives, so a multi-gigabyte push never stalls the event loop. Nothing
is served from the new weights until the whole stream is verified: a truncated, oversized or
corrupted stream is refused with INVALID_ARGUMENT, the served weights stay as they were, and the
sender retries the whole push.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import struct
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from atgrpo._proto.v1 import rollout_pb2 as pb
from atgrpo.contract.weight_payload import DATA_TAG, DIGESTS
from atgrpo.errors import InvalidArgument

MAX_WEIGHT_BYTES = 64 * 2**30
MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own limit on its JSON header
_DTYPES = {
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F64": torch.float64,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


@dataclass
class WeightPush:
    pool: str
    adapter: str
    version: int
    adapter_config: dict
    rollback: bool = False  # replace whatever version is served (a restored trainer)
    state: dict | None = None  # name -> tensor, from a TensorSink
    buffer: torch.Tensor | None = None  # the bytes `state` views (Staging takes it back)
    path: Path | None = None  # the safetensors file, from a FileSink
    nbytes: int = 0


def _bad_payload(why: str) -> InvalidArgument:
    return InvalidArgument(f"the payload is not a safetensors file ({why}); nothing changed")


def _fresh(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8)


def _sole_owner(buffer: torch.Tensor) -> bool:
    """Whether `buffer` is the only tensor on its memory (no view of it is alive). torch counts a
    storage's users only privately: without that count, never assume."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    # `buffer` itself and the storage object made to ask
    return count is not None and count(buffer.untyped_storage()._cdata) <= 2


class Staging:
    """The memory a pool's full pushes arrive in, used again. A fresh buffer costs more than the
    copy into it: each of its pages faults in on first write (0.54 s a GiB here against 0.06 s
    for the copy into a buffer written before), on the replica's CPU, while the push streams.

    After a push is served, the buffer of the push before it (whose tensors the engine has just
    dropped, when it adopted them) or its own (an engine that copied it onto its device) has no
    user left, and is kept for the next push of the same size: a replica holds one model's bytes
    more between pushes, which its memory limit already covers, as every push needs them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spare: torch.Tensor | None = None
        self._served: list[torch.Tensor] = []  # buffers whose tensors may still be served

    def take(self, nbytes: int) -> torch.Tensor:
        with self._lock:
            spare, self._spare = self._spare, None
        return spare if spare is not None and spare.numel() == nbytes else _fresh(nbytes)

    def served(self, buffer: torch.Tensor | None) -> None:
        """`buffer`'s push is now served: keep whichever buffer no tensor uses any longer."""
        with self._lock:
            held = [*self._served, *([buffer] if buffer is not None else [])]
            free = [b for b in held if _sole_owner(b)]
            self._served = [b for b in held if not any(b is f for f in free)]
            if free:
                self._spare = free[-1]


class TensorSink:
    """Parses the safetensors header from the first bytes, then copies the rest into one buffer
    (`buffer(nbytes)` gives it: a fresh one by default)."""

    def __init__(self, total_bytes: int, buffer: Callable[[int], torch.Tensor] = _fresh):
        self.total_bytes = total_bytes
        self._buffer = buffer
        self._head = bytearray()
        self._meta: dict | None = None
        self._flat: torch.Tensor | None = None
        self._array: np.ndarray | None = None  # _flat's bytes, written without the GIL
        self._pos = 0

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        if self._flat is None:
            view = self._take_header(view)
            if self._flat is None:
                return
        if len(view):
            # numpy copies without the GIL (a memoryview slice assignment holds it for the whole
            # memcpy: with a chunk's pages faulted in as it goes, the event loop waited 200-800 ms
            # behind the writes, and health checks with it)
            np.copyto(
                self._array[self._pos : self._pos + len(view)], np.frombuffer(view, dtype=np.uint8)
            )
            self._pos += len(view)

    def _take_header(self, view: memoryview) -> memoryview:
        """Add `view`'s first bytes to the header; once it is whole, parse it and allocate the
        buffer. Returns the bytes that are not the header's."""
        take = max(0, min(8 - len(self._head), len(view)))
        self._head += view[:take]
        view = view[take:]
        if len(self._head) < 8:
            return view
        size = struct.unpack("<Q", self._head[:8])[0]
        if size > min(MAX_HEADER_BYTES, self.total_bytes - 8):
            raise _bad_payload(f"a {size}-byte header in a {self.total_bytes}-byte payload")
        take = min(8 + size - len(self._head), len(view))
        self._head += view[:take]
        view = view[take:]
        if len(self._head) < 8 + size:
            return view
        self._meta = self._parse(bytes(self._head[8:]), self.total_bytes - len(self._head))
        self._flat = self._buffer(self.total_bytes - len(self._head))
        self._array = self._flat.numpy()
        return view

    @staticmethod
    def _parse(head: bytes, data_bytes: int) -> dict:
        try:
            meta = json.loads(head)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise _bad_payload(f"its header is not JSON: {err}") from None
        if not isinstance(meta, dict):
            raise _bad_payload("its header is not a JSON object")
        meta.pop("__metadata__", None)
        for name, m in meta.items():
            try:
                dtype, shape, (begin, end) = (
                    _DTYPES[m["dtype"]],
                    [int(d) for d in m["shape"]],
                    m["data_offsets"],
                )
                size = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
                ok = (
                    0 <= begin <= end <= data_bytes
                    and end - begin == size
                    and min(shape, default=0) >= 0
                )
            except (KeyError, TypeError, ValueError):
                ok = False
            if not ok:
                raise _bad_payload(f"tensor {name!r} has an unreadable entry {m!r}")
        return meta

    def finish(self) -> dict[str, torch.Tensor]:
        if self._flat is None or self._pos != len(self._flat):
            raise _bad_payload("it ends before its header says")
        out = {}
        for name, m in self._meta.items():
            dtype, (begin, end) = _DTYPES[m["dtype"]], m["data_offsets"]
            raw = self._flat[begin:end]
            if begin % raw.new_empty(0, dtype=dtype).element_size():
                # torch views a dtype only at an offset that is a multiple of its size
                raw = raw.clone()
            out[name] = raw.view(dtype).reshape(m["shape"])
        return out

    @property
    def buffer(self) -> torch.Tensor | None:
        return self._flat

    def abort(self) -> None:
        self._flat = self._array = None


class FileSink:
    """Writes the payload to `path` as it arrives (an engine that loads from disk). A refused push
    removes the file, and the directory made for it when `directory` is given."""

    def __init__(self, path: Path, directory: Path | None = None):
        self.path, self.directory = path, directory
        self._file = open(path, "wb")  # noqa: SIM115 - closed in finish or abort

    def write(self, data: bytes) -> None:
        self._file.write(data)

    def finish(self) -> Path:
        self._file.close()
        return self.path

    def abort(self) -> None:
        self._file.close()
        self.path.unlink(missing_ok=True)
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)


def _check_header(h: pb.WeightHeader, max_bytes: int) -> None:
    if not h.pool:
        raise InvalidArgument("weight header names no pool; set header.pool")
    # Version 0 is the initial weights: a model has them from its path, an adapter gets them pushed;
    # a rollback may bring the initial model back (a trainer restarted before its first update).
    if h.version < (0 if h.adapter or h.rollback else 1):
        raise InvalidArgument(
            f"weight header version {h.version}: model versions start at 1 (0 is the "
            "initial weights), adapter versions at 0"
        )
    if h.format != pb.WEIGHT_FORMAT_SAFETENSORS:
        raise InvalidArgument("weight format must be WEIGHT_FORMAT_SAFETENSORS")
    if not 0 < h.total_bytes <= max_bytes:
        raise InvalidArgument(f"total_bytes {h.total_bytes} must be in (0, {max_bytes}]")
    if h.digest_algorithm not in DIGESTS:
        raise InvalidArgument(
            f"digest_algorithm {h.digest_algorithm} is unknown; use WEIGHT_DIGEST_XXH3_128 "
            "or WEIGHT_DIGEST_SHA256"
        )
    if h.digest:
        _check_digest(h.digest, h, "the header's digest")
    if h.adapter and not h.adapter_config_json:
        raise InvalidArgument(
            f"adapter {h.adapter!r} needs adapter_config_json (PEFT's adapter_config.json)"
        )


def _check_digest(digest: str, h: pb.WeightHeader, what: str) -> None:
    digits = DIGESTS[h.digest_algorithm][1]
    if len(digest) != digits or digest.strip("0123456789abcdef"):
        raise InvalidArgument(
            f"{what} must be {digits} lowercase hex digits "
            f"({pb.WeightDigest.Name(h.digest_algorithm)}), or empty with a trailer"
        )


def read_chunk(raw: bytes) -> pb.WeightChunk | memoryview:
    """LoadWeights' request deserializer: a data message as a view of its bytes in `raw` (the
    protobuf parser would copy them twice), anything else parsed as a WeightChunk."""
    if raw[:1] == DATA_TAG:
        size, shift, pos = 0, 0, 1
        while pos < min(len(raw), 11):
            byte = raw[pos]
            size |= (byte & 0x7F) << shift
            shift, pos = shift + 7, pos + 1
            if byte < 0x80:
                if pos + size == len(raw):  # exactly one data field, nothing after it
                    return memoryview(raw)[pos:]
                break
    return pb.WeightChunk.FromString(raw)


Sink = TensorSink | FileSink


async def receive(
    stream: AsyncIterator[pb.WeightChunk | memoryview],
    open_sink: Callable[[pb.WeightHeader], Sink] | None = None,
    max_bytes: int = MAX_WEIGHT_BYTES,
) -> WeightPush:
    """Read one LoadWeights stream into the sink `open_sink(header)` gives (default: tensors)."""
    it = stream.__aiter__()
    first = await anext(it, None)
    if first is None:
        raise InvalidArgument("empty LoadWeights stream; send a header, then the chunks")
    if isinstance(first, memoryview) or first.WhichOneof("part") != "header":
        raise InvalidArgument("a LoadWeights stream must start with a header message")
    header = first.header
    _check_header(header, max_bytes)
    try:
        config = json.loads(header.adapter_config_json) if header.adapter else {}
    except json.JSONDecodeError as err:
        raise InvalidArgument(f"adapter_config_json is not JSON: {err}") from None
    sink = open_sink(header) if open_sink else TensorSink(header.total_bytes)
    try:
        got = await _fill(it, sink, header)
        push = WeightPush(
            header.pool, header.adapter, header.version, config, header.rollback, nbytes=got
        )
        result = await asyncio.to_thread(sink.finish)
    except BaseException:
        sink.abort()
        raise
    if isinstance(result, Path):
        push.path = result
    else:
        push.state, push.buffer = result, sink.buffer
    return push


async def _fill(
    it: AsyncIterator[pb.WeightChunk | memoryview], sink: Sink, header: pb.WeightHeader
) -> int:
    """Every chunk into `sink`, digested as it goes; the byte count once the digest matches. A
    chunk is written in a worker thread while the next one is read (one write in flight: order
    kept, at most two chunks held)."""
    hasher, got, digest, writing = DIGESTS[header.digest_algorithm][0](), 0, header.digest, None

    def take(data) -> None:
        hasher.update(data)
        sink.write(data)

    try:
        async for chunk in it:
            data = chunk if isinstance(chunk, memoryview) else None
            part = "data" if data is not None else chunk.WhichOneof("part")
            if part == "trailer":
                if digest:
                    raise InvalidArgument("a stream whose header has a digest takes no trailer")
                digest = chunk.trailer.digest
                _check_digest(digest, header, "the trailer's digest")
                if await anext(it, None) is not None:
                    raise InvalidArgument(
                        "the trailer must be the last message of a LoadWeights stream"
                    )
                break
            if part != "data":
                raise InvalidArgument(
                    "only the first message of a LoadWeights stream may be a header"
                )
            data = chunk.data if data is None else data
            if got + len(data) > header.total_bytes:
                raise InvalidArgument(
                    f"more bytes than the header's total_bytes ({header.total_bytes}); nothing "
                    f"changed"
                )
            if writing is not None:
                await writing
            writing = asyncio.ensure_future(asyncio.to_thread(take, data))
            got += len(data)
        if writing is not None:
            await writing
    except BaseException:
        if writing is not None:  # the sink is aborted next: let its last write end first
            await asyncio.gather(writing, return_exceptions=True)
        raise
    if got != header.total_bytes:
        raise InvalidArgument(
            f"truncated stream: {got} of {header.total_bytes} bytes arrived; "
            "nothing changed, resend the whole push"
        )
    if not digest:
        raise InvalidArgument("no digest: put it in the header, or send a trailer after the chunks")
    if hasher.hexdigest() != digest:
        raise InvalidArgument(
            "checksum mismatch: the bytes are corrupted; nothing changed, resend the push"
        )
    return got


def tensors(data: bytes) -> dict[str, torch.Tensor]:
    """A whole safetensors payload in memory as name -> tensor (the same checks as a stream)."""
    sink = TensorSink(len(data))
    sink.write(data)
    return sink.finish()
