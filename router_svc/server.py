"""RouterService servicer: config in, run status and events out; the loop lives in
router_svc.loop."""

from __future__ import annotations

from collections.abc import AsyncIterator

from grpc import aio

from atgrpo._proto.v1 import common_pb2, router_pb2, router_pb2_grpc
from atgrpo.config import ConfigError, RunConfig, load_yaml_config
from atgrpo.contract import run_wire
from atgrpo.errors import InvalidArgument
from atgrpo.rpc.server import Binding, service_info
from router_svc.runs import Runs


def parse_run_config(text: str) -> RunConfig:
    """INVALID_ARGUMENT listing every config error, and one for a config without service
    addresses."""
    if not text.strip():
        raise InvalidArgument("config_yaml is empty; send the run config's YAML text")
    try:
        cfg = load_yaml_config(text, source="StartRun.config_yaml")
    except ConfigError as err:
        raise InvalidArgument(str(err)) from None
    if cfg.local_mode:
        raise InvalidArgument(
            "the config's services: section is empty, so the router cannot reach the other "
            "services; give their addresses, or run `atgrpo train CONFIG` to start them locally"
        )
    return cfg


class RouterServicer(router_pb2_grpc.RouterServiceServicer):
    def __init__(self, runs: Runs | None = None) -> None:
        self._info = service_info("router")
        self.runs = runs or Runs()

    async def GetInfo(
        self, request: common_pb2.GetInfoRequest, context: aio.ServicerContext
    ) -> common_pb2.ServiceInfo:
        return self._info

    async def StartRun(
        self, request: router_pb2.StartRunRequest, context: aio.ServicerContext
    ) -> router_pb2.RunStatus:
        run = self.runs.start(parse_run_config(request.config_yaml))
        return run_wire.status_to_pb(run.status())

    async def WatchRun(
        self, request: router_pb2.WatchRunRequest, context: aio.ServicerContext
    ) -> AsyncIterator[router_pb2.RunEvent]:
        run = self.runs.get(request.run_id)
        async for event in run.watch(request.from_step):
            yield run_wire.event_to_pb(run.id, event)

    async def StopRun(
        self, request: router_pb2.StopRunRequest, context: aio.ServicerContext
    ) -> router_pb2.RunStatus:
        run = self.runs.get(request.run_id)
        run.stop()
        return run_wire.status_to_pb(run.status())

    async def on_launcher_gone(self) -> None:
        """The `atgrpo train` that started this router is gone (atgrpo/rpc/tether.py): end each run
        after its step in flight, checkpointed, so that a resume loses nothing."""
        await self.runs.stop_all()

    async def GetRun(
        self, request: router_pb2.GetRunRequest, context: aio.ServicerContext
    ) -> router_pb2.RunStatus:
        return run_wire.status_to_pb(self.runs.get(request.run_id).status())


def bindings() -> list[Binding]:
    return [
        Binding(
            "atgrpo.v1.RouterService",
            RouterServicer(),
            router_pb2_grpc.add_RouterServiceServicer_to_server,
        )
    ]
