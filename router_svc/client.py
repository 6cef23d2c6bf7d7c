"""RouterClient: start, watch, stop and query runs (the CLI's way to drive training)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from atgrpo._proto.v1 import router_pb2, router_pb2_grpc
from atgrpo.contract import run_wire
from atgrpo.rpc.client import ServiceClient, to_domain_error


class RouterClient(ServiceClient):
    stub_class = router_pb2_grpc.RouterServiceStub

    async def start_run(self, config_yaml: str) -> dict[str, Any]:
        resp = await self._call(
            self.stub.StartRun, router_pb2.StartRunRequest(config_yaml=config_yaml)
        )
        return run_wire.status_from_pb(resp)

    async def stop_run(self, run_id: str, reason: str = "") -> dict[str, Any]:
        resp = await self._call(
            self.stub.StopRun, router_pb2.StopRunRequest(run_id=run_id, reason=reason)
        )
        return run_wire.status_from_pb(resp)

    async def get_run(self, run_id: str) -> dict[str, Any]:
        return run_wire.status_from_pb(
            await self._call(self.stub.GetRun, router_pb2.GetRunRequest(run_id=run_id))
        )

    async def watch_run(self, run_id: str, from_step: int = 0) -> AsyncIterator[dict[str, Any]]:
        """Event dicts (atgrpo.contract.run) until the run ends; no deadline, a run lasts days."""
        from grpc import aio

        call = self.stub.WatchRun(router_pb2.WatchRunRequest(run_id=run_id, from_step=from_step))
        try:
            async for event in call:
                yield run_wire.event_from_pb(event)
        except aio.AioRpcError as err:
            raise to_domain_error(err, self.address) from None
