"""The rollout replicas of each pool as they come and go during a run (issue 39, item 1).

A pool's replicas are named in the run config by static addresses, a `dns:///` name (a headless
Service: one record per ready pod) or a `file://` list (local mode: `atgrpo scale` rewrites it);
atgrpo.discovery expands them. The fleet keeps, per pool, which listed replicas *serve the run's
current weights*, and only those are given work:

- a replica that appears is handed to the pool's trainer (a repeated Setup with the new list),
  which pushes it the pool's current weights (full or every adapter, at the pinned version) and
  answers with the replicas that hold them; one killed during that load is simply not among them.
  While the pool has ready replicas this runs beside the step (the joiner takes work from the
  next one); a pool with none waits for it;
- a replica that leaves the list, or breaks off a Collect (router_svc.dispatch), is dropped at
  once, and given work again only after the trainer has synced it anew;
- a listed replica the trainer could not sync is retried after `retry_s` (a pod whose DNS
  record outlives it would otherwise cost a probe every step).

A frozen pool (no trainer) serves its model_path from the start: every listed replica is ready.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

from atgrpo.contract.address import DNS_SCHEME
from atgrpo.discovery import Lookup, ReplicaResolver, system_lookup
from atgrpo.errors import Unavailable
from rollout_svc.client import RolloutClient

log = logging.getLogger("atgrpo.router")

# pool, the replicas listed now -> the replicas among them that hold the pool's current weights
Sync = Callable[[str, list[str]], Awaitable[list[str]]]

WAIT_S = 300.0  # how long a step waits for a pool with no ready replica before it fails


class Fleet:
    def __init__(
        self,
        rollout: Mapping[str, Sequence[str]],
        trainable: Sequence[str],
        *,
        lookup: Lookup = system_lookup,
        retry_s: float = 5.0,
        wait_s: float = WAIT_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.pools = list(rollout)
        self.trainable = set(trainable)
        self._resolvers = {
            # a file is read afresh each time (cheap); DNS answers are kept for their TTL
            p: ReplicaResolver(
                targets,
                lookup=lookup,
                ttl_s=5.0 if any(t.startswith(DNS_SCHEME) for t in targets) else 0.0,
            )
            for p, targets in rollout.items()
        }
        self.retry_s, self.wait_s, self._clock = retry_s, wait_s, clock
        self.given: dict[str, tuple[str, ...]] = {}  # pool -> the list its trainer last got
        self.ready: dict[str, list[str]] = {p: [] for p in self.pools}
        self._synced_at: dict[str, float] = {}
        self._clients: dict[str, RolloutClient] = {}
        self._lost_at: dict[str, float] = {}
        self._syncing: dict[str, asyncio.Task] = {}  # pool -> its sync running behind a step

    async def listed(self) -> dict[str, list[str]]:
        """Every pool's replicas as the discovery lists them now."""
        return {p: await r.current() for p, r in self._resolvers.items()}

    def synced(self, pool: str, given: Sequence[str], holding: Sequence[str]) -> None:
        """The pool's trainer was given `given` and answered that `holding` serve its weights."""
        before = set(self.ready[pool])
        self.given[pool] = tuple(given)
        self.ready[pool] = [a for a in given if a in set(holding)]
        self._synced_at[pool] = self._clock()
        joined, left = set(self.ready[pool]) - before, before - set(self.ready[pool])
        if before and (joined or left):
            log.info(
                "pool %s: replicas %s joined, %s left; %d serve",
                pool,
                sorted(joined),
                sorted(left),
                len(self.ready[pool]),
            )

    async def refresh(self, sync: Sync) -> dict[str, list[str]]:
        """The replicas to give work now, per pool, after syncing those that joined. Waits up to
        wait_s for a pool without any; Unavailable after that."""
        deadline = self._clock() + self.wait_s
        while True:
            listed = await self.listed()
            for pool, now in listed.items():
                if pool not in self.trainable:  # no weights to sync: a lost one rests retry_s
                    self.ready[pool] = [a for a in now if not self._resting(a)]
                    continue
                self._raise_failed_sync(pool)
                self.ready[pool] = [a for a in self.ready[pool] if a in set(now)]  # gone: out
                if not self._needs_sync(pool, now):
                    continue
                if self.ready[pool]:  # work goes on; the joiners take work once synced
                    self._sync_behind(pool, now, sync)
                else:
                    await self._sync(pool, now, sync)
            empty = [p for p in self.pools if not self.ready[p]]
            if not empty:
                return {p: list(self.ready[p]) for p in self.pools}
            if self._clock() >= deadline:
                raise Unavailable(
                    f"no rollout replica of pool(s) {empty} serves the run's weights after "
                    f"{self.wait_s:g} s (listed: { {p: listed[p] for p in empty} }). Start "
                    "replicas (`atgrpo scale POOL N --run-dir DIR` locally; on Kubernetes check "
                    "`kubectl get pods -l app.kubernetes.io/component=rollout`)"
                )
            await asyncio.sleep(1.0)

    async def _sync(self, pool: str, listed: list[str], sync: Sync) -> None:
        self._synced_at[pool] = self._clock()
        self.synced(pool, listed, await sync(pool, listed))

    def _sync_behind(self, pool: str, listed: list[str], sync: Sync) -> None:
        """Sync while the step collects on the replicas that are ready: a joiner's weight load
        (or a listed replica that does not answer, up to PROBE_S) delays no step."""
        running = self._syncing.get(pool)
        if running is None or running.done():
            self._synced_at[pool] = self._clock()
            self._syncing[pool] = asyncio.create_task(self._sync(pool, listed, sync))

    def _raise_failed_sync(self, pool: str) -> None:
        """A sync that failed in the background fails the next collection (the loop recovers)."""
        done = self._syncing.get(pool)
        if done is not None and done.done():
            del self._syncing[pool]
            if not done.cancelled() and done.exception() is not None:
                raise done.exception()

    def _needs_sync(self, pool: str, listed: list[str]) -> bool:
        if tuple(listed) != self.given.get(pool):
            return True
        unsynced = set(listed) - set(self.ready[pool])
        return bool(unsynced) and self._clock() - self._synced_at.get(pool, 0.0) >= self.retry_s

    def _resting(self, address: str) -> bool:
        at = self._lost_at.get(address)
        return at is not None and self._clock() - at < self.retry_s

    def lost(self, address: str) -> None:
        """A replica broke off mid-work: no more work until the trainer has synced it again."""
        self._lost_at[address] = self._clock()
        for pool, ready in self.ready.items():
            if address in ready:
                ready.remove(address)
                log.warning(
                    "pool %s: replica %s lost; its unfinished tasks go elsewhere", pool, address
                )

    def client(self, address: str) -> RolloutClient:
        if address not in self._clients:
            self._clients[address] = RolloutClient(address)
        return self._clients[address]

    async def close(self) -> None:
        for t in self._syncing.values():
            t.cancel()
        await asyncio.gather(*self._syncing.values(), return_exceptions=True)
        await asyncio.gather(*(c.close() for c in self._clients.values()))
        self._clients.clear()
