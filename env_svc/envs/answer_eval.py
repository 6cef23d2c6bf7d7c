"""The math judge's numeric evaluator: the values of answer_expr's sympy expressions in mpmath,
every operation bounded (answer_limits) before it runs, the opaque numbers that keep every value
but a rational out of sympy's hands (why: answer_expr), and the secret sample points at which
expressions with variables are compared.
"""

from __future__ import annotations

import hmac
import random
import secrets
import string
import threading
from typing import Any

from env_svc.envs.answer_limits import (
    _LN2,
    MAX_BINOMIAL,
    MAX_FACTORIAL,
    MAX_MAG_BITS,
    MAX_NODES,
    MAX_TRIG_ARG,
)


class Unbounded(ArithmeticError):
    """A value the evaluator refuses: past the magnitude bound, or undefined (0/0, log 0)."""

    def __init__(self, reason: str, what: str):
        super().__init__(what)
        self.reason = reason


_opaque: Any = None


def opaque_type() -> Any:
    """The class of the numbers the parser hides from sympy (made on first use: sympy is imported
    lazily). sympy decides what a number is (zero? positive? an integer?) by evaluating it
    numerically, again for every enclosing node, more precisely each time a result is close to a
    boundary: a Pow whose base holds a few nested logs took minutes. So every number that is not
    rational (pi, sqrt 2, sin 1, 2^pi) becomes an Opaque: a sympy Dummy, which sympy's algebra
    treats as an unknown (x - x = 0 and x/x = 1 still hold) and never evaluates. Its value, the
    hidden `expr`, is computed only by the bounded Evaluator. Dummies are unique, so two opaque
    numbers are never equal as expressions: they are compared by value."""
    global _opaque
    if _opaque is None:
        import sympy as sp

        class Opaque(sp.Dummy):
            expr: Any

        _opaque = Opaque
    return _opaque


def hide(expr: Any) -> Any:
    node = opaque_type()("c")
    node.expr = expr
    return node


def variables(expr: Any) -> set[Any]:
    """expr's free variables: its symbols that are not opaque numbers."""
    kind = opaque_type()
    return {s for s in expr.free_symbols if not isinstance(s, kind)}


class _Context:
    """An mpmath context at one precision with the bounded functions the evaluator applies. One
    per thread and precision (_context): mpmath's global context is shared by every thread, and
    building one costs more than a whole comparison."""

    def __init__(self, prec: int):
        import mpmath
        import sympy as sp

        c = self.ctx = mpmath.MPContext()
        c.prec = prec
        self.consts = {sp.pi: c.pi, sp.E: c.e, sp.I: c.mpc(0, 1), sp.oo: c.inf, -sp.oo: -c.inf}
        self.unary = {
            sp.exp: self._hyper(c.exp),
            sp.log: self._log,
            sp.sin: self._trig(c.sin),
            sp.cos: self._trig(c.cos),
            sp.tan: self._trig(c.tan),
            sp.cot: self._trig(c.cot),
            sp.sec: self._trig(c.sec),
            sp.csc: self._trig(c.csc),
            sp.asin: c.asin,
            sp.acos: c.acos,
            sp.atan: c.atan,
            sp.sinh: self._hyper(c.sinh),
            sp.cosh: self._hyper(c.cosh),
            sp.tanh: self._hyper(c.tanh),
            sp.Abs: abs,
            sp.floor: self._rounding(c.floor),
            sp.ceiling: self._rounding(c.ceil),
            sp.factorial: self._factorial,
            sp.re: c.re,
            sp.im: c.im,
        }

    def _trig(self, fn: Any) -> Any:
        """sin(a + bi) grows like e^|b|, and reducing a costs log2|a| bits of precision."""
        c = self.ctx

        def f(z: Any) -> Any:
            if abs(c.re(z)) > MAX_TRIG_ARG or abs(c.im(z)) > _LN_LIMIT:
                raise Unbounded("too_large", "a trigonometric argument")
            return fn(z)

        return f

    def _hyper(self, fn: Any) -> Any:
        """exp(a + bi) and sinh grow like e^|a|."""
        c = self.ctx

        def f(z: Any) -> Any:
            if abs(c.re(z)) > _LN_LIMIT or abs(c.im(z)) > MAX_TRIG_ARG:
                raise Unbounded("too_large", "an exponential")
            return fn(z)

        return f

    def _log(self, z: Any) -> Any:
        if not z:
            raise Unbounded("undefined", "log 0")
        return self.ctx.log(z)

    def _rounding(self, fn: Any) -> Any:
        c = self.ctx
        return lambda z: fn(c.re(z)) + (c.mpc(0, 1) * fn(c.im(z)) if c.im(z) else 0)

    def _factorial(self, z: Any) -> Any:
        if not 0 <= self.ctx.re(z) <= MAX_FACTORIAL:
            raise Unbounded("too_large", "a factorial")
        return self.ctx.factorial(z)


_LN_LIMIT = MAX_MAG_BITS * _LN2  # the bound on |ln value|
_contexts = threading.local()


def _context(prec: int) -> _Context:
    cache = getattr(_contexts, "by_prec", None)
    if cache is None:
        cache = _contexts.by_prec = {}
    if prec not in cache:
        cache[prec] = _Context(prec)
    return cache[prec]


class Evaluator:
    """Values of the parser's sympy expressions in mpmath at `prec` bits, at one point (a value per
    single-letter variable). Every operation is bounded before it runs: powers and exponentials by
    the magnitude of their result (from the log of the base, never by computing it), trig
    arguments by MAX_TRIG_ARG, every value by MAX_MAG_BITS. Values are memoized per node, so a
    parse that checks each new node costs one operation per node, and at most MAX_NODES nodes
    are evaluated. Use it in the thread that made it (its mpmath context is that thread's)."""

    def __init__(self, prec: int, point: dict[str, Any] | None = None):
        import sympy as sp

        self.sp, self.context, self.opaque = sp, _context(prec), opaque_type()
        self.ctx = self.context.ctx
        self.point = {name: self.ctx.mpf(v) for name, v in (point or {}).items()}
        self.memo: dict[Any, Any] = {}
        self.visits = 0

    def value(self, node: Any) -> Any:
        got = self.memo.get(node)
        if got is None:
            self.visits += 1
            if self.visits > MAX_NODES:
                raise Unbounded("too_large", f"more than {MAX_NODES} operations")
            try:
                got = self._bounded(self._eval(node))
            except Unbounded as e:
                got = e
            except Exception as e:  # mpmath's own refusals (NoConvergence, ZeroDivisionError ...)
                got = Unbounded("undefined", f"{type(e).__name__}: {str(e)[:80]}")
            self.memo[node] = got
        if isinstance(got, Unbounded):
            raise got
        return got

    def _bounded(self, v: Any) -> Any:
        c = self.ctx
        if c.isnan(v):
            raise Unbounded("undefined", "not a number")
        if c.isinf(v):
            return v  # oo itself: sympy and the comparison handle it
        if v and abs(c.mag(v)) > MAX_MAG_BITS:
            raise Unbounded("too_large", f"a value past 2^{MAX_MAG_BITS}")
        return v

    def _eval(self, node: Any) -> Any:
        sp, c = self.sp, self.ctx
        if node.is_Rational:
            return c.mpf(node.p) / node.q
        if node.is_Float:
            return c.make_mpf(node._mpf_)
        if isinstance(node, self.opaque):
            return self.value(node.expr)
        if node.is_Symbol:
            if node.name not in self.point:
                raise Unbounded("undefined", f"no value for {node.name}")
            return self.point[node.name]
        if node.is_Add or node.is_Mul:
            total = c.mpf(0) if node.is_Add else c.mpf(1)
            for arg in node.args:
                v = self.value(arg)
                total = self._bounded(total + v if node.is_Add else total * v)
            return total
        if node.is_Pow:
            return self.power(self.value(node.base), self.value(node.exp))
        const = self.context.consts.get(node)
        if const is not None:
            return const
        fn = self.context.unary.get(node.func)
        if fn is not None and len(node.args) == 1:
            return fn(self.value(node.args[0]))
        if node.func == sp.binomial:
            n, k = (self.value(a) for a in node.args)
            if not abs(n) <= MAX_BINOMIAL:
                raise Unbounded("too_large", "binomial")
            return c.binomial(n, k)
        raise Unbounded("undefined", f"cannot evaluate {node.func.__name__}")

    def power(self, b: Any, e: Any) -> Any:
        """b^e, refused before it is computed when |e * ln b| exceeds the magnitude bound."""
        c = self.ctx
        if c.isinf(b) or c.isinf(e):
            return c.power(b, e)
        if not b:
            if c.re(e) > 0:
                return c.mpf(0)
            raise Unbounded("undefined", "0 to a power <= 0")
        t = e * c.log(b)
        if abs(c.re(t)) > _LN_LIMIT or abs(c.im(t)) > MAX_TRIG_ARG:
            raise Unbounded("too_large", "a power")
        return c.power(b, e)


# ---- sample points ----------------------------------------------------------------------------

# This process's key for the sample points: an answer cannot know it, so it cannot know the points.
_POINTS_KEY = secrets.token_bytes(32)
POINTS = 8
_LETTERS = {c: i for i, c in enumerate(string.ascii_letters)}


def sample_values(reference: str) -> list[float]:
    """The values of the sample points of a comparison with `reference`: POINTS points, each a
    value in (0.5, 3) per letter (`sample_point`). Generic (no two letters, no point equal, no
    small integers), positive (so the principal roots and logs of honest answers agree), the same
    for a letter in both answers, and drawn from an HMAC of the reference under a key of this
    process: the same points every time for one task (a verdict does not change), other points
    for another, and none an answer can know, so none it can be built to vanish at."""
    seed = hmac.new(_POINTS_KEY, reference.encode("utf-8", "replace"), "sha256").digest()
    rng = random.Random(seed)
    return [0.5 + 2.5 * rng.random() for _ in range(POINTS * len(_LETTERS))]


def sample_point(values: list[float], k: int, letters: frozenset[str]) -> dict[str, float]:
    """Point k of `values`, for `letters` only (a letter's value does not depend on the others)."""
    return {c: values[k * len(_LETTERS) + _LETTERS[c]] for c in letters}
