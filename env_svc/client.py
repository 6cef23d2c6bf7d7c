"""EnvClient, the env service's client. It is the SDK's (atgrpo.sdk.client), because the same
client talks to env_svc and to an environment served with `atgrpo env serve`; services reach the
env service through this name."""

from atgrpo.sdk.client import EnvClient

__all__ = ["EnvClient"]
