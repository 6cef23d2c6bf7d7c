"""RolloutClient: Generate, Collect and LoadWeights in plain types (atgrpo.contract.rollout); the
router collects with it, trainers push weights with it (push_weights: to every replica at once)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

from atgrpo._proto.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc
from atgrpo.contract import rollout_wire
from atgrpo.contract.rollout import (
    CollectPlan,
    EpisodeEnd,
    Generation,
    PolicyRef,
    RolloutInfo,
    Sample,
    WeightsLoaded,
)
from atgrpo.contract.sampling import Sampling
from atgrpo.rpc.client import ServiceClient, to_domain_error

if TYPE_CHECKING:  # imported by the calls that push: torch comes with it, and a caller that
    from atgrpo.contract.weight_payload import Payload  # only generates or collects needs none

# A push's deadline grows with its size: 2 minutes, plus a floor of 100 MB/s for the bytes.
PUSH_BASE_S, PUSH_FLOOR_BYTES_PER_S = 120.0, 100e6


class RolloutClient(ServiceClient):
    stub_class = rollout_pb2_grpc.RolloutServiceStub

    async def get_info(self) -> RolloutInfo:
        return rollout_wire.info_from_pb(
            await self._call(self.stub.GetInfo, common_pb2.GetInfoRequest())
        )

    async def get_info_within(self, timeout_s: float) -> RolloutInfo:
        """get_info, tried once with a deadline of `timeout_s`: whether the replica is there and
        serving now. One that is starting or stopping answers UNAVAILABLE at once (not retried:
        the router syncs a replica again when it is listed anew)."""
        return rollout_wire.info_from_pb(
            await self._call(
                self.stub.GetInfo, common_pb2.GetInfoRequest(), timeout_s=timeout_s, retry=False
            )
        )

    async def policies(self, timeout_s: float | None = None) -> tuple[PolicyRef, ...]:
        info = await (self.get_info_within(timeout_s) if timeout_s else self.get_info())
        return info.policies

    async def generate(
        self,
        pool: str,
        *,
        messages: list[dict] | None = None,
        prompt_ids: list[int] | None = None,
        sampling: Sampling | None = None,
        n: int = 1,
        adapter: str = "",
        expected_version: int | None = None,
        timeout_s: float = 300.0,
    ) -> Generation:
        req = rollout_pb2.GenerateRequest(
            pool=pool,
            adapter=adapter,
            sampling=rollout_wire.sampling_to_pb(sampling or Sampling()),
            n=n,
            expected_version=expected_version,
        )
        if messages is not None:
            req.messages.messages.extend(common_pb2.ChatMessage(**m) for m in messages)
        elif prompt_ids is not None:
            req.prompt_token_ids.ids.extend(prompt_ids)
        return rollout_wire.generation_from_pb(
            await self._call(self.stub.Generate, req, timeout_s=timeout_s)
        )

    async def collect(
        self, plan: CollectPlan, timeout_s: float = 3600.0
    ) -> AsyncIterator[Sample | EpisodeEnd]:
        """Run `plan` on this replica: its samples and episode ends as they happen."""
        from grpc import aio

        call = self.stub.Collect(rollout_wire.collect_plan_to_pb(plan), timeout=timeout_s)
        try:
            async for event in call:
                yield rollout_wire.event_from_pb(event)
        except aio.AioRpcError as err:
            raise to_domain_error(err, self.address) from None

    async def weight_dtypes(self) -> dict[str, str]:
        """pool -> the dtype its engine holds weights in: what full weights are cast to before a
        push."""
        return (await self.get_info()).weight_dtypes

    async def load_weights(
        self,
        weights: dict | Payload,
        pool: str,
        version: int,
        *,
        adapter: str = "",
        adapter_config: dict | None = None,
        rollback: bool = False,
        timeout_s: float | None = None,
        retry: bool | None = None,
    ) -> WeightsLoaded:
        """Push `weights` (name -> tensor, or a Payload encoded once for several replicas) as the
        pool's model, or as one adapter of it. `rollback` replaces whatever version is served (a
        trainer restored from a checkpoint). The default deadline grows with the push's size."""
        from atgrpo.contract.weight_payload import Payload

        payload = (
            weights if isinstance(weights, Payload) else await asyncio.to_thread(Payload, weights)
        )
        header = payload.header(pool, version, adapter, adapter_config, rollback)
        timeout_s = timeout_s or PUSH_BASE_S + payload.total_bytes / PUSH_FLOOR_BYTES_PER_S
        # Serialised already (Payload cuts each chunk into its message): gRPC sends the bytes as
        # they are.
        send = self.channel.stream_unary(
            "/atgrpo.v1.RolloutService/LoadWeights",
            request_serializer=None,
            response_deserializer=rollout_pb2.LoadWeightsResponse.FromString,
            _registered_method=True,
        )
        return rollout_wire.loaded_from_pb(
            await self._call(send, lambda: payload.stream(header), timeout_s=timeout_s, retry=retry)
        )


# How long a replica may take to answer before a push that tolerates losses counts it lost (one
# that refuses the connection, or is shutting down, counts at once).
PROBE_S = 5.0


async def push_weights(
    addresses: Sequence[str],
    weights: Sequence[tuple[str, dict, dict | None]],
    pool: str,
    version: int,
    *,
    rollback: bool = False,
) -> int:
    """Push `weights` ((adapter, name -> tensor, adapter config); adapter "" = the full model) to
    every replica at once; the bytes they acknowledged. Full weights are encoded once per dtype
    the replicas hold (cast here, so a bfloat16 engine gets half a float32 master's bytes), each
    encoding streamed to all of its replicas together. Any replica's failure fails the push."""
    sent, _ = await _push(addresses, weights, pool, version, rollback, tolerate_loss=False)
    return sent


async def push_weights_each(
    addresses: Sequence[str],
    weights: Sequence[tuple[str, dict, dict | None]],
    pool: str,
    version: int,
    *,
    rollback: bool = False,
) -> tuple[int, list[str]]:
    """push_weights to a fleet whose replicas may leave at any moment: a replica that does not
    answer within PROBE_S, or whose push breaks off (UNAVAILABLE, DEADLINE_EXCEEDED: gone, killed
    mid-load), is left out and named; any other error fails the push. (bytes acknowledged by
    the others, the replicas lost)."""
    return await _push(addresses, weights, pool, version, rollback, tolerate_loss=True)


async def _push(
    addresses: Sequence[str],
    weights: Sequence[tuple[str, dict, dict | None]],
    pool: str,
    version: int,
    rollback: bool,
    *,
    tolerate_loss: bool,
) -> tuple[int, list[str]]:
    from atgrpo.errors import DeadlineExceeded, Unavailable

    clients = [RolloutClient(a) for a in addresses]
    gone = (Unavailable, DeadlineExceeded) if tolerate_loss else ()
    lost: list[str] = []

    from atgrpo.contract.weight_payload import Payload

    async def encode(dtype: str | None) -> list[tuple[str, Payload, dict | None]]:
        cast = _torch_dtype(dtype)
        return [
            (adapter, await asyncio.to_thread(Payload, tensors, None if adapter else cast), config)
            for adapter, tensors, config in weights
        ]

    async def one(client: RolloutClient, encoded: list[tuple[str, Payload, dict | None]]) -> int:
        sent = 0
        try:
            for adapter, payload, config in encoded:
                resp = await client.load_weights(
                    payload,
                    pool,
                    version,
                    adapter=adapter,
                    adapter_config=config,
                    rollback=rollback,
                    # a replica lost mid-push is resynced when it is listed again, not waited for
                    retry=False if tolerate_loss else None,
                )
                sent += resp.bytes_received
        except gone:
            lost.append(client.address)
            return 0
        return sent

    async def dtype(client: RolloutClient) -> str | None:
        if not tolerate_loss:
            return (await client.weight_dtypes()).get(pool)
        try:
            info = await client.get_info_within(PROBE_S)
        except gone:
            lost.append(client.address)
            return None
        return info.weight_dtypes.get(pool)

    try:
        dtypes = await asyncio.gather(*(dtype(c) for c in clients))
        reached = [(c, d) for c, d in zip(clients, dtypes, strict=True) if c.address not in lost]
        encodings = {d: await encode(d) for d in dict.fromkeys(d for _, d in reached)}
        sent = sum(await asyncio.gather(*(one(c, encodings[d]) for c, d in reached)))
        return sent, [a for a in addresses if a in lost]
    finally:
        await asyncio.gather(*(c.close() for c in clients))


def _torch_dtype(name: str | None):
    """The torch dtype a replica names ("bfloat16"); None (keep the sender's) for one it does
    not."""
    import torch

    dtype = getattr(torch, name, None) if name else None
    return dtype if isinstance(dtype, torch.dtype) else None
