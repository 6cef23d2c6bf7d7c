"""RouterService servicer: config in, run status and events out; the loop lives in router_svc.run."""

from __future__ import annotations

from atgrpo._proto.v1 import router_pb2_grpc
from atgrpo.config import ConfigError, RunConfig, load_yaml_config
from atgrpo.errors import InvalidArgument
from atgrpo.rpc.server import Binding, service_info
from router_svc import events
from router_svc.runs import Runs


def parse_run_config(text: str) -> RunConfig:
    """INVALID_ARGUMENT listing every config error, and one for a config without service addresses."""
    if not text.strip():
        raise InvalidArgument("config_yaml is empty; send the run config's YAML text")
    try:
        cfg = load_yaml_config(text, source="StartRun.config_yaml")
    except ConfigError as err:
        raise InvalidArgument(str(err)) from None
    if cfg.local_mode:
        raise InvalidArgument("the config's services: section is empty, so the router cannot reach the other "
                              "services; give their addresses, or run `atgrpo train CONFIG` to start them locally")
    return cfg


class RouterServicer(router_pb2_grpc.RouterServiceServicer):
    def __init__(self, runs: Runs | None = None) -> None:
        self._info = service_info("router")
        self.runs = runs or Runs()

    async def GetInfo(self, request, context):
        return self._info

    async def StartRun(self, request, context):
        run = self.runs.start(parse_run_config(request.config_yaml))
        return events.status_to_pb(run.status())

    async def WatchRun(self, request, context):
        run = self.runs.get(request.run_id)
        async for event in run.watch(request.from_step):
            yield events.to_pb(run.id, event)

    async def StopRun(self, request, context):
        run = self.runs.get(request.run_id)
        run.stop()
        return events.status_to_pb(run.status())

    async def GetRun(self, request, context):
        return events.status_to_pb(self.runs.get(request.run_id).status())


def bindings(args=None) -> list[Binding]:
    return [Binding("atgrpo.v1.RouterService", RouterServicer(),
                    router_pb2_grpc.add_RouterServiceServicer_to_server)]
