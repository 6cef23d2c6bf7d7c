"""Receiving weights: a header, then chunks; verified whole before anything changes.

A truncated, oversized or corrupted stream is refused with INVALID_ARGUMENT and the served
weights stay as they were; the sender retries the whole push.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

from atgrpo._proto.v1 import rollout_pb2 as pb
from atgrpo.errors import InvalidArgument

MAX_WEIGHT_BYTES = 64 * 2**30
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass
class WeightPush:
    pool: str
    adapter: str
    version: int
    data: bytes
    adapter_config: dict
    rollback: bool = False         # replace whatever version is served (a restored trainer)


def _check_header(h: pb.WeightHeader, max_bytes: int) -> None:
    if not h.pool:
        raise InvalidArgument("weight header names no pool; set header.pool")
    # Version 0 is the initial weights: a model has them from its path, an adapter gets them pushed;
    # a rollback may bring the initial model back (a trainer restarted before its first update).
    if h.version < (0 if h.adapter or h.rollback else 1):
        raise InvalidArgument(f"weight header version {h.version}: model versions start at 1 (0 is the "
                              "initial weights), adapter versions at 0")
    if h.format != pb.WEIGHT_FORMAT_SAFETENSORS:
        raise InvalidArgument("weight format must be WEIGHT_FORMAT_SAFETENSORS")
    if not 0 < h.total_bytes <= max_bytes:
        raise InvalidArgument(f"total_bytes {h.total_bytes} must be in (0, {max_bytes}]")
    if not _HEX64.match(h.sha256):
        raise InvalidArgument("sha256 must be the 64 lowercase hex digits of the payload's SHA-256")
    if h.adapter and not h.adapter_config_json:
        raise InvalidArgument(f"adapter {h.adapter!r} needs adapter_config_json (PEFT's adapter_config.json)")


async def receive(stream: AsyncIterator[pb.WeightChunk], max_bytes: int = MAX_WEIGHT_BYTES) -> WeightPush:
    header = None
    buf = bytearray()
    async for chunk in stream:
        part = chunk.WhichOneof("part")
        if header is None:
            if part != "header":
                raise InvalidArgument("a LoadWeights stream must start with a header message")
            header = chunk.header
            _check_header(header, max_bytes)
            continue
        if part != "data":
            raise InvalidArgument("only the first message of a LoadWeights stream may be a header")
        if len(buf) + len(chunk.data) > header.total_bytes:
            raise InvalidArgument(f"more bytes than the header's total_bytes ({header.total_bytes}); nothing changed")
        buf += chunk.data
    if header is None:
        raise InvalidArgument("empty LoadWeights stream; send a header, then the chunks")
    if len(buf) != header.total_bytes:
        raise InvalidArgument(f"truncated stream: {len(buf)} of {header.total_bytes} bytes arrived; "
                              "nothing changed, resend the whole push")
    if hashlib.sha256(buf).hexdigest() != header.sha256:
        raise InvalidArgument("checksum mismatch: the bytes are corrupted; nothing changed, resend the push")
    try:
        config = json.loads(header.adapter_config_json) if header.adapter else {}
    except json.JSONDecodeError as err:
        raise InvalidArgument(f"adapter_config_json is not JSON: {err}") from None
    return WeightPush(header.pool, header.adapter, header.version, bytes(buf), config, header.rollback)


def tensors(push: WeightPush) -> dict:
    """The pushed safetensors payload as name -> tensor."""
    from safetensors.torch import load

    try:
        return load(push.data)
    except Exception as err:  # noqa: BLE001 - any parse failure is the sender's
        raise InvalidArgument(f"the payload is not a safetensors file ({err}); nothing changed") from None


def encode(state: dict, pool: str, version: int, adapter: str = "", adapter_config: dict | None = None,
           chunk_bytes: int = 4 * 2**20, rollback: bool = False) -> list[pb.WeightChunk]:
    """The LoadWeights messages for `state` (name -> tensor): a header, then chunks."""
    from safetensors.torch import save

    seen: set[int] = set()
    plain = {}
    for name, tensor in state.items():
        t = tensor.detach().contiguous().cpu()
        # Tied weights (embeddings and lm_head) share storage, which safetensors refuses.
        plain[name] = t.clone() if t.data_ptr() in seen else t
        seen.add(t.data_ptr())
    data = save(plain)
    header = pb.WeightHeader(pool=pool, adapter=adapter, version=version,
                             format=pb.WEIGHT_FORMAT_SAFETENSORS, total_bytes=len(data),
                             sha256=hashlib.sha256(data).hexdigest(),
                             adapter_config_json=json.dumps(adapter_config) if adapter else "", rollback=rollback)
    return [pb.WeightChunk(header=header),
            *(pb.WeightChunk(data=data[i:i + chunk_bytes]) for i in range(0, len(data), chunk_bytes))]
