"""Load-imbalance injection: which rank is held up how long in which step.

The training loop asks ``imbalance.delay(step, rank)`` once per step (0-based),
inside the compute phase, and holds the rank that many seconds (``hold``) on the
timeline's ``delay`` track, so an injected straggler looks like a slower rank, as
in eager-SGD's runs.
Every model is a pure function of ``(seed, step, rank)``: all ranks agree on who
sleeps without any message, and a rerun injects exactly the same delays.

Models and their command-line spec (:func:`parse_imbalance`)::

    none                                   no delay
    fixed:ranks=1,3:seconds=0.1            ranks 1 and 3 sleep 0.1 s every step
    random:k=1:seconds=0.32                each step k ranks, drawn with the shared
                                           seed, sleep 0.32 s (the paper's runs)
    random:k=1-2:seconds=0.32              k itself drawn from 1..2 each step
    random:k=1:seconds=0.32:group=2        each step k groups of 2 consecutive
                                           ranks sleep together: with ranks
                                           placed in blocks of 2 per node
                                           (--hosts n1,n2 at 4 ranks), the
                                           ranks of one node
    dist:exponential:mean=0.05             every rank, every step, an independent
    dist:uniform:low=0:high=0.1            draw (inherent imbalance, such as
    dist:lognormal:mean=0.05:sigma=0.5     variable-length inputs); lognormal is
    dist:normal:mean=0.05:std=0.02         given by its mean; normal is cut at 0

Optional for every model but ``none``: ``start=S`` (no delay before step S, e.g.
to keep compilation steps clean), ``end=E`` (no delay from step E on: a
straggler for one window of steps) and ``how=sleep|spin`` (default ``sleep``).
Numbers are seconds. Errors are ``ValueError`` with a message naming the bad part.

How a delay is spent
--------------------
``how=sleep`` is the paper's emulation: the straggler sleeps. That is faithful
when every rank has its own cores (the paper: one GPU and its host cores per
rank). When ranks share cores (4 ranks on a 2-core laptop), a sleeping rank hands
its core to the others, which then compute faster: the imbalance speeds the
balanced ranks up, so synchronous SGD appears to lose less than the delay, and
eager-SGD's fast ranks run faster than without imbalance. ``how=spin`` keeps the
straggler's core busy for the delay, the way a rank with more work would: it runs
a small single-threaded XLA loop in chunks of about 0.5 ms, which releases the GIL
while it runs, so the rank's communication thread keeps taking part in rounds.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import numpy as np

HOW = ("sleep", "spin")

DISTRIBUTIONS = {
    "exponential": ("mean",),
    "uniform": ("low", "high"),
    "lognormal": ("mean", "sigma"),
    "normal": ("mean", "std"),
}


class Imbalance:
    """No injected delay; the base of every model."""

    name = "none"
    how = "sleep"

    def delay(self, step: int, rank: int) -> float:
        """Seconds rank ``rank`` is held up in step ``step`` (0-based)."""
        return 0.0

    def hold(self, seconds: float) -> None:
        """Spend ``seconds`` of wall time the way this model says (``how``)."""
        hold(seconds, self.how)

    def spec(self) -> str:
        """The command-line spec that builds this model again."""
        return "none"

    def describe(self) -> dict[str, Any]:
        """A JSON-able record for ``config.json``."""
        return {"name": self.name, "spec": self.spec()}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec()!r})"


class _Started(Imbalance):
    def __init__(
        self, start: int = 0, how: str = "sleep", end: int | None = None
    ) -> None:
        if start < 0:
            raise ValueError(f"start must be >= 0, got {start}")
        if end is not None and end <= start:
            raise ValueError(f"end must be > start={start}, got {end}")
        if how not in HOW:
            raise ValueError(f"how must be one of {', '.join(HOW)}, got {how!r}")
        self.start, self.how = int(start), how
        self.end = None if end is None else int(end)

    def _off(self, step: int) -> bool:
        """Whether ``step`` lies outside the window ``[start, end)``."""
        return step < self.start or (self.end is not None and step >= self.end)

    def _suffix(self) -> str:
        start = f":start={self.start}" if self.start else ""
        end = f":end={self.end}" if self.end is not None else ""
        return start + end + (f":how={self.how}" if self.how != "sleep" else "")


class FixedImbalance(_Started):
    """The given ranks sleep ``seconds`` every step."""

    name = "fixed"

    def __init__(
        self,
        ranks: tuple[int, ...] | list[int],
        seconds: float,
        start: int = 0,
        how: str = "sleep",
        end: int | None = None,
    ) -> None:
        super().__init__(start, how, end)
        if seconds < 0:
            raise ValueError(f"seconds must be >= 0, got {seconds}")
        self.ranks = frozenset(int(r) for r in ranks)
        self.seconds = float(seconds)

    def delay(self, step: int, rank: int) -> float:
        if self._off(step):
            return 0.0
        return self.seconds if rank in self.ranks else 0.0

    def spec(self) -> str:
        ranks = ",".join(str(r) for r in sorted(self.ranks))
        return f"fixed:ranks={ranks}:seconds={self.seconds:g}{self._suffix()}"


class RandomImbalance(_Started):
    """Each step ``k`` ranks (a shared-seed draw) sleep ``seconds``.

    ``k`` may be a range ``(lo, hi)``: each step draws k uniformly from lo..hi.
    ``group``: the draw is of groups of ``group`` consecutive ranks (ranks
    ``g * group`` to ``g * group + group - 1``), all of a drawn group sleeping:
    a node's ranks where ranks are placed in blocks of ``group`` per node.
    """

    name = "random"

    def __init__(
        self,
        k: int | tuple[int, int],
        seconds: float,
        size: int,
        seed: int = 0,
        start: int = 0,
        how: str = "sleep",
        group: int = 1,
        end: int | None = None,
    ) -> None:
        super().__init__(start, how, end)
        lo, hi = (k, k) if isinstance(k, int) else (int(k[0]), int(k[1]))
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        if group < 1 or size % group:
            raise ValueError(
                f"group must divide the {size} ranks into equal blocks, got {group}"
            )
        units = size // group
        if not 0 <= lo <= hi <= units:
            what = f"size={size}" if group == 1 else f"{units} groups of {group}"
            raise ValueError(f"k must satisfy 0 <= k <= {what}, got {lo}-{hi}")
        self.group = int(group)
        if seconds < 0:
            raise ValueError(f"seconds must be >= 0, got {seconds}")
        self.k, self.seconds, self.size, self.seed = (
            (lo, hi),
            float(seconds),
            size,
            seed,
        )

    def sleepers(self, step: int) -> frozenset[int]:
        """The ranks that sleep in ``step``: the same set on every rank."""
        if self._off(step):
            return frozenset()
        rng = np.random.default_rng((self.seed, 0x1B, int(step)))
        k = int(rng.integers(self.k[0], self.k[1] + 1))
        units = rng.choice(self.size // self.group, size=k, replace=False)
        return frozenset(
            int(u) * self.group + i for u in units for i in range(self.group)
        )

    def delay(self, step: int, rank: int) -> float:
        return self.seconds if rank in self.sleepers(step) else 0.0

    def spec(self) -> str:
        k = str(self.k[0]) if self.k[0] == self.k[1] else f"{self.k[0]}-{self.k[1]}"
        group = f":group={self.group}" if self.group > 1 else ""
        return f"random:k={k}:seconds={self.seconds:g}{group}{self._suffix()}"


class DistImbalance(_Started):
    """Every rank sleeps an independent draw from a distribution every step."""

    name = "dist"

    def __init__(
        self,
        dist: str,
        params: dict[str, float],
        seed: int = 0,
        start: int = 0,
        how: str = "sleep",
        end: int | None = None,
    ) -> None:
        super().__init__(start, how, end)
        if dist not in DISTRIBUTIONS:
            raise ValueError(
                f"unknown distribution {dist!r}; choose one of "
                f"{', '.join(DISTRIBUTIONS)}"
            )
        need = DISTRIBUTIONS[dist]
        if set(params) != set(need):
            raise ValueError(
                f"dist:{dist} takes {', '.join(need)}; got "
                f"{', '.join(sorted(params)) or 'nothing'}"
            )
        if any(v < 0 for v in params.values()):
            raise ValueError(f"dist:{dist} parameters must be >= 0, got {params}")
        if dist == "uniform" and params["low"] > params["high"]:
            raise ValueError("dist:uniform needs low <= high")
        self.dist, self.params, self.seed = dist, dict(params), seed

    def mean(self) -> float:
        """Expected delay per rank and step, seconds (before the cut at 0)."""
        p = self.params
        if self.dist == "uniform":
            return (p["low"] + p["high"]) / 2
        return p["mean"]

    def delay(self, step: int, rank: int) -> float:
        if self._off(step):
            return 0.0
        rng = np.random.default_rng((self.seed, 0xD1, int(step), int(rank)))
        p = self.params
        if self.dist == "exponential":
            x = rng.exponential(p["mean"]) if p["mean"] > 0 else 0.0
        elif self.dist == "uniform":
            x = rng.uniform(p["low"], p["high"])
        elif self.dist == "lognormal":
            if p["mean"] == 0:
                return 0.0
            mu = math.log(p["mean"]) - p["sigma"] ** 2 / 2  # so E[x] = mean
            x = rng.lognormal(mu, p["sigma"])
        else:
            x = rng.normal(p["mean"], p["std"])
        return max(0.0, float(x))

    def spec(self) -> str:
        args = ":".join(f"{k}={self.params[k]:g}" for k in DISTRIBUTIONS[self.dist])
        return f"dist:{self.dist}:{args}{self._suffix()}"


# -- parsing ------------------------------------------------------------------------
def _number(model: str, key: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"imbalance {model}: {key}={text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"imbalance {model}: {key} must be finite, got {text}")
    return value


def _integer(model: str, key: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(
            f"imbalance {model}: {key}={text!r} is not an integer"
        ) from None


def _pairs(model: str, parts: list[str], allowed: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in parts:
        key, eq, value = part.partition("=")
        if not eq or not key or not value:
            raise ValueError(f"imbalance {model}: expected key=value, got {part!r}")
        if key not in allowed:
            raise ValueError(
                f"imbalance {model}: unknown key {key!r}; valid keys: "
                f"{', '.join(allowed)}"
            )
        if key in out:
            raise ValueError(f"imbalance {model}: {key} given twice")
        out[key] = value
    return out


def _how(model: str, kv: dict[str, str]) -> str:
    how = kv.get("how", "sleep")
    if how not in HOW:
        raise ValueError(
            f"imbalance {model}: how={how!r}; choose one of {', '.join(HOW)}"
        )
    return how


def _end(model: str, kv: dict[str, str]) -> int | None:
    """``end=E`` (None when absent), checked against ``start``."""
    if "end" not in kv:
        return None
    end = _integer(model, "end", kv["end"])
    start = _integer(model, "start", kv.get("start", "0"))
    if end <= start:
        raise ValueError(f"imbalance {model}: end={end} must be after start={start}")
    return end


def _require(model: str, kv: dict[str, str], keys: tuple[str, ...]) -> None:
    missing = [k for k in keys if k not in kv]
    if missing:
        raise ValueError(f"imbalance {model}: missing {', '.join(missing)}")


def parse_imbalance(spec: str, *, size: int, seed: int = 0) -> Imbalance:
    """Build an imbalance model from its spec (grammar in the module docstring).

    Args:
      spec: e.g. ``"random:k=1-2:seconds=0.32"``.
      size: number of ranks (checks rank numbers and ``k``).
      seed: shared seed of the random models.

    Raises:
      ValueError: the spec is malformed; the message says which part and why.
    """
    spec = spec.strip()
    model, _, rest = spec.partition(":")
    parts = [p for p in rest.split(":")] if rest else []
    if model in ("none", ""):
        if parts:
            raise ValueError(f"imbalance none takes no arguments, got {rest!r}")
        return Imbalance()
    if model == "fixed":
        kv = _pairs(model, parts, ("ranks", "seconds", "start", "end", "how"))
        _require(model, kv, ("ranks", "seconds"))
        try:
            ranks = [int(r) for r in kv["ranks"].split(",") if r.strip()]
        except ValueError:
            raise ValueError(
                f"imbalance fixed: ranks={kv['ranks']!r} must be "
                "comma-separated integers"
            ) from None
        bad = [r for r in ranks if not 0 <= r < size]
        if bad or not ranks:
            raise ValueError(
                f"imbalance fixed: ranks must be in 0..{size - 1}, got {kv['ranks']!r}"
            )
        return FixedImbalance(
            ranks,
            _number(model, "seconds", kv["seconds"]),
            _integer(model, "start", kv.get("start", "0")),
            _how(model, kv),
            _end(model, kv),
        )
    if model == "random":
        kv = _pairs(model, parts, ("k", "seconds", "group", "start", "end", "how"))
        _require(model, kv, ("k", "seconds"))
        lo_s, dash, hi_s = kv["k"].partition("-")
        lo = _integer(model, "k", lo_s)
        hi = _integer(model, "k", hi_s) if dash else lo
        if lo > hi:
            raise ValueError(f"imbalance random: k range {kv['k']!r} is empty")
        return RandomImbalance(
            (lo, hi),
            _number(model, "seconds", kv["seconds"]),
            size,
            seed,
            _integer(model, "start", kv.get("start", "0")),
            _how(model, kv),
            _integer(model, "group", kv.get("group", "1")),
            _end(model, kv),
        )
    if model == "dist":
        if not parts or "=" in parts[0]:
            raise ValueError(
                "imbalance dist: name a distribution first, e.g. "
                "dist:exponential:mean=0.05; one of "
                f"{', '.join(DISTRIBUTIONS)}"
            )
        dist, params = parts[0], parts[1:]
        if dist not in DISTRIBUTIONS:
            raise ValueError(
                f"imbalance dist: unknown distribution {dist!r}; choose "
                f"one of {', '.join(DISTRIBUTIONS)}"
            )
        kv = _pairs(
            f"dist:{dist}", params, (*DISTRIBUTIONS[dist], "start", "end", "how")
        )
        _require(f"dist:{dist}", kv, DISTRIBUTIONS[dist])
        start = _integer(model, "start", kv.pop("start", "0"))
        how, end = _how(model, kv), _end(model, kv)
        kv.pop("how", None)
        kv.pop("end", None)
        values = {k: _number(f"dist:{dist}", k, v) for k, v in kv.items()}
        return DistImbalance(dist, values, seed, start, how, end)
    raise ValueError(
        f"unknown imbalance model {model!r}; choose one of none, fixed, "
        "random, dist (e.g. random:k=1:seconds=0.32)"
    )


# -- spending a delay ---------------------------------------------------------------
def hold(seconds: float, how: str = "sleep") -> None:
    """Spend ``seconds`` of wall time: asleep, or keeping this rank's core busy.

    See "How a delay is spent" in the module docstring. ``hold(0, "spin")``
    prepares the busy loop (compiles and calibrates it) without waiting.
    """
    if how not in HOW:
        raise ValueError(f"how must be one of {', '.join(HOW)}, got {how!r}")
    if how == "spin":
        spinner = _Spinner.get()  # the first call compiles and calibrates
        if seconds > 0:
            spinner.spin(seconds)
    elif seconds > 0:
        time.sleep(seconds)


class _Spinner:
    """Busy work in chunks of about ``CHUNK_S``, with the GIL released."""

    CHUNK_S = 0.5e-3
    _instance: _Spinner | None = None
    _lock = threading.Lock()

    @classmethod
    def get(cls) -> _Spinner:
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def __init__(self) -> None:
        import jax
        import jax.numpy as jnp

        def loop(x, n):
            return jax.lax.fori_loop(0, n, lambda i, v: v * 0.999 + 0.001, x)

        self._loop = jax.jit(loop, static_argnums=1)
        try:  # the host core, also where an accelerator is the default device
            device = jax.devices("cpu")[0]
        except RuntimeError:  # JAX_PLATFORMS without cpu
            device = None
        self._x = jax.device_put(jnp.ones(256, jnp.float32), device)
        probe = 2000
        self._loop(self._x, probe).block_until_ready()  # compile
        t = time.perf_counter()
        self._loop(self._x, probe).block_until_ready()
        per_iter = max(time.perf_counter() - t, 1e-7) / probe
        self.n = max(1, int(self.CHUNK_S / per_iter))
        self._loop(self._x, self.n).block_until_ready()  # compile the chunk

    def spin(self, seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            self._loop(self._x, self.n).block_until_ready()
