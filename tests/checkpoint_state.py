"""A deterministic training-state stand-in shared by the checkpoint tests.

``state_at(k)`` is a pure function of ``k``: a nested state with parameters of
uneven sizes (so the partition matters), an optimizer-like tuple, batch
statistics, an int step and a typed PRNG key, like the loop's TrainState.
``advance`` is a jitted step that donates its input, as the loop's does.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import numpy as np

# Few leaves keep XLA compilation (about 0.1 s per leaf here) out of test time.
SIZES = {"conv": (3, 3, 8, 16), "head": (64, 10), "big": (256, 256)}


def initial(scale: int = 1) -> dict[str, Any]:
    """The state at step 0 (``scale`` multiplies the rows of the big leaf)."""
    rng = np.random.default_rng(1234)
    params = {}
    for name, shape in SIZES.items():
        if name == "big":
            shape = (shape[0] * scale, shape[1])
        params[name] = {
            "kernel": rng.standard_normal(shape).astype(np.float32),
            "bias": np.zeros(shape[-1:], np.float32),
        }
    # One transfer, no per-leaf jitted ops: compilation dominates small tests.
    state = jax.device_put(
        {
            "params": params,
            "opt_state": (jax.tree.map(np.zeros_like, params), {"count": np.int32(0)}),
            "batch_stats": {"mean": np.arange(16, dtype=np.float32)},
            "step": np.int32(0),
        }
    )
    state["rng"] = jax.random.wrap_key_data(np.array([0, 7], np.uint32))
    return state


@partial(jax.jit, donate_argnums=0)
def advance(state: dict[str, Any]) -> dict[str, Any]:
    """One donated step, like the loop's jitted update."""
    params = jax.tree.map(lambda p: p * 0.999 + 0.01, state["params"])
    mom = jax.tree.map(lambda m, p: 0.9 * m + 0.1 * p, state["opt_state"][0], params)
    return {
        "params": params,
        "opt_state": (mom, {"count": state["opt_state"][1]["count"] + 1}),
        "batch_stats": {"mean": state["batch_stats"]["mean"] * 0.5 + 1.0},
        "step": state["step"] + 1,
        "rng": state["rng"],  # constant, as the loop's base key
    }


def state_at(k: int, scale: int = 1) -> dict[str, Any]:
    """The state after ``k`` steps: deterministic, identical on every rank."""
    s = initial(scale)
    for _ in range(k):
        s = advance(s)
    return s


def host(tree: Any) -> Any:
    """Host copies of every leaf (typed keys as key data), for comparisons."""

    def one(x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return np.array(x)

    return jax.tree.map(one, tree)


def identical(a: Any, b: Any) -> bool:
    """Bit-identical trees (same structure, dtypes and bytes)."""
    ha, hb = host(a), host(b)
    if jax.tree.structure(ha) != jax.tree.structure(hb):
        return False
    return all(
        x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
        for x, y in zip(jax.tree.leaves(ha), jax.tree.leaves(hb))
    )
