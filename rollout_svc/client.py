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

    async def policies(self) -> tuple[PolicyRef, ...]:
        return (await self.get_info()).policies

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
            await self._call(send, lambda: payload.stream(header), timeout_s=timeout_s)
        )


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
    encoding streamed to all of its replicas together."""
    clients = [RolloutClient(a) for a in addresses]

    from atgrpo.contract.weight_payload import Payload

    async def encode(dtype: str | None) -> list[tuple[str, Payload, dict | None]]:
        cast = _torch_dtype(dtype)
        return [
            (adapter, await asyncio.to_thread(Payload, tensors, None if adapter else cast), config)
            for adapter, tensors, config in weights
        ]

    async def one(client: RolloutClient, encoded: list[tuple[str, Payload, dict | None]]) -> int:
        sent = 0
        for adapter, payload, config in encoded:
            resp = await client.load_weights(
                payload, pool, version, adapter=adapter, adapter_config=config, rollback=rollback
            )
            sent += resp.bytes_received
        return sent

    try:
        dtypes = [(await c.weight_dtypes()).get(pool) for c in clients]
        encodings = {d: await encode(d) for d in dict.fromkeys(dtypes)}
        return sum(
            await asyncio.gather(
                *(one(c, encodings[d]) for c, d in zip(clients, dtypes, strict=True))
            )
        )
    finally:
        await asyncio.gather(*(c.close() for c in clients))


def _torch_dtype(name: str | None):
    """The torch dtype a replica names ("bfloat16"); None (keep the sender's) for one it does
    not."""
    import torch

    dtype = getattr(torch, name, None) if name else None
    return dtype if isinstance(dtype, torch.dtype) else None
