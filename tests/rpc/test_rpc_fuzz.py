"""Every RPC of every service, fuzzed over real gRPC: random field values (huge strings, negative
and extreme numbers, NaN, unknown enums, any oneof member), garbage and truncated bytes, and
messages over the size cap. Each call must end with a status that says what happened
(INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, RESOURCE_EXHAUSTED, ... or OK), never UNKNOWN
or INTERNAL (a crash) nor a deadline (a hang), and every server must keep serving: each test
ends with a health check and a real call to every service.

The RPC list comes from the .proto descriptors, so an RPC added later is fuzzed without a change
here. Paths the services write to (checkpoint and run directories) are kept relative: the suite
runs in a scratch directory, as root on CI, and the services trust their callers with paths.
What the calls send (hints, valid requests, the strategies of a call) is built in
fuzz_requests.py; the tests stay in this one module, as they share one set of services
(conftest.py's fuzz_services) and the counters the summary test prints last.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from collections.abc import Callable

import grpc
import pytest
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from atgrpo._proto.v1 import env_pb2, rollout_pb2, router_pb2, sandbox_pb2, trainer_pb2
from atgrpo.rpc.options import MAX_MESSAGE_BYTES
from tests.rpc.fuzz_harness import KINDS, health, valid_calls
from tests.rpc.fuzz_requests import hints, request_lists, valid_requests
from tests.rpc.fuzz_strategies import MessageStrategies

MODULES = (env_pb2, sandbox_pb2, rollout_pb2, router_pb2, trainer_pb2)
RPCS = [
    (kind, method)
    for module in MODULES
    for service in module.DESCRIPTOR.services_by_name.values()
    for kind in [service.name.removesuffix("Service").lower()]
    for method in service.methods
]
RPC_IDS = [f"{kind}.{m.name}" for kind, m in RPCS]

PROPER = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.ABORTED,
}
CALL_TIMEOUT_S = 60.0  # a call still running after this is a hang
MAX_STREAM_EVENTS = 200  # server streams are read this far, then cancelled

# Each example costs a real call; the heavy RPCs (a model, a sandbox, a training step) get fewer.
HEAVY = {
    "rollout.Generate": 30,
    "rollout.Collect": 25,
    "trainer.Train": 30,
    "trainer.Setup": 25,
    "trainer.SaveCheckpoint": 12,
    "sandbox.Execute": 25,
    "sandbox.RunTests": 25,
    "router.StartRun": 40,
}
LIGHT = 50
# e.g. 20 for a long hunt; 1 fits `make test`
SCALE = float(os.environ.get("ATGRPO_FUZZ_SCALE", "1"))
TRIED: Counter[str] = Counter()  # inputs sent, by kind, for the summary test
OUTCOMES: Counter[tuple[str, str]] = Counter()  # (rpc, status) -> count: how deep the fuzzing got
# ATGRPO_FUZZ_HUNT=1: record every improper status and go on (the summary test lists them all)
# instead of stopping at the first; with ATGRPO_FUZZ_SCALE, a long search for bugs.
HUNT = bool(os.environ.get("ATGRPO_FUZZ_HUNT"))
FOUND: list[str] = []
SAMPLES: dict[tuple[str, str], str] = {}


def fuzz_settings(rpc_id: str, scale: float = 1.0) -> settings:
    # No shrinking: every step of it is a real call, and the failing request is in the message.
    return settings(
        max_examples=max(3, int(HEAVY.get(rpc_id, LIGHT) * scale * SCALE)),
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
        phases=[Phase.explicit, Phase.generate],
    )


@pytest.fixture(scope="module")
def gen(fuzz_services):
    """message strategies with the services' own names mixed in."""
    return MessageStrategies(GetMessageClass, hints(fuzz_services))


def call(
    services, kind: str, method, requests, *, raw: bool = False
) -> tuple[grpc.StatusCode, str]:
    """One call with `requests` (messages, or bytes when `raw`); its final status."""
    ch = services.channel(kind)
    path = f"/{method.containing_service.full_name}/{method.name}"
    ser = None if raw else (lambda m: m.SerializeToString())
    start = time.monotonic()
    try:
        if method.client_streaming:
            ch.stream_unary(path, request_serializer=ser)(iter(requests), timeout=CALL_TIMEOUT_S)
        elif method.server_streaming:
            stream = ch.unary_stream(path, request_serializer=ser)(
                requests[0], timeout=CALL_TIMEOUT_S
            )
            for i, _ in enumerate(stream):
                if i + 1 >= MAX_STREAM_EVENTS:
                    stream.cancel()
                    break
        else:
            ch.unary_unary(path, request_serializer=ser)(requests[0], timeout=CALL_TIMEOUT_S)
    except grpc.RpcError as err:
        if err.code() == grpc.StatusCode.CANCELLED and time.monotonic() - start < CALL_TIMEOUT_S:
            return grpc.StatusCode.OK, "cancelled by the test after enough events"
        return err.code(), err.details() or ""
    return grpc.StatusCode.OK, ""


def improper(code: grpc.StatusCode, details: str, what: str) -> str:
    """What is wrong with `code` and `details` as the answer to `what`; "" when nothing is. In
    HUNT mode an improper status is recorded in FOUND instead (and "" returned), so the search
    goes on."""
    if HUNT:
        with open(os.environ.get("ATGRPO_FUZZ_LOG", "/dev/null"), "a") as log:
            log.write(
                f"{time.strftime('%H:%M:%S')} {code.name} {details[:200]!r} <- {what[:300]!r}\n"
            )
    SAMPLES.setdefault((what.split("(")[0], code.name), details[:300])
    # grpc's own RESOURCE_EXHAUSTED: the real status was lost
    if "metadata size exceeds" in details:
        code = grpc.StatusCode.INTERNAL
    if code not in PROPER:
        if HUNT:
            FOUND.append(f"{what[:1000]} -> {code.name}: {details[:1000]}")
            return ""
        return f"{what} -> {code.name}: {details}"
    if code != grpc.StatusCode.OK and not details.strip():
        return f"{what} -> {code.name} without a message"
    return ""


SERVING = dict.fromkeys(KINDS, "SERVING")


def serving(services) -> dict[str, str]:
    """Each service's health; then one real call to each (valid_calls: each must succeed)."""
    now = {kind: health(services, kind) for kind in KINDS}
    valid_calls(services)
    return now


@pytest.mark.parametrize("rpc_id", RPC_IDS)
def test_random_messages_get_proper_statuses(fuzz_services, gen, rpc_id):
    kind, method = RPCS[RPC_IDS.index(rpc_id)]
    strategy = request_lists(gen, rpc_id, method, fuzz_services)

    @fuzz_settings(rpc_id)
    @given(requests=strategy)
    def fuzz(requests):
        TRIED["messages"] += 1
        code, details = call(fuzz_services, kind, method, requests)
        OUTCOMES[(rpc_id, code.name)] += 1
        problem = improper(code, details, f"{rpc_id}({[str(r)[:300] for r in requests]})")
        assert not problem, problem

    fuzz()
    assert serving(fuzz_services) == SERVING


def _corrupt(data: bytes, cut: int, flips: list[tuple[int, int]]) -> bytes:
    data = bytearray(data[:cut] if cut < len(data) else data)
    for pos, bit in flips:
        if data:
            data[pos % len(data)] ^= 1 << bit
    return bytes(data)


@pytest.mark.parametrize("rpc_id", RPC_IDS)
def test_garbage_and_truncated_bytes_get_proper_statuses(fuzz_services, gen, rpc_id):
    kind, method = RPCS[RPC_IDS.index(rpc_id)]
    valid = gen.for_message(method.input_type).map(lambda m: m.SerializeToString())
    truncated = st.builds(
        _corrupt,
        valid,
        st.integers(0, 64),
        st.lists(st.tuples(st.integers(0, 2**16), st.integers(0, 7)), max_size=3),
    )
    payloads = st.one_of(
        st.binary(max_size=64),
        truncated,
        st.sampled_from([b"\xff" * 10, b"\x0a\xff\xff\xff\xff\x0f", b"\x08", b"\x12\x05ab"]),
    )
    streams = st.lists(payloads, min_size=1, max_size=3)

    @fuzz_settings(rpc_id, scale=0.8)
    @given(requests=streams)
    def fuzz(requests):
        TRIED["bytes"] += 1
        code, details = call(
            fuzz_services,
            kind,
            method,
            requests if method.client_streaming else requests[:1],
            raw=True,
        )
        problem = improper(code, details, f"{rpc_id}(raw {requests[:1]!r:.200})")
        assert not problem, problem

    fuzz()
    assert serving(fuzz_services) == SERVING


def _oversized() -> bytes:
    """Field 1 as a length-delimited value just over the server's cap (64 MiB)."""
    n = MAX_MESSAGE_BYTES + 1024
    varint = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        varint.append(byte | (0x80 if n else 0))
        if not n:
            break
    return b"\x0a" + bytes(varint) + b"x" * (MAX_MESSAGE_BYTES + 1024)


@pytest.fixture(scope="module")
def oversized():
    return _oversized()


def test_oversized_messages_are_refused_with_resource_exhausted(fuzz_services, oversized):
    for rpc_id in RPC_IDS:
        kind, method = RPCS[RPC_IDS.index(rpc_id)]
        TRIED["oversized"] += 1
        code, details = call(fuzz_services, kind, method, [oversized], raw=True)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, f"{rpc_id}: {code.name}: {details}"
        assert str(MAX_MESSAGE_BYTES) in details or "larger than max" in details, details
    assert serving(fuzz_services) == SERVING


def test_every_rpc_of_every_service_is_fuzzed():
    kinds = Counter(kind for kind, _ in RPCS)
    assert set(kinds) == set(KINDS)
    assert {
        "env.Reset",
        "rollout.LoadWeights",
        "trainer.Train",
        "router.StartRun",
        "sandbox.RunTests",
    } <= set(RPC_IDS)
    assert len(RPC_IDS) == 27


def _edit(rpc_id: str, change: Callable[[list], object]) -> Callable[[object], list]:
    def make(services) -> list:
        requests = valid_requests(services)[rpc_id]()
        change(requests)
        return requests

    return make


def _set(path: str, value) -> Callable[[list], None]:
    """requests[i].a.b = value, for a path 'i.a.b'."""

    def change(requests: list) -> None:
        index, *names = path.split(".")
        target = requests[int(index)]
        for name in names[:-1]:
            target = getattr(target, name)
        setattr(target, names[-1], value)

    return change


def _messages_cleared(requests: list) -> None:
    requests[0].messages.ClearField("messages")


def _bad_address(requests: list) -> None:
    requests[0].pool_addresses["elsewhere"] = "garbage:::"
    requests[0].agents[0].pool = "elsewhere"


def _inf_option(requests: list) -> None:
    requests[0].options["x"] = float("inf")


def _token(index: int, which: str, value: int) -> Callable[[list], None]:
    def change(requests: list) -> None:
        getattr(requests[index].sample, which)[0] = value

    return change


# What the fuzzing found, each pinned with the status it gets now (what it got before the fix).
FOUND_BY_FUZZING = {
    "undecodable bytes (UNKNOWN)": (
        "env.Describe",
        lambda s: [b"\x0a\x05ab"],
        "INVALID_ARGUMENT",
        "not a valid message",
    ),
    "a 6 MiB name quoted in the message (RESOURCE_EXHAUSTED: metadata too large)": (
        "env.Describe",
        _edit("env.Describe", _set("0.env", "x" * (6 * 2**20))),
        "NOT_FOUND",
        "more bytes of this message cut",
    ),
    "an infinite number in options (INTERNAL)": (
        "env.Reset",
        _edit("env.Reset", _inf_option),
        "INVALID_ARGUMENT",
        "JSON",
    ),
    "an unknown enum value (INTERNAL)": (
        "rollout.Collect",
        _edit("rollout.Collect", _set("0.mode", 743)),
        "INVALID_ARGUMENT",
        "mode 743 is not a known value",
    ),
    "no chat messages (INTERNAL)": (
        "rollout.Generate",
        _edit("rollout.Generate", _messages_cleared),
        "INVALID_ARGUMENT",
        "messages is empty",
    ),
    "max_tokens 2**31-1 (a generation that never ends)": (
        "rollout.Generate",
        _edit("rollout.Generate", _set("0.sampling.max_tokens", 2**31 - 1)),
        "INVALID_ARGUMENT",
        "max_tokens",
    ),
    "max_tokens over the context (hours of generation)": (
        "rollout.Generate",
        _edit("rollout.Generate", _set("0.sampling.max_tokens", 100_000)),
        "INVALID_ARGUMENT",
        "context length",
    ),
    "NaN temperature (NaN log-probs)": (
        "rollout.Generate",
        _edit("rollout.Generate", _set("0.sampling.temperature", math.nan)),
        "INVALID_ARGUMENT",
        "temperature nan",
    ),
    "k = 2**31-1 (every episode failing)": (
        "rollout.Collect",
        _edit("rollout.Collect", _set("0.k", 2**31 - 1)),
        "INVALID_ARGUMENT",
        "k=2147483647",
    ),
    "a malformed pool address (retried until the deadline)": (
        "rollout.Collect",
        _edit("rollout.Collect", _bad_address),
        "INVALID_ARGUMENT",
        "pool_addresses",
    ),
    "a token id outside the vocabulary (INTERNAL: IndexError)": (
        "trainer.Train",
        _edit("trainer.Train", _token(1, "prompt_token_ids", 10**9)),
        "INVALID_ARGUMENT",
        "vocabulary",
    ),
    "a NaN temperature in a sample (NaN weights)": (
        "trainer.Train",
        _edit("trainer.Train", _set("1.sample.sampling.temperature", math.nan)),
        "INVALID_ARGUMENT",
        "temperature",
    ),
    "NaN clip epsilon (NaN weights)": (
        "trainer.Train",
        _edit("trainer.Train", _set("0.header.update.clip_eps_low", math.nan)),
        "INVALID_ARGUMENT",
        "clip_eps_low nan",
    ),
    "epochs = 2**31-1 (a step that never ends)": (
        "trainer.Train",
        _edit("trainer.Train", _set("0.header.update.epochs", 2**31 - 1)),
        "INVALID_ARGUMENT",
        "epochs",
    ),
    "a model path too long for the file system (INTERNAL: OSError)": (
        "trainer.Setup",
        _edit("trainer.Setup", _set("0.model_path", "a" * 300)),
        "NOT_FOUND",
        "model_path",
    ),
    "a NaN learning rate (NaN weights)": (
        "trainer.Setup",
        _edit("trainer.Setup", _set("0.optim.lr", math.nan)),
        "INVALID_ARGUMENT",
        "lr nan",
    ),
}


@pytest.mark.parametrize("finding", list(FOUND_BY_FUZZING))
def test_what_the_fuzzing_found_stays_fixed(fuzz_services, finding):
    rpc_id, make, want, fragment = FOUND_BY_FUZZING[finding]
    kind, method = RPCS[RPC_IDS.index(rpc_id)]
    requests = make(fuzz_services)
    code, details = call(fuzz_services, kind, method, requests, raw=isinstance(requests[0], bytes))
    assert (code.name, fragment in details) == (want, True), details[:500]


def test_summary_of_inputs_tried(fuzz_services):
    """Runs last in this module: the servers are still up after everything above."""
    assert serving(fuzz_services) == SERVING
    print(
        f"\nfuzz inputs tried: {dict(TRIED)} (total {sum(TRIED.values())}) over {len(RPC_IDS)} RPCs"
    )
    for rpc_id in RPC_IDS:
        codes = {c: n for (r, c), n in sorted(OUTCOMES.items()) if r == rpc_id}
        print(f"  {rpc_id:24} {codes}")
    if HUNT:
        for (rpc_id, code), details in sorted(SAMPLES.items()):
            print(f"  {rpc_id} {code}: {details}")
    assert not FOUND, "\n".join(FOUND)
