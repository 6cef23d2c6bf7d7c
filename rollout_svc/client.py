"""RolloutClient: Generate, Collect and LoadWeights with plain types (trainers and the router use it)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from atgrpo._proto.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc
from atgrpo.rpc.client import ServiceClient, to_domain_error
from rollout_svc import convert, weights
from rollout_svc.types import Completion, Generation, PolicyRef, Sampling


class RolloutClient(ServiceClient):
    stub_class = rollout_pb2_grpc.RolloutServiceStub

    async def get_info(self) -> rollout_pb2.RolloutInfo:
        return await self._call(self.stub.GetInfo, common_pb2.GetInfoRequest())

    async def policies(self) -> list[PolicyRef]:
        return [convert.policy_from_pb(p) for p in (await self.get_info()).policies]

    async def generate(self, pool: str, *, messages: list[dict] | None = None, prompt_ids: list[int] | None = None,
                       sampling: Sampling | None = None, n: int = 1, adapter: str = "",
                       expected_version: int | None = None, timeout_s: float = 300.0) -> Generation:
        req = rollout_pb2.GenerateRequest(pool=pool, adapter=adapter, sampling=convert.sampling_to_pb(sampling or Sampling()),
                                          n=n, expected_version=expected_version)
        if messages is not None:
            req.messages.messages.extend(common_pb2.ChatMessage(**m) for m in messages)
        elif prompt_ids is not None:
            req.prompt_token_ids.ids.extend(prompt_ids)
        resp = await self._call(self.stub.Generate, req, timeout_s=timeout_s)
        return Generation(list(resp.prompt_token_ids),
                          [Completion(list(c.token_ids), list(c.logprobs), c.text, c.finish_reason)
                           for c in resp.completions],
                          convert.policy_from_pb(resp.policy), resp.prompt_truncated)

    async def collect(self, request: rollout_pb2.CollectRequest,
                      timeout_s: float = 3600.0) -> AsyncIterator[rollout_pb2.CollectEvent]:
        from grpc import aio

        call = self.stub.Collect(request, timeout=timeout_s)
        try:
            async for event in call:
                yield event
        except aio.AioRpcError as err:
            raise to_domain_error(err, self.address) from None

    async def load_weights(self, state: dict, pool: str, version: int, *, adapter: str = "",
                           adapter_config: dict | None = None, rollback: bool = False,
                           timeout_s: float = 600.0) -> rollout_pb2.LoadWeightsResponse:
        """Push `state` (name -> tensor) as the pool's model, or as one adapter of it.
        `rollback` replaces whatever version is served (a trainer restored from a checkpoint)."""
        chunks = weights.encode(state, pool, version, adapter, adapter_config, rollback=rollback)
        return await self._call(self.stub.LoadWeights, lambda: iter(chunks), timeout_s=timeout_s)
