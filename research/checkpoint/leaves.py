"""Named leaves of a training state: flatten it for a checkpoint, build it back.

A checkpoint stores host arrays under names derived from their pytree path
(``params/Conv_0/kernel``, ``opt_state/0/trace/Conv_0/kernel``, ``step``,
``rng``), so a shard is readable without the code that produced it and restore
can check that a checkpoint fits the state it is loaded into.

Typed PRNG keys (``jax.random.key``) are stored as their key data; legacy
``uint32[2]`` keys are plain arrays.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class LeafSpec:
    """Name, shape and dtype of one stored leaf (as JSON-friendly values)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str = "array"  # "array" | "key" (typed PRNG key data) | "scalar" (Python)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "kind": self.kind,
        }


def _key_str(k: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def path_name(path: Sequence[Any]) -> str:
    """``(GetAttrKey('params'), DictKey('Dense_0'), ...)`` -> ``params/Dense_0/...``."""
    return "/".join(_key_str(k) for k in path) or "leaf"


def is_key(x: Any) -> bool:
    """True for a typed PRNG key array (stored as its key data)."""
    import jax

    dtype = getattr(x, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def spec_of(name: str, x: Any) -> LeafSpec:
    import jax

    if is_key(x):
        data = jax.random.key_data(x)
        return LeafSpec(name, tuple(data.shape), np.dtype(data.dtype).name, "key")
    if isinstance(x, (bool, int, float, complex)):
        # A Python number (flax's TrainState.step before the first update): its
        # dtype is whatever a checkpoint of the running state recorded.
        return LeafSpec(name, (), np.asarray(x).dtype.name, "scalar")
    arr = x if hasattr(x, "dtype") and hasattr(x, "shape") else np.asarray(x)
    return LeafSpec(name, tuple(int(d) for d in arr.shape), np.dtype(arr.dtype).name)


class Flattener:
    """Flattens states of one structure fast, computing names once per structure.

    ``jax.tree_util.tree_flatten`` is several times cheaper than flattening with
    paths, and the blocking part of a checkpoint pays for it on every save.
    """

    def __init__(self) -> None:
        self._treedef: Any = None
        self._shapes: list[tuple] = []
        self.names: list[str] = []
        self.specs: list[LeafSpec] = []

    def flatten(self, state: Any) -> tuple[list[Any], bool]:
        """Leaves of ``state``; the flag is True when the structure is new."""
        import jax

        leaves, treedef = jax.tree_util.tree_flatten(state)
        shapes = [(getattr(x, "shape", ()), getattr(x, "dtype", None)) for x in leaves]
        changed = (
            self._treedef is None or treedef != self._treedef or shapes != self._shapes
        )
        if changed:
            with_path, _ = jax.tree_util.tree_flatten_with_path(state)
            self.names = [path_name(p) for p, _ in with_path]
            if len(set(self.names)) != len(self.names):
                raise ValueError("state has leaves with identical path names")
            self.specs = [spec_of(n, x) for n, x in zip(self.names, leaves)]
            self._treedef, self._shapes = treedef, shapes
        return leaves, changed


def nest(named: dict[str, Any]) -> dict[str, Any]:
    """``{"a/b": x}`` -> ``{"a": {"b": x}}`` (the tree Orbax stores)."""
    out: dict[str, Any] = {}
    for name, value in named.items():
        node = out
        *parents, last = name.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return out


def unnest(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Inverse of :func:`nest`."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        name = f"{prefix}/{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.update(unnest(v, name))
        else:
            out[name] = v
    return out


def _like(target: Any, value: np.ndarray) -> Any:
    """``value`` as the same kind of object as ``target`` (device, key, scalar)."""
    import jax
    import jax.numpy as jnp

    if is_key(target):
        return jax.random.wrap_key_data(
            jnp.asarray(value), impl=jax.random.key_impl(target)
        )
    if isinstance(target, jax.Array):
        return jax.device_put(value, target.sharding)
    if isinstance(target, np.ndarray):
        return np.array(value, copy=True)
    if isinstance(target, np.generic):
        return type(target)(value)
    if isinstance(target, (bool, int, float, complex)):
        # As jit makes it from a Python number: a weakly typed scalar array.
        return jnp.asarray(value.item())
    return jnp.asarray(value)


def check_compatible(specs: Sequence[LeafSpec], stored: Sequence[dict]) -> None:
    """Raise ``ValueError`` naming the first leaf where state and checkpoint differ."""
    have = {s.name: s for s in specs}
    want = {d["name"]: d for d in stored}
    missing = sorted(set(have) - set(want))
    extra = sorted(set(want) - set(have))
    if missing or extra:
        raise ValueError(
            f"checkpoint does not match the state: leaves missing from the "
            f"checkpoint {missing[:5]}, unexpected {extra[:5]}"
        )
    for name, s in have.items():
        d = want[name]
        if s.kind == "scalar" and tuple(d["shape"]) == ():
            continue
        if tuple(d["shape"]) != s.shape or d["dtype"] != s.dtype:
            raise ValueError(
                f"checkpoint does not match the state at {name}: stored "
                f"{d['dtype']}{list(d['shape'])}, state {s.dtype}{list(s.shape)}"
            )


def rebuild(target: Any, arrays: dict[str, np.ndarray]) -> Any:
    """A state shaped like ``target`` whose leaves are ``arrays`` (by name)."""
    import jax

    fl = Flattener()
    leaves, _ = fl.flatten(target)
    treedef = jax.tree_util.tree_structure(target)
    out = [_like(x, arrays[n]) for x, n in zip(leaves, fl.names)]
    return jax.tree_util.tree_unflatten(treedef, out)
