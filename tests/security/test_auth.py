"""The token on the state-changing RPCs: refused without it (UNAUTHENTICATED, saying how to pass
it), nothing changes when refused, clients send it from the environment, and it never reaches a
status message or a log line."""

import asyncio
import logging

import grpc
import pytest
import torch
from grpc import aio

from atgrpo import errors
from atgrpo._proto.v1 import common_pb2, rollout_pb2, router_pb2, trainer_pb2
from atgrpo.contract import trainer_wire
from atgrpo.contract import weight_payload as weights
from atgrpo.contract.trainer import PoolSpec, TrainSample
from atgrpo.rpc.security import (
    PROTECTED_METHODS,
    ClientSecurity,
    ServerSecurity,
    bearer_ok,
    open_channel,
)
from atgrpo.rpc.server import create_server
from rollout_svc.client import RolloutClient
from rollout_svc.engines.hf import HFEngine
from rollout_svc.pool import PoolRuntime
from rollout_svc.replica import Replica
from rollout_svc.server import bindings as rollout_bindings
from router_svc.server import bindings as router_bindings
from tests.security.conftest import TOKEN, start_service
from trainer_svc.client import TrainerClient
from trainer_svc.server import bindings as trainer_bindings
from trainer_svc.trainer import Trainer

GREEDY = rollout_pb2.GenerateRequest(
    pool="p", sampling=common_pb2.SamplingParams(temperature=0, max_tokens=6)
)
GREEDY.messages.messages.add(role="user", content="hello there")
WITHOUT = ClientSecurity()
WRONG = ClientSecurity(token="not-" + TOKEN)
RIGHT = ClientSecurity(token=TOKEN)


def with_pair(model_dir, fn):
    """rollout_svc and trainer_svc in-process, both requiring the token."""

    async def go():
        security = ServerSecurity(token=TOKEN)
        replica = Replica(
            {"p": PoolRuntime("p", HFEngine(model_dir, device="cpu", dtype="float32"))}
        )
        rollout = await create_server(rollout_bindings(replica, None), security=security)
        trainer = await create_server(trainer_bindings(trainer=Trainer("p")), security=security)
        try:
            return await fn(f"127.0.0.1:{rollout.port}", f"127.0.0.1:{trainer.port}")
        finally:
            await trainer.stop(0)
            await rollout.stop(0)

    return asyncio.run(go())


async def raw_call(
    address: str, method: str, requests: list, security: ClientSecurity, stream: bool
):
    """One call with `security`'s credentials; (code, details)."""
    async with open_channel(address, security=security) as ch:
        try:
            if stream:
                await ch.stream_unary(method, request_serializer=lambda m: m.SerializeToString())(
                    iter(requests), timeout=60
                )
            else:
                await ch.unary_unary(method, request_serializer=lambda m: m.SerializeToString())(
                    requests[0], timeout=60
                )
        except aio.AioRpcError as err:
            return err.code(), err.details()
    return grpc.StatusCode.OK, ""


async def state(rollout: str) -> tuple[list, list[float]]:
    """What a push would change: the served versions, and the greedy log-probs."""
    async with open_channel(rollout, security=WITHOUT) as ch:
        info = await ch.unary_unary(
            "/atgrpo.v1.RolloutService/GetInfo",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=rollout_pb2.RolloutInfo.FromString,
        )(common_pb2.GetInfoRequest(), timeout=30)
        gen = await ch.unary_unary(
            "/atgrpo.v1.RolloutService/Generate",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=rollout_pb2.GenerateResponse.FromString,
        )(GREEDY, timeout=60)
    return [(p.pool, p.adapter, p.version) for p in info.policies], list(
        gen.completions[0].logprobs
    )


def test_unauthenticated_load_weights_is_refused_and_changes_nothing(tiny_model):
    engine = HFEngine(tiny_model, device="cpu", dtype="float32")
    new_state = {k: v + 0.05 * torch.randn_like(v) for k, v in engine.model.state_dict().items()}
    chunks = weights.encode(new_state, "p", 1)

    async def go(rollout, trainer):
        before = await state(rollout)
        for who in (WITHOUT, WRONG):
            code, details = await raw_call(
                rollout, "/atgrpo.v1.RolloutService/LoadWeights", chunks, who, stream=True
            )
            assert code == grpc.StatusCode.UNAUTHENTICATED
            assert "authorization: Bearer <token>" in details and "ATGRPO_AUTH_TOKEN" in details
            assert TOKEN not in details
            assert await state(rollout) == before  # versions and outputs: unchanged
        code, details = await raw_call(
            rollout, "/atgrpo.v1.RolloutService/LoadWeights", chunks, RIGHT, stream=True
        )
        assert code == grpc.StatusCode.OK, details
        versions, logprobs = await state(rollout)
        # the same push, with the token, lands
        assert versions == [("p", "", 1)] and logprobs != before[1]

    with_pair(tiny_model, go)


def test_unauthenticated_setup_train_and_save_are_refused_and_change_nothing(
    tiny_model, tmp_path, client_env
):
    setup = trainer_pb2.SetupRequest(
        run_id="r", pool="p", model_path=tiny_model, agents=["a"], seed=0
    )

    async def go(rollout, trainer):
        for method, request, stream in [
            ("Setup", setup, False),
            (
                "Train",
                [
                    trainer_pb2.TrainRequest(
                        header=trainer_pb2.TrainHeader(run_id="r", step=1, num_samples=0)
                    )
                ],
                True,
            ),
            (
                "SaveCheckpoint",
                trainer_pb2.SaveCheckpointRequest(dir=str(tmp_path / "ckpt")),
                False,
            ),
        ]:
            requests = request if stream else [request]
            code, details = await raw_call(
                trainer, f"/atgrpo.v1.TrainerService/{method}", requests, WRONG, stream
            )
            assert code == grpc.StatusCode.UNAUTHENTICATED, (method, details)
        # no token in the environment: refused as a domain error
        async with TrainerClient(trainer) as t:
            with pytest.raises(errors.Unauthenticated, match="ATGRPO_AUTH_TOKEN"):
                await t.setup(trainer_wire.spec_from_pb(setup))
            info = await t.get_info()  # GetInfo needs no token
            assert info.run_id == "" and info.version == 0
        assert not (tmp_path / "ckpt").exists()
        # now every client sends it, trainer -> rollout too
        client_env({"ATGRPO_AUTH_TOKEN": TOKEN})
        async with TrainerClient(trainer) as t:
            await t.setup(
                PoolSpec(
                    run_id="r",
                    pool="p",
                    model_path=tiny_model,
                    agents=("a",),
                    device="auto",
                    rollout_addresses=(rollout,),
                )
            )
            s = TrainSample("a", [5, 6, 7], [8, 9], [-1.0, -1.0], 1.0)
            resp = await t.train("r", 1, 0, [s])
            # the push to rollout carried the token
            assert resp.version == 1 and resp.metrics["push_bytes"] > 0
        async with RolloutClient(rollout) as r:
            assert [(p.adapter, p.version) for p in await r.policies()] == [("", 1)]

    with_pair(tiny_model, go)


def test_router_start_and_stop_need_the_token_and_other_rpcs_do_not():
    async def go():
        running = await create_server(router_bindings(), security=ServerSecurity(token=TOKEN))
        address = f"127.0.0.1:{running.port}"
        try:
            for method, request in (
                ("StartRun", router_pb2.StartRunRequest(config_yaml="run: {}")),
                ("StopRun", router_pb2.StopRunRequest(run_id="x")),
            ):
                code, _ = await raw_call(
                    address, f"/atgrpo.v1.RouterService/{method}", [request], WITHOUT, False
                )
                assert code == grpc.StatusCode.UNAUTHENTICATED
                code, _ = await raw_call(
                    address, f"/atgrpo.v1.RouterService/{method}", [request], RIGHT, False
                )
                # past the door
                assert code in (
                    grpc.StatusCode.INVALID_ARGUMENT,
                    grpc.StatusCode.NOT_FOUND,
                )
            for method, request in (
                ("GetRun", router_pb2.GetRunRequest(run_id="x")),
                ("GetInfo", common_pb2.GetInfoRequest()),
            ):
                code, _ = await raw_call(
                    address, f"/atgrpo.v1.RouterService/{method}", [request], WITHOUT, False
                )
                assert code in (grpc.StatusCode.OK, grpc.StatusCode.NOT_FOUND)
        finally:
            await running.stop(0)

    asyncio.run(go())


def test_every_state_changing_rpc_is_protected():
    assert {m.rsplit("/", 1)[1] for m in PROTECTED_METHODS} == {
        "LoadWeights",
        "Setup",
        "Train",
        "SaveCheckpoint",
        "DeleteCheckpoint",
        "StartRun",
        "StopRun",
    }


@pytest.mark.parametrize(
    "metadata, ok",
    [
        ((("authorization", f"Bearer {TOKEN}"),), True),
        ((("authorization", f"bearer {TOKEN}"),), True),
        ((("authorization", f"Bearer  {TOKEN} "),), True),
        ((("authorization", f"Bearer {TOKEN}x"),), False),
        ((("authorization", f"Bearer {TOKEN[:-1]}"),), False),
        ((("authorization", TOKEN),), False),
        ((("authorization", f"Basic {TOKEN}"),), False),
        ((("x-token", f"Bearer {TOKEN}"),), False),
        ((), False),
        (None, False),
        ((("authorization", "Bearer wrong"), ("authorization", f"Bearer {TOKEN}")), True),
    ],
)
def test_bearer_token_check(metadata, ok):
    assert bearer_ok(metadata, TOKEN) is ok


def test_the_token_reaches_no_status_message_nor_log_line(tmp_path, caplog):
    """In-process (every logger at DEBUG) and as a real process (its whole log output)."""
    wrong = "wrong-token-value-0xdeadbeef"

    async def go():
        running = await create_server(router_bindings(), security=ServerSecurity(token=TOKEN))
        try:
            address = f"127.0.0.1:{running.port}"
            for who in (WITHOUT, ClientSecurity(token=wrong)):
                code, details = await raw_call(
                    address,
                    "/atgrpo.v1.RouterService/StartRun",
                    [router_pb2.StartRunRequest(config_yaml="x: 1")],
                    who,
                    False,
                )
                assert (
                    code == grpc.StatusCode.UNAUTHENTICATED
                    and TOKEN not in details
                    and wrong not in details
                )
        finally:
            await running.stop(0)

    with caplog.at_level(logging.DEBUG):
        asyncio.run(go())
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "refused /atgrpo.v1.RouterService/StartRun" in logged
    assert TOKEN not in logged and wrong not in logged

    router = start_service("router", tmp_path, [], {"ATGRPO_AUTH_TOKEN": TOKEN})
    try:

        async def attempt():
            for who in (WITHOUT, ClientSecurity(token=wrong)):
                code, _ = await raw_call(
                    router.address,
                    "/atgrpo.v1.RouterService/StopRun",
                    [router_pb2.StopRunRequest(run_id="x")],
                    who,
                    False,
                )
                assert code == grpc.StatusCode.UNAUTHENTICATED

        asyncio.run(attempt())
    finally:
        router.stop()
    log = router.log_text()
    assert "token required" in log and "refused /atgrpo.v1.RouterService/StopRun" in log, log
    assert TOKEN not in log and wrong not in log
