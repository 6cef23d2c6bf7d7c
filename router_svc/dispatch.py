"""One collection plan spread over the replicas that are there, by their queues, surviving the
loss of any of them (issue 39, item 1).

    queue   = the plan's tasks
    cap     = ceil(tasks / replicas): what today's even split runs at once on each replica (the
              replica's engine batches all of them, so fewer at a time would be slower)
    while tasks are queued and a replica is below cap:
        chunk = ceil(queued / (2 * replicas)) tasks (guided self-scheduling: big chunks first,
                small ones last, so the tail evens out) to the replica with the fewest unfinished
    a task is done when its EpisodeEnd arrives; its samples (streamed just before it) with it
    a replica whose stream breaks off (UNAVAILABLE, DEADLINE_EXCEEDED: gone, killed, scaled
    down) is reported lost; the samples of its unfinished tasks are dropped and the tasks queued
    again, for the others: each task is kept from exactly one complete episode

Any other error fails the collection as before (the loop redoes the step). No gRPC here: the
caller gives `stream(address, plan)`, so the rule can be pinned with scripted streams.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import replace

from atgrpo.contract.rollout import CollectPlan, EpisodeEnd, Sample, TaskRef
from atgrpo.errors import DeadlineExceeded, Internal, Unavailable

Stream = Callable[[str, CollectPlan], AsyncIterator[Sample | EpisodeEnd]]

# what a replica that is gone (or goes mid-stream) answers
LOST = (Unavailable, DeadlineExceeded)


def routes_for(address: str, rollout: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """Where a replica sends the generations of pools it does not serve (L3: each pool's replicas
    are their own processes): the i-th replica of its pool to the i-th (mod count) of each other,
    so cross-pool traffic is spread too."""
    served = [p for p, addrs in rollout.items() if address in addrs]
    i = list(rollout[served[0]]).index(address) if served else 0
    return {p: addrs[i % len(addrs)] for p, addrs in rollout.items() if p not in served and addrs}


def chunk_size(queued: int, replicas: int) -> int:
    return max(1, math.ceil(queued / (2 * max(1, replicas))))


class Dispatch:
    """One plan's collection over `rollout` (pool -> replicas serving it now)."""

    def __init__(
        self,
        plan: CollectPlan,
        rollout: Mapping[str, Sequence[str]],
        stream: Stream,
        on_lost: Callable[[str], None] = lambda address: None,
    ):
        self.plan, self.rollout, self.stream, self.on_lost = plan, rollout, stream, on_lost
        self.alive = list(dict.fromkeys(a for addrs in rollout.values() for a in addrs))
        self.index = {a: float(i) for i, a in enumerate(self.alive)}  # timing's "replica"
        if not self.alive:
            raise Unavailable("no rollout replica to collect with")
        self.queue: deque[TaskRef] = deque(plan.tasks)
        self.cap = math.ceil(len(plan.tasks) / len(self.alive))
        self.unfinished = dict.fromkeys(self.alive, 0)
        self.samples: list[Sample] = []
        self.ends: list[EpisodeEnd] = []
        self.requeued = 0  # tasks collected again after their replica was lost
        self.chunks: list[tuple[str, int]] = []  # (replica, tasks) in the order sent
        self._running: set[asyncio.Task] = set()

    async def run(self) -> tuple[list[Sample], list[EpisodeEnd]]:
        try:
            self._launch()
            while self._running:
                done, _ = await asyncio.wait(self._running, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    self._running.discard(t)
                    t.result()  # a fault other than a lost replica fails the collection
                self._launch()
            if self.queue:
                raise Unavailable(
                    f"every rollout replica was lost with {len(self.queue)} tasks of step "
                    f"{self.plan.step} left; the step is collected again once replicas are back"
                )
            return self.samples, self.ends
        finally:
            for t in self._running:
                t.cancel()
            await asyncio.gather(*self._running, return_exceptions=True)

    def _launch(self) -> None:
        while self.queue:
            room = [a for a in self.alive if self.unfinished[a] < self.cap]
            if not room:
                return
            address = min(room, key=lambda a: self.unfinished[a])  # the shortest queue
            n = min(
                self.cap - self.unfinished[address],
                chunk_size(len(self.queue), len(self.alive)),
                len(self.queue),
            )
            tasks = [self.queue.popleft() for _ in range(n)]
            self.unfinished[address] += n
            self.chunks.append((address, n))
            self._running.add(asyncio.create_task(self._one(address, tasks)))

    async def _one(self, address: str, tasks: list[TaskRef]) -> None:
        part = replace(
            self.plan,
            tasks=tuple(tasks),
            pool_addresses=routes_for(address, self.rollout),
            max_concurrent_tasks=len(tasks),
        )
        pending = list(tasks)
        buffer: list[Sample] = []  # the samples of the task whose EpisodeEnd comes next
        try:
            async for event in self.stream(address, part):
                if isinstance(event, Sample):
                    buffer.append(event)
                    continue
                pending.remove(_ended(pending, event, buffer))
                self.samples += buffer
                if event.timing:  # which replica's model served it (events.timing_fields)
                    event = replace(event, timing={**event.timing, "replica": self.index[address]})
                self.ends.append(event)
                buffer = []
                self.unfinished[address] -= 1
        except LOST:
            self._lose(address, pending)
            return
        if pending:
            raise Internal(
                f"replica {address} ended its Collect with {len(pending)} of {len(tasks)} tasks "
                "unreported; the step is collected again"
            )

    def _lose(self, address: str, pending: list[TaskRef]) -> None:
        if address in self.alive:
            self.alive.remove(address)
            self.on_lost(address)
        self.unfinished[address] -= len(pending)
        self.requeued += len(pending)
        self.queue.extendleft(reversed(pending))
        if self.alive:  # the survivors take the lost one's share at once
            left = sum(self.unfinished.values()) + len(self.queue)
            self.cap = max(self.cap, math.ceil(left / len(self.alive)))


def _ended(pending: list[TaskRef], end: EpisodeEnd, samples: list[Sample]) -> TaskRef:
    """The pending task an EpisodeEnd closes: by task id, and by the episode its samples carry
    when a step holds the same task twice."""
    episodes = {s.episode for s in samples if s.task_id == end.task_id}
    same = [t for t in pending if t.task_id == end.task_id]
    for t in same:
        if t.episode in episodes:
            return t
    if not same:
        raise Internal(f"an EpisodeEnd for task {end.task_id!r}, which this Collect did not send")
    return same[0]
