"""run.keep_checkpoints: which checkpoints stay on disk, worked out by hand, and the router's
pruning against trainers that delete (or fail to)."""

import asyncio
from types import SimpleNamespace

import pytest

from atgrpo.contract.trainer import SavedCheckpoint, TrainerInfo
from atgrpo.errors import Unavailable
from atgrpo.rundir import Checkpoint, RunDir
from router_svc.checkpoints import best, retained
from router_svc.loop import RunLoop
from tests.router.test_run_pieces import config


def ck(step, success=None):
    return Checkpoint(step, {"a": f"/c/step-{step}/a"}, {"a": step}, success)


def steps(cs):
    return [c.step for c in cs]


@pytest.mark.parametrize(
    "successes, keep, kept",
    [
        # no evaluation: the last `keep`
        ({}, 2, [50, 60]),
        # the best (0.9 at step 20) is older than the last two: kept beside them
        ({10: 0.2, 20: 0.9, 30: 0.5, 40: 0.4, 50: 0.6, 60: 0.7}, 2, [20, 50, 60]),
        # the best is among the last: nothing more
        ({10: 0.2, 20: 0.3, 30: 0.5, 40: 0.4, 50: 0.6, 60: 0.8}, 2, [50, 60]),
        # equals: the latest of them is the best (here already kept)
        ({10: 0.5, 20: 0.5, 30: 0.5, 40: 0.5, 50: 0.5, 60: 0.5}, 2, [50, 60]),
        # equals among old ones: the latest of those, 30
        ({10: 0.9, 20: 0.1, 30: 0.9, 40: 0.1, 50: 0.2, 60: 0.3}, 1, [30, 60]),
        # only some were evaluated (eval every 20, checkpoint every 10)
        ({20: 0.7, 40: 0.6, 60: 0.5}, 1, [20, 60]),
        # keep 0: every one
        ({20: 0.7}, 0, [10, 20, 30, 40, 50, 60]),
        # keep more than there are
        ({}, 10, [10, 20, 30, 40, 50, 60]),
    ],
)
def test_retained(successes, keep, kept):
    cs = [ck(s, successes.get(s)) for s in (10, 20, 30, 40, 50, 60)]
    assert steps(retained(cs, keep)) == kept
    # oldest first, whatever the order given
    assert steps(retained(list(reversed(cs)), keep)) == kept


def test_best_is_none_without_an_evaluated_checkpoint():
    assert best([ck(10), ck(20)]) is None and best([]) is None


class Trainer:
    """A trainer that saves and deletes in a dict; `down` makes its deletes fail (a restart)."""

    def __init__(self):
        self.on_disk, self.down = set(), False

    async def save_checkpoint(self, where, timeout_s=None, nbytes=0):
        self.on_disk.add(where)
        return SavedCheckpoint(where, 7)

    async def delete_checkpoint(self, where, nbytes=0):
        if self.down:
            raise Unavailable("trainer restarting")
        gone = where in self.on_disk
        self.on_disk.discard(where)
        return gone

    async def setup(self, spec, *, resume_from="", reload=False, timeout_s=None):
        return TrainerInfo(spec.pool, spec.run_id, 7, checkpoint_bytes=10**9)


def test_the_loop_prunes_after_each_checkpoint_and_retries_a_failed_delete(tmp_path):
    cfg = config(tmp_path, level="L2", keep_checkpoints=2)
    trainer = Trainer()
    loop = RunLoop(cfg, clients=SimpleNamespace(trainers={"a": trainer}))
    d = RunDir(cfg.run.run_dir)

    async def go():
        for step in (1, 2, 3):
            loop.ledger.completed = step
            await loop.checkpoint(step)
        assert steps(d.read_progress().checkpoints) == [2, 3]
        assert trainer.on_disk == {str(d.checkpoint_dir(s) / "a") for s in (2, 3)}
        trainer.down = True
        loop.ledger.completed = 4
        await loop.checkpoint(4)  # the delete of step 2 fails: the run goes on
        assert steps(d.read_progress().checkpoints) == [2, 3, 4]  # still listed, to be tried again
        trainer.down = False
        loop.ledger.completed = 5
        await loop.checkpoint(5)
        assert steps(d.read_progress().checkpoints) == [4, 5]
        assert trainer.on_disk == {str(d.checkpoint_dir(s) / "a") for s in (4, 5)}
        assert d.read_progress().checkpoint.step == 5

    asyncio.run(go())
