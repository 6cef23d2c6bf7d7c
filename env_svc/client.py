"""The env service's client is the SDK's: it talks to env_svc and to served environments alike."""

from atgrpo.sdk.client import EnvClient

__all__ = ["EnvClient"]
