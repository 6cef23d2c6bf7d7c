"""The push format on both sides, without a server: a Payload's bytes are exactly a safetensors
file, its messages are exactly protobuf's, the digest is computed once whatever the number of
streams, and the receiving sinks rebuild the tensors (or the file) from any chunking, refusing
hostile headers and broken streams."""

import asyncio
import hashlib
import json
import struct

import pytest
import torch
import xxhash
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import load, save

from atgrpo._proto.v1 import rollout_pb2 as pb
from atgrpo.contract.weight_payload import Payload
from atgrpo.errors import InvalidArgument
from rollout_svc.weights import FileSink, Staging, TensorSink, read_chunk, receive, tensors


def _state():
    torch.manual_seed(0)
    emb = torch.randn(50, 8)
    return {
        "emb": emb,
        "head": emb,
        "norm": torch.randn(8).bfloat16(),
        "byte": torch.arange(3, dtype=torch.uint8),
        "w": torch.randn(3, 5),
        "steps": torch.arange(7),
        "empty": torch.zeros(0),
    }


def _bytes(p: Payload) -> bytes:
    return b"".join(p.chunk(k) for k in range(p.num_chunks))


def _xxh(data: bytes) -> str:
    return xxhash.xxh3_128(data).hexdigest()


@pytest.mark.parametrize("chunk_bytes", [1, 7, 64, 1000, 1 << 20])
def test_a_payload_is_a_safetensors_file_and_any_chunking_rebuilds_it(chunk_bytes):
    state = _state()
    p = Payload(state, chunk_bytes=chunk_bytes)
    data = _bytes(p)
    assert len(data) == p.total_bytes and p.num_chunks == -(-len(data) // chunk_bytes)
    assert p.digest() == _xxh(data)
    assert all(pb.WeightChunk.FromString(p.wire(k)).data == p.chunk(k) for k in range(p.num_chunks))
    for name, t in load(data).items():
        assert torch.equal(t, state[name]) and t.dtype == state[name].dtype
    sink = TensorSink(len(data))
    for k in range(p.num_chunks):
        sink.write(p.chunk(k))
    out = sink.finish()
    assert set(out) == set(state)
    for name, t in out.items():  # "w" follows the 3-byte tensor: its offset is not a multiple of 4
        assert (
            torch.equal(t, state[name])
            and t.dtype == state[name].dtype
            and t.shape == state[name].shape
        )


def test_a_payload_casts_floating_weights_once_and_holds_no_serialised_copy():
    state = _state()
    p = Payload(state, dtype=torch.bfloat16)
    assert p.tensors["w"].dtype == torch.bfloat16 and p.tensors["steps"].dtype == torch.int64
    assert p.tensors["emb"] is p.tensors["head"]  # tied weights: cast once
    same = Payload({"w": state["w"]})
    # no cast needed: the tensor itself
    assert same.tensors["w"].data_ptr() == state["w"].data_ptr()
    assert tensors(_bytes(p))["w"].dtype == torch.bfloat16


def test_the_digest_is_computed_once_by_the_leading_stream():
    p = Payload(_state(), chunk_bytes=64)
    header = p.header("pool", 1)

    async def drain(delay):
        out = []
        async for m in p.stream(header):
            out.append(m)
            await asyncio.sleep(delay)
        return out

    async def both():
        return await asyncio.gather(drain(0), drain(0.001))

    fast, slow = ([pb.WeightChunk.FromString(m) for m in ms] for ms in asyncio.run(both()))
    assert fast[0].header == slow[0].header == header
    data = b"".join(m.data for m in fast[1:-1])
    assert fast[-1].trailer.digest == slow[-1].trailer.digest == _xxh(data)
    assert [m.data for m in slow[1:-1]] == [m.data for m in fast[1:-1]]
    assert p._hashed == p.num_chunks


@given(st.binary(max_size=300))
def test_a_data_message_is_read_as_a_view_of_its_bytes_and_anything_else_as_a_message(data):
    raw = pb.WeightChunk(data=data).SerializeToString()
    got = read_chunk(raw)
    assert isinstance(got, memoryview) and got.obj is raw and got == data
    # a data field followed by another, or a header, is parsed the slow way: protobuf decides
    twice = raw + pb.WeightChunk(data=b"xy").SerializeToString()
    assert read_chunk(twice).data == b"xy"
    head = pb.WeightChunk(header=_header(len(data) + 1)).SerializeToString()
    assert read_chunk(head).header.total_bytes == len(data) + 1


@pytest.mark.parametrize(
    "algorithm, digest",
    [
        (pb.WEIGHT_DIGEST_SHA256, lambda d: hashlib.sha256(d).hexdigest()),
        (pb.WEIGHT_DIGEST_XXH3_128, _xxh),
    ],
)
def test_either_digest_travels_and_is_checked(algorithm, digest):
    state = {"w": torch.randn(40, 40)}
    p = Payload(state, chunk_bytes=1000, digest=algorithm)
    messages = p.messages(p.header("p", 1))
    assert messages[0].header.digest_algorithm == algorithm and messages[0].header.digest == digest(
        _bytes(p)
    )
    assert torch.equal(_receive(messages).state["w"], state["w"])
    other = "0" * len(messages[0].header.digest)
    messages[0].header.digest = other
    with pytest.raises(InvalidArgument, match="checksum mismatch"):
        _receive(messages)
    messages[0].header.digest = other + "0"
    with pytest.raises(InvalidArgument, match=f"{len(other)} lowercase hex digits"):
        _receive(messages)
    messages[0].header.digest, messages[0].header.digest_algorithm = "", 7
    with pytest.raises(InvalidArgument, match="digest_algorithm 7 is unknown"):
        _receive(messages)


def _header(total, digest="", **kw):
    kw.setdefault("digest_algorithm", pb.WEIGHT_DIGEST_XXH3_128)
    return pb.WeightHeader(
        pool="p",
        version=1,
        format=pb.WEIGHT_FORMAT_SAFETENSORS,
        total_bytes=total,
        digest=digest,
        **kw,
    )


async def _iter(messages):
    for m in messages:
        yield m


def _receive(messages, open_sink=None):
    return asyncio.run(receive(_iter(messages), open_sink))


def test_receive_takes_the_digest_from_the_trailer_or_the_header():
    data = save({"w": torch.randn(4, 4)})
    digest = _xxh(data)
    chunks = [pb.WeightChunk(data=data[i : i + 10]) for i in range(0, len(data), 10)]
    trailer = pb.WeightChunk(trailer=pb.WeightTrailer(digest=digest))
    for messages in (
        [pb.WeightChunk(header=_header(len(data))), *chunks, trailer],
        [pb.WeightChunk(header=_header(len(data), digest)), *chunks],
    ):
        push = _receive(messages)
        assert torch.equal(push.state["w"], load(data)["w"]) and push.nbytes == len(data)
    bad = [
        ([pb.WeightChunk(header=_header(len(data))), *chunks], "no digest"),
        (
            [
                pb.WeightChunk(header=_header(len(data))),
                *chunks,
                pb.WeightChunk(trailer=pb.WeightTrailer(digest="0" * 32)),
            ],
            "checksum mismatch",
        ),
        ([pb.WeightChunk(header=_header(len(data), digest)), *chunks, trailer], "takes no trailer"),
        (
            [pb.WeightChunk(header=_header(len(data))), *chunks, trailer, chunks[0]],
            "must be the last",
        ),
        ([pb.WeightChunk(header=_header(len(data))), *chunks[:-1], trailer], "truncated"),
        (
            [
                pb.WeightChunk(header=_header(len(data))),
                *chunks,
                pb.WeightChunk(trailer=pb.WeightTrailer(digest="xyz")),
            ],
            "32 lowercase hex",
        ),
    ]
    for messages, why in bad:
        with pytest.raises(InvalidArgument, match=why):
            _receive(messages)


def _raw(head: dict | bytes, body: bytes = b"", size: int | None = None) -> bytes:
    text = head if isinstance(head, bytes) else json.dumps(head).encode()
    return struct.pack("<Q", len(text) if size is None else size) + text + body


@pytest.mark.parametrize(
    "data, why",
    [
        (_raw({}, size=2**40), "header in a"),
        (_raw(b"not json"), "not JSON"),
        (_raw(b"[1, 2]"), "not a JSON object"),
        (
            _raw({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 99]}}, b"\0" * 16),
            "unreadable entry",
        ),
        (
            _raw({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 16]}}, b"\0" * 16),
            "unreadable entry",
        ),
        (
            _raw({"w": {"dtype": "Q4", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 16),
            "unreadable entry",
        ),
        (_raw({"w": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 0]}}), "unreadable entry"),
        (_raw({"w": {"shape": [4]}}, b"\0" * 16), "unreadable entry"),
    ],
)
def test_a_hostile_safetensors_header_is_refused_before_anything_is_allocated(data, why):
    with pytest.raises(InvalidArgument, match=why):
        tensors(data)


def test_a_stream_shorter_than_its_safetensors_header_says_is_refused():
    data = save({"w": torch.randn(4)})
    sink = TensorSink(len(data) + 4)
    sink.write(data)
    with pytest.raises(InvalidArgument, match="ends before"):
        sink.finish()


def test_a_file_sink_writes_the_file_as_it_arrives_and_a_refused_push_leaves_nothing(tmp_path):
    data = save({"w": torch.randn(8, 8)})
    digest = _xxh(data)
    chunks = [pb.WeightChunk(data=data[i : i + 100]) for i in range(0, len(data), 100)]
    target = tmp_path / "model.safetensors"
    push = _receive(
        [pb.WeightChunk(header=_header(len(data), digest)), *chunks], lambda h: FileSink(target)
    )
    assert push.path == target and push.state is None and target.read_bytes() == data
    target.unlink()
    made = tmp_path / "model-2"
    made.mkdir()
    (made / "config.json").write_text("{}")
    with pytest.raises(InvalidArgument, match="checksum mismatch"):
        _receive(
            [pb.WeightChunk(header=_header(len(data), "0" * 32)), *chunks],
            lambda h: FileSink(made / "model.safetensors", directory=made),
        )
    assert not made.exists()


def test_staging_keeps_a_buffer_only_once_no_tensor_uses_it():
    staging = Staging()
    first = staging.take(64)
    view = first[8:16].view(torch.float32)  # what an engine serves from
    staging.served(first)
    assert staging.take(64) is not first  # still in use: never written over
    del view
    staging.served(None)
    assert staging.take(32) is not first  # another size: fresh memory
    staging.served(None)
    assert staging.take(64) is not first  # the mismatched take dropped it
    second = staging.take(64)
    staging.served(second)
    assert staging.take(64) is second
