"""A model run stage by stage: forward per stage, backward per stage with ``jax.vjp``.

A strategy that communicates per stage (SC18 overlap: a stage's reduce-scatter
starts as soon as its gradient exists; SC19: per-stage timing) needs the gradient
in pieces, in backward order, while the rest of the backward pass still runs.
``StagedGrad`` gives exactly that for any model following ``models.staging``
(every model in ``models/``): ``split_model`` cuts the parameter tree (and the
BatchNorm statistics) into disjoint subtrees by top-level submodule, one per stage;
``forward`` runs the stages in order, each one jitted program that returns its
output, its new statistics and the residuals of its ``vjp`` (they stay on the
device); ``backward`` then runs the stages' backward programs in reverse and
yields each stage's parameter gradient as soon as it is dispatched.

The loss is the monolithic step's (``research.steps.jitted.grad_fn``): mean softmax
cross-entropy on float32 logits, accuracy as a metric, dropout keyed by
``fold_in(state.rng, state.step)``; weight decay lives in the optimizer, not in
the loss. ``tests/test_stages.py`` checks gradients, loss and statistics against
``grad_fn`` for every model family.

Cost, measured with ``python -m scripts.bench_stages`` (batch 8 at 64x64, both
ways in one process with the same XLA flags, interleaved, median of 5, on two
cores shared with other jobs, load average 1.4 to 2.4): staged / monolithic
1.03 for ResNet-50 (0.703 s vs 0.680 s, 18 stages) and 0.98 for VGG-16 (1.385 s
vs 1.407 s, 8 stages). Before ``_Residuals``, VGG-16 cost 1.60x although its
forward and backward timed apart summed to the monolithic time: a jitted
function copies every array it returns, and a stage's vjp holds its own
parameters, so each step copied fc1's 411 MB kernel into fresh (page-faulting)
memory. Dispatch is small beside that: a staged ResNet-50 step spends about
40 ms of host time on its 37 programs, overlapped with their execution. The
rest of ResNet-50's 3% is that and the elementwise fusions cut at the 17 block
boundaries (XLA:CPU runs convolutions and matrix products as library calls,
which do not fuse with their neighbours in the monolithic program either).

FC-activation exchange (SC18): a stage made only of dense layers
(``models.staging.TappedDense``) can run *tapped* (``StagedGrad(exchange=...)``):
its forward also returns each layer's input and its backward yields, instead of
the parameter gradient, each layer's output error ``dz`` (the gradient with
respect to a zero-valued perturbation at the output). ``dense_grads`` turns the
inputs and errors of every rank into the parameter gradient. The stage's own
kernel gradient is then never computed (nor its ``in x out`` buffer written).

This module is pure JAX: no MPI; from ``models/`` only the stage protocol
(``models.staging``: the taps' collection names).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from models.staging import TAP_ERRORS, TAP_INPUTS
from research.steps.split import Stage, Tree, group_stages, split_model
from research.steps.state import TrainState

__all__ = ["Stage", "StagedGrad", "dense_grads", "group_stages", "split_model"]


@jax.tree_util.register_pytree_node_class
class _Residuals:
    """A stage's vjp without the residuals that are its own inputs or output.

    A jitted function copies every array it returns into a fresh buffer, even
    one that is just an argument: returned whole, a vjp would copy the stage's
    parameters and activations every step (measured on VGG-16 at 64x64, batch
    8: its 411 MB fc1 kernel, 1.43 s per step instead of 1.10 s). Those residuals
    are left out and given back to the backward program as arguments instead.
    ``plan`` (static) is the vjp's tree structure and, per leaf, the index of the
    known array it is, or -1 for one kept here.
    """

    def __init__(self, kept: list, plan: tuple):
        self.kept, self.plan = kept, plan

    def tree_flatten(self):
        return self.kept, self.plan

    @classmethod
    def tree_unflatten(cls, plan, kept):
        return cls(list(kept), plan)

    @classmethod
    def strip(cls, vjp: Callable, known: Sequence[Any]) -> _Residuals:
        leaves, treedef = jax.tree_util.tree_flatten(vjp)
        where = {id(k): i for i, k in enumerate(known)}
        src = tuple(where.get(id(leaf), -1) for leaf in leaves)
        kept = [leaf for leaf, i in zip(leaves, src, strict=True) if i < 0]
        return cls(kept, (treedef, src))

    def rebuild(self, known: Sequence[Any]) -> Callable:
        treedef, src = self.plan
        kept = iter(self.kept)
        leaves = [next(kept) if i < 0 else known[i] for i in src]
        return jax.tree_util.tree_unflatten(treedef, leaves)


def _stage_backward(
    params: Tree, x: Any, y: Any, res: _Residuals, ct: Any, post: Callable | None
):
    """Gradient leaves (in ``params``' order), or ``post(leaves)``, and, unless
    first, the input's cotangent."""
    grads, *ct_x = res.rebuild(jax.tree_util.tree_leaves((params, x, y)))(ct)
    leaves = jax.tree_util.tree_leaves(grads)
    return (leaves if post is None else post(leaves)), *ct_x


def _loss_head(logits: jax.Array, y: jax.Array):
    """The monolithic step's loss and accuracy, with the loss's vjp."""

    def loss_fn(logits):
        logits = logits.astype(jnp.float32)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        acc = (jnp.argmax(logits, -1) == y).mean()
        return loss, acc

    loss, vjp, acc = jax.vjp(loss_fn, logits, has_aux=True)
    return loss, acc, vjp


#: How many ``StagedGrad.shared`` instances a process keeps.
SHARED_MAX = 4
_SHARED: dict[tuple, StagedGrad] = {}


class StagedGrad:
    """Gradient of a model computed stage by stage, each stage one jitted program.

    Use ``forward`` then ``backward`` (a generator, gradients in reverse stage
    order), or ``grad`` for the whole gradient at once (``grad_fn``'s contract).
    Compiled programs are cached per stage; a new input shape compiles anew.

    Args:
        model: a module following ``models.staging`` (every model here).
        stages: its stages; ``split_model(model)`` when omitted.
        exchange: indices of stages to run tapped (each ``exchangeable``):
            ``forward`` keeps their layers' inputs in ``taps`` and ``backward``
            yields their layers' output errors instead of parameter gradients.
    """

    def __init__(
        self,
        model: nn.Module,
        stages: Sequence[Stage] | None = None,
        exchange: Sequence[int] = (),
    ):
        self.model = model
        self.stages = tuple(stages if stages is not None else split_model(model))
        if not self.stages:
            raise ValueError("a model needs at least one stage")
        self.exchange = frozenset(exchange)
        for i in self.exchange:
            if not 0 <= i < len(self.stages) or not self.stages[i].exchangeable:
                raise ValueError(
                    f"stage {i} cannot exchange activations: only a stage made "
                    "of tapped dense layers (models.staging.TappedDense) can"
                )
        #: After ``forward``: stage index -> its tapped layers' inputs, in
        #: ``tap_keys`` order (tapped stages only).
        self.taps: dict[int, list[jax.Array]] = {}
        self._forward = [jax.jit(self._stage_forward(s)) for s in self.stages]
        self._eval = [jax.jit(self._stage_eval(s)) for s in self.stages]
        self._loss = jax.jit(_loss_head)
        # One program per stage: jit keys on the residuals' static plan, which
        # holds the vjp function each stage's forward traced (once per shape).
        self._backward = jax.jit(_stage_backward, static_argnames="post")
        self._loss_backward = jax.jit(lambda vjp, ct: vjp(ct))
        self._saved: list[tuple] | None = None
        self._loss_vjp: Callable | None = None
        self.batch_stats: Tree | None = None

    @classmethod
    def shared(cls, model: nn.Module, exchange: Sequence[int] = ()) -> StagedGrad:
        """One instance per ``(model, exchange)`` in the process (the last
        ``SHARED_MAX`` kept), so a later run of the same model (a study runs
        many) traces and compiles none of its programs again: they are the
        instance's jitted functions. The instance holds a step's residuals only
        between ``forward`` and ``backward``, so two users must not interleave
        steps (one trainer steps at a time in a process)."""
        key = (model, frozenset(exchange))
        found = _SHARED.pop(key, None)
        if found is None:
            stages = split_model(model)
            found = cls(model, stages, exchange)
        _SHARED[key] = found  # most recently used last
        while len(_SHARED) > SHARED_MAX:
            _SHARED.pop(next(iter(_SHARED)))
        return found

    def _stage_forward(self, stage: Stage) -> Callable:
        if stage.index in self.exchange:
            return self._tapped_forward(stage)
        apply, span = self.model.apply, stage.span
        has_stats, first = bool(stage.stat_keys), stage.span[0] == 0

        def run(params, stats, x, rng, step):
            rngs = {"dropout": jax.random.fold_in(rng, step)}

            def f(params, x):
                if not has_stats:
                    y = apply({"params": params}, x, train=True, stages=span, rngs=rngs)
                    return y, {}
                y, new = apply(
                    {"params": params, "batch_stats": stats},
                    x,
                    train=True,
                    stages=span,
                    mutable=["batch_stats"],
                    rngs=rngs,
                )
                return y, new["batch_stats"]

            if first:  # the input needs no gradient: differentiate params only
                y, vjp, new = jax.vjp(lambda p: f(p, x), params, has_aux=True)
            else:
                y, vjp, new = jax.vjp(f, params, x, has_aux=True)
            known = jax.tree_util.tree_leaves((params, x, y))
            # Leaves, not dicts: a result's key path is written into the program,
            # so identical blocks compile to identical programs (and share an
            # entry of JAX's persistent compilation cache) only without names.
            res = _Residuals.strip(vjp, known)
            return y, jax.tree_util.tree_leaves(new), res, []

        return run

    def _tapped_forward(self, stage: Stage) -> Callable:
        """Like ``_stage_forward``, differentiating the perturbations at the
        layers' outputs (and the input) instead of the parameters, and also
        returning the layers' inputs."""
        apply, span, keys = self.model.apply, stage.span, stage.tap_keys
        has_stats, first = bool(stage.stat_keys), stage.span[0] == 0
        mutable = [TAP_INPUTS, *(["batch_stats"] if has_stats else [])]

        def run(params, stats, x, rng, step):
            rngs = {"dropout": jax.random.fold_in(rng, step)}
            variables = {
                "params": params,
                **({"batch_stats": stats} if has_stats else {}),
            }
            zeros = jax.eval_shape(
                lambda: apply(
                    variables,
                    x,
                    train=True,
                    stages=span,
                    rngs=rngs,
                    mutable=[TAP_ERRORS, *mutable],
                )[1][TAP_ERRORS]
            )
            zeros = jax.tree_util.tree_map(lambda a: jnp.zeros(a.shape, a.dtype), zeros)

            def f(errors, x):
                y, new = apply(
                    {**variables, TAP_ERRORS: errors},
                    x,
                    train=True,
                    stages=span,
                    mutable=mutable,
                    rngs=rngs,
                )
                inputs = [new[TAP_INPUTS][k]["x"][0] for k in keys]
                return y, (
                    jax.tree_util.tree_leaves(new.get("batch_stats", {})),
                    inputs,
                )

            if first:
                y, vjp, (new, inputs) = jax.vjp(lambda e: f(e, x), zeros, has_aux=True)
            else:
                y, vjp, (new, inputs) = jax.vjp(f, zeros, x, has_aux=True)
            known = jax.tree_util.tree_leaves((params, x, y))
            return y, new, _Residuals.strip(vjp, known), inputs

        return run

    def _stage_eval(self, stage: Stage) -> Callable:
        apply, span = self.model.apply, stage.span

        def run(variables, x):
            return apply(variables, x, train=False, stages=span)

        return run

    def forward(
        self,
        state: TrainState,
        x: Any,
        y: Any,
        stage_params: Callable[[int], Tree] | None = None,
        after_stage: Callable[[int, jax.Array], None] | None = None,
    ) -> dict[str, jax.Array]:
        """Runs the training forward pass stage by stage and the loss.

        Keeps what every stage's backward needs (its residuals, and references
        to its parameters, input and output); sets ``batch_stats``
        to the new statistics (``state.batch_stats`` for models without any).

        Args:
            state: parameters, statistics, dropout key and step.
            x: a batch of inputs.
            y: integer labels.
            stage_params: optional ``i -> stage i's params``, called just before
                stage ``i`` runs (it may wait, e.g. for gathered parameters);
                defaults to the subtrees of ``state.params``.
            after_stage: optional ``(i, stage i's output)``, called right after
                stage ``i`` is dispatched (it may block on the output, e.g. to
                time the stage).

        Returns:
            ``{"loss": ..., "acc": ...}`` as device scalars.
        """
        # Every argument committed to the one device: a jitted program is
        # looked up by its arguments' placement too, and arrays from numpy,
        # from dlpack and from other programs differ in it (uncommitted or
        # not), so each step would lower and load every stage's programs anew
        # until the mix settled (steps 2 and 3 of a ResNet-50 run took 1.5 s
        # and 0.8 s instead of 0.24 s).
        saved, new_stats, h = [], {}, commit(jnp.asarray(x))
        rng, step = commit((state.rng, state.step))
        self.taps = {}
        for stage, fwd in zip(self.stages, self._forward, strict=True):
            params = stage_params(stage.index) if stage_params else None
            if params is None:
                params = stage.params(state.params)
            stats = stage.stats(state.batch_stats) if stage.stat_keys else {}
            params, stats = commit((params, stats))
            out, new, res, inputs = fwd(params, stats, h, rng, step)
            if inputs:
                self.taps[stage.index] = inputs
            if stage.stat_keys:
                treedef = jax.tree_util.tree_structure(stats)
                new_stats.update(jax.tree_util.tree_unflatten(treedef, new))
            saved.append((params, h, out, res))
            if after_stage is not None:
                after_stage(stage.index, out)
            h = out
        loss, acc, self._loss_vjp = self._loss(h, y)
        self._saved = saved
        self.batch_stats = new_stats if new_stats else state.batch_stats
        return {"loss": loss, "acc": acc}

    def backward(
        self,
        loss_cotangent: float = 1.0,
        post: Callable[[int], Callable[[list], Any]] | None = None,
    ) -> Iterator[tuple[int, Any]]:
        """Yields ``(stage index, that stage's parameter gradient)``, last first.

        Each gradient is yielded as soon as its program is dispatched, before
        the next (earlier) stage's backward starts, so a caller may start its
        communication at once. Residuals of a stage are released after use.
        A tapped stage (``exchange``) yields instead the list of its layers'
        output errors, in ``tap_keys`` order (``dense_grads`` makes them a
        gradient).

        Args:
            loss_cotangent: scale of the loss's cotangent (1.0: plain gradient).
            post: optional ``i -> f``, ``f`` hashable, mapping stage ``i``'s
                gradient leaves (in ``params``' order; a tapped stage's errors)
                to what is yielded instead, computed inside the stage's
                backward program (e.g. packing them into one message buffer:
                the leaves are then never materialised on their own).

        Raises:
            RuntimeError: without a ``forward`` since the last ``backward``.
        """
        if self._saved is None:
            raise RuntimeError("backward() needs a forward() first")
        saved, self._saved = self._saved, None
        loss_vjp, self._loss_vjp = self._loss_vjp, None
        ct = jnp.asarray(loss_cotangent, jnp.float32)
        (ct,) = self._loss_backward(loss_vjp, ct)
        for i in reversed(range(len(saved))):
            treedef = jax.tree_util.tree_structure(saved[i][0])
            fn = None if post is None else post(i)
            out, saved[i] = self._backward(*saved[i], ct, post=fn), None
            if i:
                leaves, ct = out
            else:
                (leaves,) = out
            if fn is None and i not in self.exchange:
                leaves = jax.tree_util.tree_unflatten(treedef, leaves)
            yield i, leaves

    def grad(self, state: TrainState, x: Any, y: Any) -> tuple[Tree, Tree, dict]:
        """Whole gradient, new statistics and metrics, like ``step.grad_fn``
        (a tapped stage's from its own inputs and errors, ``dense_grads``)."""
        metrics = self.forward(state, x, y)
        parts = dict(self.backward())
        for i in self.exchange:
            params = self.stages[i].params(state.params)
            parts[i] = dense_grads(params, self.taps[i], parts[i], 1)
        grads = {k: v for i in sorted(parts) for k, v in parts[i].items()}
        return grads, self.batch_stats, metrics

    def logits(self, variables: Tree, x: Any) -> jax.Array:
        """Evaluation forward pass (``train=False``) run stage by stage."""
        h = x
        for stage, run in zip(self.stages, self._eval, strict=True):
            sub = {"params": stage.params(variables["params"])}
            if stage.stat_keys:
                sub["batch_stats"] = stage.stats(variables["batch_stats"])
            h = run(sub, h)
        return h


def commit(tree: Any) -> Any:
    """``tree`` committed to the default device (no copy where it already is)."""
    return jax.device_put(tree, jax.local_devices()[0])


def dense_grads(params: Tree, inputs: Sequence[Any], errors: Sequence[Any], count: int):
    """The gradient of tapped dense layers from their inputs and output errors.

    For a layer ``z = x W + b``, ``dW = x^T dz`` and ``db = sum(dz)`` over every
    row; with the rows of all ``count`` ranks stacked, divided by ``count`` this is
    the mean of the ranks' gradients (each rank's loss a mean over its batch).

    Args:
        params: the stage's parameters, ``{layer: {"kernel", ["bias"]}}``.
        inputs: each layer's input (``(..., in)``), layers in sorted key order.
        errors: each layer's output error (``(..., out)``), in the same order.
        count: what the sums are divided by (the number of ranks stacked).

    Returns:
        The gradient, shaped as ``params``.
    """
    out = {}
    for key, x, dz in zip(sorted(params), inputs, errors, strict=True):
        kernel = params[key]["kernel"]
        x = x.reshape(-1, kernel.shape[0]).astype(jnp.float32)
        dz = dz.reshape(-1, kernel.shape[1]).astype(jnp.float32)
        g = {"kernel": (x.T @ dz / count).astype(kernel.dtype)}
        if "bias" in params[key]:
            g["bias"] = (dz.sum(0) / count).astype(params[key]["bias"].dtype)
        out[key] = g
    return out
