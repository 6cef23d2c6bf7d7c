"""Sending weights: one push, encoded once, streamed to every replica at once.

A push is a safetensors file, but never serialised whole: `Payload` lays the file out over the
tensors themselves (the safetensors header, then each tensor's bytes in place), so the sender
holds one copy of the weights, in the rollout's dtype. Each chunk is cut straight into its wire
message (the protobuf field's tag and length, then the bytes: one copy, no message object), and
digested once, by whichever stream reaches it first; a stream that falls behind, or a retry,
reads the same chunks. The digest is XXH3-128 by default (27 GB/s here against SHA-256's 1.4),
so neither end of a push waits on it.

The cast runs in a worker thread (seconds for a model); a chunk is cut on the event loop as gRPC
asks for it (a millisecond: a thread hop a chunk cost more than it saved).
"""

from __future__ import annotations

import hashlib
import json
import struct
import threading
from collections.abc import AsyncIterator

import torch
import xxhash

from atgrpo._proto.v1 import rollout_pb2 as pb

CHUNK_BYTES = 4 * 2**20
KEEP_CHUNKS = 4  # recent chunks kept for the streams behind the leader (16 MiB)

# algorithm -> (a new incremental hasher, the hex digest's length)
DIGESTS = {
    pb.WEIGHT_DIGEST_SHA256: (hashlib.sha256, 64),
    pb.WEIGHT_DIGEST_XXH3_128: (xxhash.xxh3_128, 32),
}
DATA_TAG = b"\x12"  # WeightChunk.data: field 2, length-delimited


def varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SAFETENSORS_DTYPES = {
    torch.float32: "F32",
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def _plain(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """CPU, contiguous, in `dtype` if it is a floating tensor: a copy only when one is needed."""
    t = tensor.detach()
    if dtype is not None and t.is_floating_point():
        t = t.to(dtype)
    return t.cpu().contiguous()


def _bytes_of(t: torch.Tensor) -> memoryview:
    # A uint8 view of the tensor's own memory (any dtype, bfloat16 included, which numpy lacks).
    return memoryview(t.reshape(-1).view(torch.uint8).numpy()) if t.numel() else memoryview(b"")


class Payload:
    """The bytes of one push, laid out over its tensors. Build it off the event loop: casting a
    model is seconds of work."""

    def __init__(
        self,
        state: dict[str, torch.Tensor],
        dtype: torch.dtype | None = None,
        chunk_bytes: int = CHUNK_BYTES,
        digest: int = pb.WEIGHT_DIGEST_XXH3_128,
    ):
        self.chunk_bytes = chunk_bytes
        self.tensors: dict[str, torch.Tensor] = {}
        cast: dict = {}  # tied weights (embeddings and head) are cast once
        for name, tensor in state.items():
            key = (
                (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)
                if tensor.numel()
                else id(tensor)
            )
            if key not in cast:
                cast[key] = _plain(tensor, dtype)
            self.tensors[name] = cast[key]
        meta, offset = {}, 0
        for name, t in self.tensors.items():
            if t.dtype not in _SAFETENSORS_DTYPES:
                raise ValueError(f"{name}: dtype {t.dtype} cannot be pushed")
            size = t.numel() * t.element_size()
            meta[name] = {
                "dtype": _SAFETENSORS_DTYPES[t.dtype],
                "shape": list(t.shape),
                "data_offsets": [offset, offset + size],
            }
            offset += size
        head = json.dumps(meta, separators=(",", ":")).encode()
        head += b" " * (-len(head) % 8)  # safetensors pads the header to 8 bytes
        self._segments = [
            memoryview(struct.pack("<Q", len(head)) + head),
            *(_bytes_of(t) for t in self.tensors.values()),
        ]
        self.total_bytes = sum(len(s) for s in self._segments)
        self.num_chunks = max(1, -(-self.total_bytes // chunk_bytes))
        self.digest_algorithm = digest
        self._hash = DIGESTS[digest][0]()
        self._hashed = 0  # chunks hashed so far, in order
        self._recent: dict[int, tuple[bytes, int]] = {}
        self._lock = threading.Lock()

    def wire(self, k: int) -> bytes:
        """Chunk k as a serialised WeightChunk message (what gRPC sends)."""
        return self._message(k)[0]

    def chunk(self, k: int) -> memoryview:
        """Chunk k's bytes of the payload (a view of its message)."""
        message, start = self._message(k)
        return memoryview(message)[start:]

    def _message(self, k: int) -> tuple[bytes, int]:
        """Chunk k's message and where its data starts, digested if no stream has digested it
        yet. The streams of one push run close together, so the last few chunks are kept for the
        ones behind: one copy per chunk, not one per replica."""
        with self._lock:
            got = self._recent.get(k)
        if got is None:
            parts = self._parts(k)
            prefix = DATA_TAG + varint(sum(len(p) for p in parts))
            got = (b"".join([prefix, *parts]), len(prefix))
        with self._lock:
            if k == self._hashed:  # the leading stream digests; the others only read
                self._hash.update(memoryview(got[0])[got[1] :])
                self._hashed += 1
                self._recent[k] = got
                self._recent.pop(k - KEEP_CHUNKS, None)
        return got

    def _parts(self, k: int) -> list[memoryview]:
        start, end = k * self.chunk_bytes, min((k + 1) * self.chunk_bytes, self.total_bytes)
        parts, pos = [], 0
        for seg in self._segments:
            lo, hi = max(start - pos, 0), min(end - pos, len(seg))
            if lo < hi:
                parts.append(seg[lo:hi])
            pos += len(seg)
            if pos >= end:
                break
        return parts

    def digest(self) -> str:
        with self._lock:
            if self._hashed != self.num_chunks:
                raise RuntimeError("the digest is known once every chunk has been read")
            return self._hash.hexdigest()

    def header(
        self,
        pool: str,
        version: int,
        adapter: str = "",
        adapter_config: dict | None = None,
        rollback: bool = False,
    ) -> pb.WeightHeader:
        return pb.WeightHeader(
            pool=pool,
            adapter=adapter,
            version=version,
            format=pb.WEIGHT_FORMAT_SAFETENSORS,
            total_bytes=self.total_bytes,
            rollback=rollback,
            digest_algorithm=self.digest_algorithm,
            adapter_config_json=json.dumps(adapter_config) if adapter else "",
        )

    async def stream(self, header: pb.WeightHeader) -> AsyncIterator[bytes]:
        """One replica's LoadWeights messages, serialised: the header, the chunks, then the
        trailer. Each chunk is cut and digested right here: a millisecond a chunk, where handing
        it to a worker thread and back cost more than the work (streaming to two byte counters
        took 1.5x as long)."""
        yield pb.WeightChunk(header=header).SerializeToString()
        for k in range(self.num_chunks):
            yield self.wire(k)
        yield pb.WeightChunk(trailer=pb.WeightTrailer(digest=self.digest())).SerializeToString()

    def messages(self, header: pb.WeightHeader) -> list[pb.WeightChunk]:
        """Every message at once, the digest in the header: for small pushes and tests."""
        data = [bytes(self.chunk(k)) for k in range(self.num_chunks)]
        head = pb.WeightHeader()
        head.CopyFrom(header)
        head.digest = self.digest()
        return [pb.WeightChunk(header=head), *(pb.WeightChunk(data=d) for d in data)]


def encode(
    state: dict,
    pool: str,
    version: int,
    adapter: str = "",
    adapter_config: dict | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    rollback: bool = False,
    digest: int = pb.WEIGHT_DIGEST_XXH3_128,
) -> list[pb.WeightChunk]:
    """The LoadWeights messages for `state` (name -> tensor), all in memory: a header, then
    chunks."""
    payload = Payload(state, chunk_bytes=chunk_bytes, digest=digest)
    return payload.messages(payload.header(pool, version, adapter, adapter_config, rollback))
