"""A Setup that only hands over the pool's replicas (router_svc.fleet) never sets a trainer up:
a trainer that restarted refuses it, so a call retried across the restart cannot restore it from
some checkpoint behind the router's back (the router's recovery does that, knowing which)."""

from __future__ import annotations

import asyncio

import pytest

from atgrpo.contract.trainer import PoolSpec
from atgrpo.errors import FailedPrecondition
from trainer_svc.trainer import Trainer


def test_a_trainer_without_the_run_refuses_a_replica_handover():
    spec = PoolSpec("run", "a", "/nowhere", ("speaker",), rollout_addresses=("127.0.0.1:1",))
    trainer = Trainer("a")
    with pytest.raises(FailedPrecondition, match="it restarted"):
        asyncio.run(trainer.setup(spec, replicas_only=True))
    assert trainer.state is None  # nothing was loaded (model_path does not even exist)
