"""`toy`: a two-agent relay that a tiny, randomly initialised model learns on CPU in minutes.

**The task.** Each episode has a secret drawn from a small alphabet (option ``symbols``, default
the four digits ``"1234"``). Two agents act in turn order ``("speaker", "listener")``, sequentially:

* the **speaker** sees the secret (prompt ``speaker: the secret is 3``) and writes a message;
* the **listener** sees only that message (prompt ``listener: the speaker says: <message>``, the
  message cut to ``max_message_chars``) and must answer the secret.

A text *names* the alphabet symbol that occurs first in it (``"x3y1"`` names ``3``; a text naming
none is malformed); parsing is lenient but deterministic. The episode succeeds, and is done, when
the listener names the secret. A wrong answer is retried while turns remain (``max_turns``,
default 2): the speaker's next prompt is ``speaker: the listener said 2, wrong. the secret is 3``
and both act again. After ``max_turns`` wrong answers the episode is done, unsolved.

**Rewards** (each step; training mixes them as ``alpha * team + local``):

| acting agent | its text                                            | team | local |
|--------------|-----------------------------------------------------|------|-------|
| speaker      | names the secret (in the part the listener is shown) | 0    | 0.5   |
| speaker      | ... and is exactly the secret, nothing else          | 0    | 0.6   |
| listener     | names the secret: done, success                      | 1.0  | 0     |
| listener     | ... and is exactly the secret, nothing else          | 1.0  | 0.1   |
| either       | names a wrong symbol                                 | 0    | 0     |
| either       | is empty or names no symbol (info ``parse_error``)   | 0    | 0     |

The speaker's team reward is 0: nothing is solved until the listener answers. Every step's info
has ``symbol`` (the symbol named, or None), ``clean`` (the text is exactly one symbol) and
``secret``; the listener's also has ``heard`` (the symbol the message it read named); a speaker
message longer than ``max_message_chars`` has ``truncated``.

**Neither agent can succeed alone.** Only the listener's answer solves the task, and only the
speaker sees the secret: after a message that names no symbol or a wrong one, the listener names
the secret by luck only (1 in ``len(symbols)`` per turn for a blind guess), and a listener that
repeats what it heard is then wrong for certain.

**Why a tiny random model learns it.** The default symbols are digits. Qwen2's pre-tokenizer
splits every digit into its own token, so in the tiny model's 1,536-token vocabulary each digit
is one token and no other token contains a digit: a text names a symbol exactly when the model
sampled that symbol's token, and ``"3"`` is one token (two with the end-of-turn token). Both roles
need the same one-token skill, "repeat the digit that ends the prompt" (every prompt ends with
the symbol to repeat; prompts are 20-37 tokens), so a shared policy (L1) learns it from both
roles' samples. Only the *right* symbol pays: in probes (a minimal AT-GRPO loop, below, all with
``max_turns=1``), extra local rewards for naming any symbol (format, 0.05-0.1) or for the
listener's repeating the speaker (0.3) let the shared policy collapse onto one or two constant
symbols, stuck at 0.23-0.54 sampled success in 7 of 8 runs, against 0.39-0.79 (greedy 0.79-1.0)
with this table. Retries help more: a second turn gives extra samples of exactly the secrets the
policy still gets wrong, from a new prompt, which kept the policy from settling on a code that
merges two secrets (every ``max_turns=2`` run reached 1.0).

Probe (a script outside the repository): L1 shared full fine-tune of the tiny model (seed 0),
tree sampling with K = 8, 16 tasks per step, temperature 1, at most 4 new tokens, AdamW lr 5e-4,
GRPO advantages with std, one update per step, default options. Over 4 seeds, first-turn sampled
success went from 0 to 0.59-0.98 by step 480 and to 0.99-1.0 by step ~560 (greedy and sampled),
3-4 minutes of that bare loop on one core. With ``max_turns=1`` (3 seeds) it ended at 0.39-0.79
sampled success after 530-2,400 steps. Longer responses slow learning down (at 8 new tokens,
``max_turns=1``, it was still at chance after 500 steps: the junk tokens around the digit dilute
the signal), and so does a small learning rate (at lr 1e-5 nothing is learnt in minutes).

**What a random policy scores.** The same tiny model through ``transformers`` ``generate`` with
the chat template, temperature 1 (no top-k/top-p), flat rollouts (one sample per agent-turn),
default options, 2,000 episodes (seed ``i`` for episode ``i``):

| max new tokens                             | 4             | 8             | 64            |
|--------------------------------------------|---------------|---------------|---------------|
| success (2 turns)                          | 0.005         | 0.011         | 0.065         |
| turn-1 success                             | 0.002         | 0.006         | 0.034         |
| speaker local                              | 0.0024        | 0.0034        | 0.0065        |
| listener team                              | 0.0028        | 0.0055        | 0.0328        |
| texts naming a symbol (speaker / listener) | 0.013 / 0.012 | 0.024 / 0.021 | 0.041 / 0.156 |

(means per step; the listener's local reward was 0 throughout: a random text is never exactly one
symbol; the speaker's naming rate at 64 tokens is lower than the listener's because only its
first 48 characters count). A blind listener would succeed 0.25 per turn; the random model is far
below that because it rarely emits a digit at all.

Each sampled token is a given digit with probability ~1/1536, so the first rewards are rare per
sample; over K = 8 branches and 16 tasks (256+ samples) a step, a few of them are there from the
start, and the tree's selection passes a speaker branch that names the secret, when one does, on
to the listener.

**A code (option ``code``).** With ``code: "5678"`` the speaker must name the code symbol of
the secret (secret ``3`` -> ``7``: same position) and the listener must decode it back to ``3``.
The two roles then need different skills (encode, decode) and see different inputs, which is
what the swap ablation needs: a speaker running the listener's weights answers in the wrong
alphabet, so swapping the roles' adapters breaks the relay. The tiny model learns the code slowly
from scratch: telling four secrets apart at the end of the prompt took it several hundred steps in
probes. Taught the code's pairs first (secret 3 -> "3" or "7" at random, for either role), each
role's adapter learns its direction in 40 steps (``tests/e2e``: greedy success 1.0, swapped 0.0).

**Alone (L0).** With option ``turn_order: [speaker]`` (the router sets it from the run config)
the speaker acts alone and its own answer is judged: naming the secret solves the episode (team
1.0, local 0.1 if clean). A listener alone never sees the secret, so that order is refused.

Options: ``symbols`` (a string of distinct characters, or a list of distinct non-empty strings;
default ``"1234"``), ``max_turns`` (default 2), ``max_message_chars`` (how much of the speaker's
message the listener is shown, and the speaker is scored on; default 48).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from atgrpo.sdk.env import Environment, EnvSpec, Message, StepResult, task_rng, turn_order_option

DEFAULT_SYMBOLS = "1234"

# Reward table (see the module docstring).
R_SOLVED = 1.0  # team: the listener names the secret
R_INFORM = 0.5  # speaker: its message names the secret
R_CLEAN = 0.1  # either: the text is exactly the secret, nothing else

SPEAKER, LISTENER = "speaker", "listener"


def _parse_symbols(raw: Any) -> tuple[str, ...]:
    if isinstance(raw, str):
        symbols = tuple(raw)
    elif isinstance(raw, Sequence) and all(isinstance(s, str) for s in raw):
        symbols = tuple(raw)
    else:
        raise ValueError(f"toy: symbols must be a string or a list of strings, got {raw!r}")
    if len(symbols) < 2:
        raise ValueError(f"toy: symbols needs at least 2 symbols, got {symbols!r}")
    if any(not s or s != s.strip() for s in symbols):
        raise ValueError(
            f"toy: symbols must be non-empty and have no surrounding space: {symbols!r}"
        )
    if len(set(symbols)) != len(symbols):
        raise ValueError(f"toy: symbols must be distinct, got {symbols!r}")
    return symbols


def _positive_int(options: Mapping[str, Any], key: str, default: int) -> int:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"toy: {key} must be an integer >= 1, got {value!r}")
    return value


class ToyEnv(Environment):
    """Speaker tells the listener a secret symbol; the listener must name it."""

    name: ClassVar[str] = "toy"

    def __init__(self, options: Mapping[str, Any] | None = None):
        super().__init__(options)
        self.symbols = _parse_symbols(self.options.get("symbols", DEFAULT_SYMBOLS))
        self.code = self._parse_code(self.options.get("code"))
        self.max_turns = _positive_int(self.options, "max_turns", 2)
        self.max_message_chars = _positive_int(self.options, "max_message_chars", 48)
        order = turn_order_option(self.options, (SPEAKER, LISTENER), self.name)
        if LISTENER in order and SPEAKER not in order:
            raise ValueError(
                "toy: a listener alone never sees the secret; use turn_order [speaker] "
                "for a single agent, or [speaker, listener]"
            )
        self.solo = order == (SPEAKER,)
        self.spec = EnvSpec(
            name=self.name,
            agents=(SPEAKER, LISTENER),
            turn_order=order,
            max_turns=self.max_turns,
            description="the speaker sees a secret symbol and tells it to the listener, "
            "who must name it",
        )
        self.task_id = ""
        self.secret = ""
        self.turn = 0  # 0-based; advances after the listener's step
        self.message: str | None = None  # the speaker's message of this turn (as shown)
        self.last_guess: str | None = None
        self.done = False
        self.success = False

    # -- episode ---------------------------------------------------------------------------

    def reset(self, task_id: str, seed: int, split: str) -> None:
        self.task_id = task_id
        self.secret = task_rng(split, seed).choice(self.symbols)
        self.turn = 0
        self.message = None
        self.last_guess = None
        self.done = False
        self.success = False

    def observe(self, agent: str) -> list[Message]:
        self._check_agent(agent)
        if agent == SPEAKER:
            if self.turn > 0:
                said = self.last_guess if self.last_guess is not None else "nothing"
                who = "you" if self.solo else "the listener"
                content = f"speaker: {who} said {said}, wrong. the secret is {self.secret}"
            else:
                content = f"speaker: the secret is {self.secret}"
        else:
            content = f"listener: the speaker says: {self.message or ''}"
        return [{"role": "user", "content": content}]

    def step(self, agent: str, action: str) -> StepResult:
        self._check_agent(agent)
        if self.done:
            return StepResult(
                0.0, 0.0, done=True, success=self.success, info={"error": "the episode is over"}
            )
        text = action if isinstance(action, str) else ""
        speaking = agent == SPEAKER and not self.solo
        if agent == SPEAKER:
            # The speaker is scored on what the listener will be shown.
            shown = text[: self.max_message_chars]
            symbol, clean, info = self._score_format(
                shown, self._speaker_alphabet() if speaking else self.symbols
            )
            if len(shown) < len(text):
                info["truncated"] = f"only the first {self.max_message_chars} characters are shown"
        else:
            symbol, clean, info = self._score_format(text, self.symbols)
        right = symbol == (self._encoded() if speaking else self.secret)
        # Only naming the *right* symbol pays: rewarding any symbol (format) or the listener's
        # repeating the speaker made a shared policy collapse onto one constant symbol in the
        # probes (see the module docstring).
        local = R_CLEAN if right and clean else 0.0
        if speaking:
            self.message = shown
            if right:
                local += R_INFORM
            return StepResult(0.0, local, info=info)

        if not self.solo:
            info["heard"] = self.first_symbol(self.message or "", self._speaker_alphabet())
        self.last_guess = symbol
        self.message = None
        self.turn += 1
        self.success = right
        self.done = right or self.turn >= self.max_turns
        return StepResult(
            R_SOLVED if right else 0.0, local, done=self.done, success=right, info=info
        )

    # -- helpers ---------------------------------------------------------------------------

    def _parse_code(self, raw: Any) -> tuple[str, ...] | None:
        if raw is None:
            return None
        code = _parse_symbols(raw)
        if len(code) != len(self.symbols) or set(code) & set(self.symbols):
            raise ValueError(
                f"toy: code {raw!r} must have one symbol per symbol of {self.symbols!r}, "
                "none of them shared with it"
            )
        return code

    def _speaker_alphabet(self) -> tuple[str, ...]:
        return self.code or self.symbols

    def _encoded(self) -> str:
        """What the speaker should say: the secret, or its code symbol."""
        return self.code[self.symbols.index(self.secret)] if self.code else self.secret

    def first_symbol(self, text: str, alphabet: Sequence[str] | None = None) -> str | None:
        """The symbol of `alphabet` (default: the secret's) occurring first in `text` (the longest
        one on a tie), or None."""
        best: tuple[int, int, str] | None = None
        for s in alphabet or self.symbols:
            i = text.find(s)
            if i >= 0 and (best is None or (i, -len(s)) < best[:2]):
                best = (i, -len(s), s)
        return None if best is None else best[2]

    def _score_format(
        self, text: str, alphabet: Sequence[str]
    ) -> tuple[str | None, bool, dict[str, Any]]:
        symbol = self.first_symbol(text, alphabet)
        clean = text.strip() in alphabet
        info: dict[str, Any] = {"symbol": symbol, "clean": clean, "secret": self.secret}
        if not text.strip():
            info["parse_error"] = "empty output: name one of " + " ".join(alphabet)
        elif symbol is None:
            info["parse_error"] = "no symbol named: name one of " + " ".join(alphabet)
        return symbol, clean, info

    def _check_agent(self, agent: str) -> None:
        if agent not in self.spec.agents:
            raise ValueError(f"toy: unknown agent {agent!r}; agents are {self.spec.agents}")
