"""Live episodes: a bounded store with a time-to-live for abandoned ones.

Tree sampling forks every episode K ways per agent per turn, so a crashed or careless client can
leave thousands behind; the cap turns that into RESOURCE_EXHAUSTED instead of memory exhaustion,
and the TTL reclaims what nobody touches.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from dataclasses import dataclass, field

from atgrpo.errors import NotFound, ResourceExhausted
from atgrpo.sdk import metrics
from atgrpo.sdk.env import Environment

log = logging.getLogger(__name__)


@dataclass
class Episode:
    id: str
    env_name: str
    env: Environment
    turn: int = 0  # completed rounds of the turn order
    acted: set[str] = field(default_factory=set)  # agents that acted in the current turn
    done: bool = False
    last_used: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def advance(self, agent: str) -> int:
        """Record that `agent` acted; returns the turn the action belonged to."""
        turn = self.turn
        self.acted.add(agent)
        if self.acted >= set(self.env.spec.turn_order):
            self.turn += 1
            self.acted = set()
        return turn

    def skip(self, agent: str) -> None:
        """`agent` does not act this turn (its observe was empty): it counts as done for the turn,
        so a turn whose agents all acted or skipped ends, and max_turns still ends the episode."""
        self.advance(agent)
        self.done = self.done or self.turn >= self.env.spec.max_turns


def _closed(episode: Episode) -> None:
    """Let the env release what it holds (a program env stops its program); never raises. An env
    written against an SDK without close() (or duck-typed, not an Environment) has nothing to
    release."""
    close = getattr(episode.env, "close", None)
    if close is None:
        return
    try:
        close()
    except Exception:  # noqa: BLE001 - an env's close bug must not keep the episode alive
        log.exception("env %r: close() raised", episode.env_name)


class EpisodeStore:
    def __init__(self, max_episodes: int = 10_000, ttl_s: float = 900.0):
        self.max_episodes, self.ttl_s = max_episodes, ttl_s
        self._episodes: dict[str, Episode] = {}
        # Ids unique across restarts of this process too, so a stale id never names a new episode.
        self._ids = (f"{os.getpid():x}-{int(time.time()):x}-{i:x}" for i in itertools.count())
        metrics.track_store(self)

    def __len__(self) -> int:
        return len(self._episodes)

    def expire(self, now: float | None = None) -> int:
        now = time.monotonic() if now is None else now
        stale = [
            k
            for k, e in self._episodes.items()
            if now - e.last_used > self.ttl_s and not e.lock.locked()
        ]
        for k in stale:
            _closed(self._episodes.pop(k))
        return len(stale)

    def add(
        self,
        env_name: str,
        env: Environment,
        *,
        turn: int = 0,
        acted: set[str] | None = None,
        count: int = 1,
    ) -> list[Episode]:
        """Store `count` episodes (a reset, or the copies of a fork) or none at all."""
        if len(self._episodes) + count > self.max_episodes:
            self.expire()
            if len(self._episodes) + count > self.max_episodes:
                raise ResourceExhausted(
                    f"{len(self._episodes)} live episodes, the cap is {self.max_episodes}; close "
                    f"finished "
                    "episodes (Close) or retry later when abandoned ones expire",
                    retry_after_ms=1000,
                )
        new = [
            Episode(
                next(self._ids), env_name, env if i == 0 else env.fork(), turn, set(acted or ())
            )
            for i in range(count)
        ]
        for e in new:
            self._episodes[e.id] = e
        return new

    def get(self, episode_id: str) -> Episode:
        episode = self._episodes.get(episode_id)
        if episode is None:
            raise NotFound(
                f"no live episode {episode_id!r}: it was closed, expired after "
                f"{self.ttl_s:.0f} s unused, or never existed; Reset a new one"
            )
        episode.last_used = time.monotonic()
        return episode

    def remove(self, episode_ids: list[str]) -> int:
        gone = [e for e in (self._episodes.pop(i, None) for i in episode_ids) if e is not None]
        for episode in gone:
            _closed(episode)
        return len(gone)
