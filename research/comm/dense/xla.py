"""XLA's own collectives across the job's processes: the ``xla`` allreduce path.

JAX's distributed runtime is started from the MPI world (:func:`start`): rank
0's address and a free port are broadcast over MPI, every rank is one JAX
process with its one local device. A mesh of those devices, one per rank along
the axis :data:`AXIS`, carries programs that every process runs together;
``lax.psum`` over the axis is an allreduce that XLA lowers to NCCL on GPUs and
to gloo on the CPU (so CI runs this path without a GPU).

A rank's arrays enter such a program without a copy: an array of shape
``(d0, ...)`` is this rank's block of a global ``(P * d0, ...)`` array sharded
along the axis (a 0-d one travels as ``(1,)``); :class:`Spmd` turns a per-rank
function into that program and back. On the 2-core CPU machine (3 ranks,
``scripts.bench_allreduce --xla``, ResNet-50's 102 MB, other jobs running) the
fused mean took 875 ms through gloo against 206 ms through the ring, so
``allreduce=auto`` times this path only where it can win (GPUs, one per rank:
NCCL refuses two ranks on one GPU); ``allreduce=xla`` forces it.

The runtime must start before JAX's first computation: the Trainer starts it
when its strategy's options ask for it (``StrategyOptions.xla_runtime``); a
loop of one's own calls :func:`start` right after ``get_world()``. It changes
what JAX calls a process: Orbax then counts ranks (research.checkpoint.shard
gives each rank its own checkpointer), and orbax-checkpoint 0.12 writes numpy
arrays from process 0 only, so the Orbax savers are refused beside
``allreduce=xla`` (DeepFreeze's writer is a process of its own) and ``auto``
does not start the runtime for them (``SaverOptions.beside_xla_runtime``).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from research.comm.process import devices

#: The mesh axis of the ranks.
AXIS = "ranks"
#: Seconds a rank waits for the others to join the runtime (JAX's default: 300).
INIT_TIMEOUT_S = 60
#: Seconds a finishing process waits for the others at JAX's shutdown barrier.
SHUTDOWN_TIMEOUT_S = 30
#: Seconds past the communication watchdog's timeout after which NCCL itself
#: ends a collective that waits (``--xla_gpu_nccl_termination_timeout_seconds``,
#: off in XLA by default): the watchdog names the collective first; NCCL's end
#: is the backstop for a wait inside the GPU program that no host thread sees.
NCCL_MARGIN_S = 30
_NCCL_FLAG = "--xla_gpu_nccl_termination_timeout_seconds"
_state: dict[str, Any] = {}  # what start() did, for config.json
_mesh: list[jax.sharding.Mesh] = []


def running() -> bool:
    """Whether this process is part of a started runtime."""
    return bool(_state.get("started"))


def status() -> dict[str, Any]:
    """Whether the runtime runs, and why not (for ``config.json``)."""
    return dict(_state)


def platform() -> str:
    """This rank's platform (``"cpu"``, ``"gpu"``): its bound device, or the
    one it will bind (no JAX computation)."""
    binding = devices.current()
    return binding.platform if binding else devices.planned_platform()[0]


def wanted(want: str | None, allowed: bool) -> bool:
    """Whether to start the runtime: a run ``"needed"`` it, or finds it
    ``"worth timing"`` (``allreduce=auto`` on GPUs) and is ``allowed`` to (no
    saver that writes with Orbax in the rank's process)."""
    return want == "needed" or (want == "worth timing" and allowed)


def start(world: Any) -> bool:
    """Start JAX's distributed runtime over ``world`` (collective), once.

    Returns whether it runs. Ranks that share a GPU do not start it (NCCL
    refuses them; :func:`status` says why). Raises RuntimeError where JAX
    already computed in this process (too late to join a runtime).
    """
    if _state:
        return running()
    t0 = time.perf_counter()
    late = devices.jax_started()
    binding = devices.current()
    shared = binding is not None and binding.shared_by > 1
    found = world.allgather((late, shared))
    if any(late for late, _ in found):
        ranks = [r for r, (late, _) in enumerate(found) if late]
        raise RuntimeError(
            f"allreduce=xla: JAX already computed on rank {ranks[0]} before its "
            "distributed runtime started; call research.comm.dense.xla."
            "start(world) right after get_world(), before any JAX array"
        )
    if any(s for _, s in found):
        _state.update(started=False, reason="ranks share a GPU (NCCL refuses them)")
        return False
    platform = binding.platform if binding else devices.planned_platform()[0]
    address = world.bcast(_coordinator(world) if world.rank == 0 else None)
    if platform == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    else:
        _bound_nccl()
    jax.distributed.initialize(
        coordinator_address=address,
        num_processes=world.size,
        process_id=world.rank,
        local_device_ids=[0] if platform == "gpu" else None,
        initialization_timeout=INIT_TIMEOUT_S,
        shutdown_timeout_seconds=SHUTDOWN_TIMEOUT_S,
    )
    _state.update(
        started=True,
        coordinator=address,
        collectives="nccl" if platform == "gpu" else "gloo",
        start_s=round(time.perf_counter() - t0, 3),
    )
    return True


def nccl_timeout_flag(setting: float | str | None) -> str | None:
    """The XLA flag that bounds NCCL's wait, from the watchdog's ``setting``
    (seconds, ``"auto"``, None: off): None where the watchdog is off."""
    if setting is None:
        return None
    from research.comm.faults.watchdog import DEFAULT_TIMEOUT_S

    base = DEFAULT_TIMEOUT_S if setting == "auto" else float(setting)
    return f"{_NCCL_FLAG}={int(base + NCCL_MARGIN_S)}"


def _bound_nccl() -> None:
    """Put :func:`nccl_timeout_flag` into ``XLA_FLAGS`` (read when JAX's GPU
    backend starts, which :func:`start` precedes), unless the user set it."""
    from research.comm.faults import watchdog

    dog = watchdog.get()
    setting = (
        dog.setting if dog else watchdog.parse_timeout(os.environ.get(watchdog.ENV))
    )
    flag = nccl_timeout_flag(setting)
    flags = os.environ.get("XLA_FLAGS", "")
    if flag and _NCCL_FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {flag}".strip()
        _state["nccl_timeout_flag"] = flag


def _coordinator(world: Any) -> str:
    """Rank 0's ``host:port`` for the coordinator: loopback on one node."""
    host = "127.0.0.1"
    if world.nodes > 1:
        host = socket.gethostbyname(socket.gethostname())
    with socket.socket() as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    return f"{host}:{port}"


def mesh() -> jax.sharding.Mesh:
    """One device per rank, in rank order, along :data:`AXIS`."""
    if not _mesh:
        devs = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
        _mesh.append(jax.sharding.Mesh(np.array(devs), (AXIS,)))
    return _mesh[0]


def is_global(x: Any) -> bool:
    """Whether ``x`` is already a global array of the mesh (not this rank's)."""
    return isinstance(x, jax.Array) and not x.is_fully_addressable


def to_global(x: Any) -> jax.Array:
    """This rank's array (0-d as ``(1,)``) as its block of a global array."""
    if is_global(x):
        return x
    x = jax.device_put(x, jax.local_devices()[0])
    if x.ndim == 0:
        x = x.reshape((1,))
    m = mesh()
    shape = (m.size * x.shape[0], *x.shape[1:])
    sharding = jax.sharding.NamedSharding(m, jax.sharding.PartitionSpec(AXIS))
    return jax.make_array_from_single_device_arrays(shape, sharding, [x])


def to_local(x: jax.Array, scalar: bool) -> jax.Array:
    """The block of global ``x`` this rank holds (``()`` again where ``scalar``)."""
    block = x.addressable_data(0)
    return block.reshape(()) if scalar else block


class Spmd:
    """A per-rank function run as one program of all ranks on the mesh.

    Inside ``fn`` each rank sees its own arrays, as it passed them, and may
    call ``lax.psum(..., AXIS)``. ``state`` (the first argument) may be given
    as this rank's tree or as the global tree an earlier call returned, which
    then stays global (no conversion per call: :meth:`local` converts it
    back); the other results come back as this rank's arrays.

    Args:
      fn: ``fn(state, *args) -> (state, *outs)``.
      donate: donate ``state``'s buffers to the program (``donate_argnums=0``).
    """

    def __init__(self, fn: Callable[..., Any], donate: bool = False) -> None:
        self.fn = fn
        self.donate = donate
        self._programs: dict[Any, Any] = {}
        self._scalars: dict[Any, list[bool]] = {}  # treedef -> 0-d leaves

    def __call__(self, state: Any, *args: Any) -> Any:
        s_leaves, s_def = jax.tree.flatten(state)
        a_leaves, a_def = jax.tree.flatten(args)
        if s_def not in self._scalars or not all(map(is_global, s_leaves)):
            self._scalars[s_def] = [np.ndim(x) == 0 for x in s_leaves]
        a_scalars = [np.ndim(x) == 0 for x in a_leaves]
        key = (s_def, a_def, tuple(a_scalars))
        if key not in self._programs:
            self._programs[key] = self._program(s_def, a_def, a_scalars)
        program, info = self._programs[key]
        s_out, rest = program(
            [to_global(x) for x in s_leaves], [to_global(x) for x in a_leaves]
        )
        # ``info``: the results' structure, filled in when the program traced.
        out_def, out_scalars = info["state"]
        self._scalars[out_def] = out_scalars
        rest_def, rest_scalars = info["rest"]
        outs = [to_local(x, s) for x, s in zip(rest, rest_scalars)]
        return (out_def.unflatten(s_out), *rest_def.unflatten(outs))

    def local(self, state: Any) -> Any:
        """``state`` as this rank's arrays (a global tree from a call, or as is)."""
        leaves, treedef = jax.tree.flatten(state)
        if not any(map(is_global, leaves)):
            return state
        scalars = self._scalars[treedef]
        return treedef.unflatten([to_local(x, s) for x, s in zip(leaves, scalars)])

    def _program(self, s_def: Any, a_def: Any, a_scalars: list[bool]) -> Any:
        s_scalars = self._scalars[s_def]
        info: dict[str, Any] = {}
        spec = jax.sharding.PartitionSpec(AXIS)

        def unpack(blocks: list, scalars: list[bool]) -> list:
            return [b.reshape(()) if s else b for b, s in zip(blocks, scalars)]

        def pack(tree: Any, name: str) -> list:
            leaves, treedef = jax.tree.flatten(tree)
            scalars = [x.ndim == 0 for x in leaves]
            info[name] = (treedef, scalars)
            return [x.reshape((1,)) if s else x for x, s in zip(leaves, scalars)]

        def body(s_blocks: list, a_blocks: list) -> tuple[list, list]:
            state = s_def.unflatten(unpack(s_blocks, s_scalars))
            args = a_def.unflatten(unpack(a_blocks, a_scalars))
            new_state, *rest = self.fn(state, *args)
            return pack(new_state, "state"), pack(rest, "rest")

        mapped = jax.shard_map(body, mesh=mesh(), in_specs=spec, out_specs=spec)
        program = jax.jit(mapped, donate_argnums=(0,) if self.donate else ())
        return program, info


def _mean(tree: Any) -> Any:
    return jax.lax.pmean(tree, AXIS)


_MEAN = Spmd(lambda tree: (_mean(tree),))


def mean(tree: Any) -> Any:
    """The mean of this rank's ``tree`` over all ranks (every rank calls it)."""
    return _MEAN.local(_MEAN(tree)[0])
