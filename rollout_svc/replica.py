"""A rollout replica's pools and the Generator the tree driver samples through."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from atgrpo._proto.v1 import rollout_pb2
from atgrpo.contract.env import Message
from atgrpo.contract.rollout import AgentPlan, Generation, PolicyRef
from atgrpo.contract.sampling import Sampling
from atgrpo.errors import FailedPrecondition, InvalidArgument, NotFound
from rollout_svc.pool import PoolRuntime
from rollout_svc.weights import FileSink, Sink, TensorSink, WeightPush


def check_prompt(engine, prompt: list[int], sampling: Sampling) -> None:
    """Token ids the model has, and a response budget within its context (engines that say)."""
    vocab = getattr(engine, "vocab_size", None)
    if vocab and (min(prompt) < 0 or max(prompt) >= vocab):
        bad = next(t for t in prompt if not 0 <= t < vocab)
        raise InvalidArgument(
            f"prompt token id {bad} is not in this model's vocabulary [0, {vocab}); "
            "send ids from the pool's own tokenizer"
        )
    context = getattr(engine, "max_model_len", None)
    if context and len(prompt) + sampling.max_tokens > context:
        raise InvalidArgument(
            f"a prompt of {len(prompt)} tokens plus max_tokens {sampling.max_tokens} is over the "
            f"model's context length {context}; send a prompt of at most "
            f"{prompt_budget(engine, sampling)} tokens, or lower max_tokens"
        )


def prompt_budget(engine, sampling: Sampling) -> int:
    """The prompt tokens a request may keep: max_prompt_tokens, or fewer where the engine's context
    leaves less room beside max_tokens of response (the engine would refuse the whole request)."""
    context = getattr(engine, "max_model_len", None)
    if not context:
        return sampling.max_prompt_tokens
    room = context - sampling.max_tokens
    if room < 1:
        raise InvalidArgument(
            f"max_tokens {sampling.max_tokens} leaves no room for a prompt in the model's context "
            f"length {context}; lower max_tokens below {context}"
        )
    return min(sampling.max_prompt_tokens, room) if sampling.max_prompt_tokens > 0 else room


class Replica:
    def __init__(self, pools: dict[str, PoolRuntime]):
        self.pools = pools
        # The chat template is Python (jinja) and tokenizing a 64 MiB message took ~40 s: done on
        # the event loop it stalled every other call, health checks included. One thread, so the
        # tokenizers are never used by two renders at once.
        self._renderer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="render")

    async def render(
        self, pool: str, messages: list[Message], max_prompt_tokens: int, tools: list | None = None
    ) -> tuple[list[int], bool]:
        """Prompt ids of `messages` (and `tools`, OpenAI function definitions, for templates that
        render them) through the pool's chat template, off the event loop."""
        engine = self.pool(pool).engine
        extra = {"tools": tools} if tools else {}
        return await asyncio.get_running_loop().run_in_executor(
            self._renderer, functools.partial(engine.render, messages, max_prompt_tokens, **extra)
        )

    async def tokenize(self, pool: str, text: str) -> list[int]:
        """Prompt ids of plain `text` (no chat template; the tokenizer's own special tokens, as
        vLLM's completions add them), off the event loop like render."""
        tokenizer = self.pool(pool).engine.tokenizer
        return await asyncio.get_running_loop().run_in_executor(
            self._renderer, lambda: list(tokenizer.encode(text, add_special_tokens=True))
        )

    def prompt_budget(self, pool: str, sampling: Sampling) -> int:
        """What a prompt for `pool` is cut to: see prompt_budget()."""
        return prompt_budget(self.pool(pool).engine, sampling)

    def routed(
        self, pool_addresses: dict[str, str], expected: Sequence[PolicyRef] = ()
    ) -> RoutedGenerator:
        """The tree driver's Generator for one Collect: local pools here, the others remote
        (pinned to the `expected` versions there too)."""
        return RoutedGenerator(self, pool_addresses, expected)

    def pool(self, name: str) -> PoolRuntime:
        if name not in self.pools:
            raise NotFound(
                f"this replica serves no pool {name!r}; it serves {sorted(self.pools) or 'none'}"
            )
        return self.pools[name]

    def policies(self) -> list[PolicyRef]:
        return [p for pool in self.pools.values() for p in pool.policies()]

    def check_versions(self, expected: Sequence[PolicyRef]) -> None:
        """FAILED_PRECONDITION unless this replica serves every `expected` policy at its version
        (a restarted replica serves its initial weights and no adapters): the caller brings it up
        to date (the router has the trainer push) and asks again."""
        for want in expected:
            have = self.pool(want.pool).versions.get(want.adapter)
            if have != want.version:
                what = f"{want.pool}/{want.adapter}" if want.adapter else want.pool
                held = f"is at version {have}" if have is not None else "has not been loaded"
                raise FailedPrecondition(
                    f"{what} {held} here, not version {want.version}: this replica's weights "
                    "are not the run's (not pushed yet, or it restarted); push them, then retry"
                )

    async def generate_prompt(
        self,
        pool: str,
        adapter: str,
        prompt: list[int],
        sampling: Sampling,
        n: int,
        truncated: bool = False,
    ) -> Generation:
        if not prompt:
            raise InvalidArgument("the prompt is empty")
        if not 1 <= n <= 1024:
            raise InvalidArgument(f"n={n} must be between 1 and 1024")
        runtime = self.pool(pool)
        check_prompt(runtime.engine, prompt, sampling)
        generation = await runtime.generate(adapter, prompt, sampling, n)
        generation.prompt_truncated = truncated
        generation.prompt_text = self.prompt_text(pool, prompt)
        return generation

    async def generate(self, agent: AgentPlan, messages: list[Message], n: int) -> Generation:
        """The tree driver's Generator: render with the pool's chat template, then sample."""
        ids, truncated = await self.render(
            agent.pool, messages, self.prompt_budget(agent.pool, agent.sampling)
        )
        return await self.generate_prompt(
            agent.pool, agent.adapter, ids, agent.sampling, n, truncated
        )

    def prompt_text(self, pool: str, ids: list[int]) -> str:
        """`ids` as text, special tokens included (what the model saw, for saved samples); "" from
        an engine without a tokenizer. Decoding a prompt takes well under a millisecond."""
        tokenizer = getattr(self.pool(pool).engine, "tokenizer", None)
        return tokenizer.decode(ids, skip_special_tokens=False) if tokenizer is not None else ""

    def weight_dtypes(self) -> dict[str, str]:
        """pool -> the dtype its engine holds weights in, for engines that say."""
        dtypes = {name: getattr(p.engine, "weight_dtype", None) for name, p in self.pools.items()}
        return {name: str(d).removeprefix("torch.") for name, d in dtypes.items() if d is not None}

    def sink(self, header: rollout_pb2.WeightHeader) -> Sink:
        """Where a push's bytes go as they arrive: a file for an engine that reloads full weights
        from disk (vLLM), else tensors. An unknown pool, or full weights for a LoRA pool, is
        refused here, before any byte is taken."""
        runtime = self.pool(header.pool)
        # the swap checks again, in order
        runtime.check_newer(header.adapter, header.version, header.rollback)
        if header.adapter:
            return TensorSink(header.total_bytes)
        if runtime.lora:
            raise InvalidArgument(
                f"pool {header.pool!r} is LoRA-specialised: push adapters (header.adapter), "
                "not the full model"
            )
        new_file = getattr(runtime.engine, "weights_file", None)
        if new_file is None:
            return TensorSink(header.total_bytes, runtime.staging.take)
        path = new_file()
        return FileSink(path, directory=path.parent)

    async def load(self, push: WeightPush) -> None:
        runtime = self.pool(push.pool)
        engine = runtime.engine
        if push.adapter:
            apply = lambda: engine.load_adapter(push.adapter, push.adapter_config, push.state)  # noqa: E731
        elif push.path is not None:
            apply = lambda: engine.load_full_file(push.path)  # noqa: E731
        else:
            apply = lambda: engine.load_full(push.state)  # noqa: E731
        try:
            await runtime.swap(push.adapter, push.version, apply, rollback=push.rollback)
        except (RuntimeError, ValueError, KeyError) as err:  # names or shapes that do not fit
            raise InvalidArgument(
                f"the weights do not fit pool {push.pool!r}: {err}; nothing changed"
            ) from None
        finally:
            # a refused push leaves no file behind; a loaded one replaced the last
            if push.path is not None:
                engine.prune_weights()
            if not push.adapter:
                push.state = None  # the tensors left are the engine's, if it adopted them
                runtime.staging.served(push.buffer)


class RoutedGenerator:
    """Generates locally for the pools this replica serves and through another replica's
    Generate for the rest, so one episode can mix agents of pools on different replicas (L3)."""

    def __init__(
        self, replica: Replica, pool_addresses: dict[str, str], expected: Sequence[PolicyRef] = ()
    ):
        self.replica, self.pool_addresses = replica, pool_addresses
        self.expected = {(p.pool, p.adapter): p.version for p in expected}
        self._clients: dict[str, object] = {}

    async def generate(self, agent: AgentPlan, messages: list[Message], n: int) -> Generation:
        if agent.pool in self.replica.pools or agent.pool not in self.pool_addresses:
            return await self.replica.generate(agent, messages, n)
        from rollout_svc.client import RolloutClient

        address = self.pool_addresses[agent.pool]
        if address not in self._clients:
            self._clients[address] = RolloutClient(address)
        return await self._clients[address].generate(
            agent.pool,
            adapter=agent.adapter,
            messages=messages,
            sampling=agent.sampling,
            n=n,
            expected_version=self.expected.get((agent.pool, agent.adapter)),
        )

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
