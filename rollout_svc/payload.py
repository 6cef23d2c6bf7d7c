"""Sending weights: one push, encoded once, streamed to every replica at once.

A push is a safetensors file, but never serialised whole: `Payload` lays the file out over the
tensors themselves (the safetensors header, then each tensor's bytes in place), so the sender
holds one copy of the weights, in the rollout's dtype, and each stream copies one chunk at a time
into its message. The SHA-256 is computed once, incrementally, by whichever stream reaches a chunk
first, and sent in the trailer; a stream that falls behind, or a retry, reads the same chunks.

The 8B push that took ~70 s to encode inside the event loop (0.22 GiB/s) is now cast in a worker
thread, and every chunk is cut and hashed in one too: the loop only hands messages to gRPC.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import struct
import threading
from collections.abc import AsyncIterator

import torch

from atgrpo._proto.v1 import rollout_pb2 as pb

CHUNK_BYTES = 4 * 2**20
KEEP_CHUNKS = 4          # recent chunks kept for the streams behind the leader (16 MiB)

_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float64: "F64",
                       torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
                       torch.uint8: "U8", torch.bool: "BOOL"}


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

    def __init__(self, state: dict[str, torch.Tensor], dtype: torch.dtype | None = None,
                 chunk_bytes: int = CHUNK_BYTES):
        self.chunk_bytes = chunk_bytes
        self.tensors: dict[str, torch.Tensor] = {}
        cast: dict = {}     # tied weights (embeddings and head) are cast once
        for name, tensor in state.items():
            key = (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype) \
                if tensor.numel() else id(tensor)
            if key not in cast:
                cast[key] = _plain(tensor, dtype)
            self.tensors[name] = cast[key]
        meta, offset = {}, 0
        for name, t in self.tensors.items():
            if t.dtype not in _SAFETENSORS_DTYPES:
                raise ValueError(f"{name}: dtype {t.dtype} cannot be pushed")
            size = t.numel() * t.element_size()
            meta[name] = {"dtype": _SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape),
                          "data_offsets": [offset, offset + size]}
            offset += size
        head = json.dumps(meta, separators=(",", ":")).encode()
        head += b" " * (-len(head) % 8)        # safetensors pads the header to 8 bytes
        self._segments = [memoryview(struct.pack("<Q", len(head)) + head),
                          *(_bytes_of(t) for t in self.tensors.values())]
        self.total_bytes = sum(len(s) for s in self._segments)
        self.num_chunks = max(1, -(-self.total_bytes // chunk_bytes))
        self._sha = hashlib.sha256()
        self._hashed = 0                       # chunks hashed so far, in order
        self._recent: dict[int, bytes] = {}
        self._lock = threading.Lock()

    def chunk(self, k: int) -> bytes:
        """Chunk k's bytes, hashed if no stream has hashed it yet. The streams of one push run
        close together, so the last few chunks are kept for the ones behind: one copy per chunk,
        not one per replica."""
        with self._lock:
            data = self._recent.get(k)
        if data is None:
            data = self._cut(k)
        with self._lock:
            if k == self._hashed:              # the leading stream hashes; the others only read
                self._sha.update(data)
                self._hashed += 1
                self._recent[k] = data
                self._recent.pop(k - KEEP_CHUNKS, None)
        return data

    def _cut(self, k: int) -> bytes:
        start, end = k * self.chunk_bytes, min((k + 1) * self.chunk_bytes, self.total_bytes)
        parts, pos = [], 0
        for seg in self._segments:
            lo, hi = max(start - pos, 0), min(end - pos, len(seg))
            if lo < hi:
                parts.append(seg[lo:hi])
            pos += len(seg)
            if pos >= end:
                break
        return b"".join(parts)

    def sha256(self) -> str:
        with self._lock:
            if self._hashed != self.num_chunks:
                raise RuntimeError("the digest is known once every chunk has been read")
            return self._sha.hexdigest()

    def header(self, pool: str, version: int, adapter: str = "", adapter_config: dict | None = None,
               rollback: bool = False) -> pb.WeightHeader:
        return pb.WeightHeader(pool=pool, adapter=adapter, version=version, format=pb.WEIGHT_FORMAT_SAFETENSORS,
                               total_bytes=self.total_bytes, rollback=rollback,
                               adapter_config_json=json.dumps(adapter_config) if adapter else "")

    async def stream(self, header: pb.WeightHeader) -> AsyncIterator[pb.WeightChunk]:
        """One replica's LoadWeights messages: the header, the chunks (each cut and hashed in a
        worker thread), then the trailer with the digest."""
        yield pb.WeightChunk(header=header)
        for k in range(self.num_chunks):
            yield pb.WeightChunk(data=await asyncio.to_thread(self.chunk, k))
        yield pb.WeightChunk(trailer=pb.WeightTrailer(sha256=self.sha256()))

    def messages(self, header: pb.WeightHeader) -> list[pb.WeightChunk]:
        """Every message at once, the digest in the header: for small pushes and tests."""
        data = [self.chunk(k) for k in range(self.num_chunks)]
        head = pb.WeightHeader()
        head.CopyFrom(header)
        head.sha256 = self.sha256()
        return [pb.WeightChunk(header=head), *(pb.WeightChunk(data=d) for d in data)]


def encode(state: dict, pool: str, version: int, adapter: str = "", adapter_config: dict | None = None,
           chunk_bytes: int = CHUNK_BYTES, rollback: bool = False) -> list[pb.WeightChunk]:
    """The LoadWeights messages for `state` (name -> tensor), all in memory: a header, then chunks."""
    payload = Payload(state, chunk_bytes=chunk_bytes)
    return payload.messages(payload.header(pool, version, adapter, adapter_config, rollback))
