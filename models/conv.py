"""Convolution with a matmul kernel gradient: drop-in ``lax.conv_general_dilated``.

(The figures below were measured with XLA:CPU's default of running convolutions
on YNNPACK; ``models.xla_cpu`` now sends them to Eigen, and
``scripts/bench_compute.py`` has the whole-step figures since.)

Why: XLA:CPU computes the kernel (weight) gradient of a convolution as another
convolution, and for 1x1 kernels and few-input-channel kernels that path is several
times slower than the same contraction written as one matmul. Measured here
(2 shared cores, batch 16, float32, jitted alone, median of 5, load ~3.5-4.4):

======================================  ===========  ==========
kernel gradient                          XLA's conv   this module
======================================  ===========  ==========
1x1 s1 256->512 at 28x28 (3.3 GFLOP)     116 ms       23 ms
1x1 s1  64->256 at 56x56 (1.6 GFLOP)     174 ms       15-36 ms
1x1 s2 512->1024 28->14 (3.3 GFLOP)      143 ms       21 ms
1-D k20 1->128, length 6000              31 ms        9 ms
3x3 s1 128->128 at 28x28 (3.7 GFLOP)     32 ms        52-88 ms (kept XLA's)
3x3 s1  64->64 at 56x56                  50 ms        107-171 ms (kept XLA's)
7x7 s2 3->64 at 112 (ResNet stem)        17 ms        23-50 ms (kept XLA's)
1-D k10 128->128, length 5981            437 ms       437-784 ms (kept XLA's)
======================================  ===========  ==========

Where a whole ResNet-50 step's time goes (``jax.profiler`` trace of the jitted
gradient step, batch 16 at 112x112, each thunk matched to the optimized HLO;
``python -m scripts.profile_step``; load 3-4, so indicative): with XLA's kernel
gradient, of about 1950 ms of thunk time per step (two threads) convolutions
take 1070 ms, of which the kernel gradients are about 570 ms running at
15-65 GFLOP/s for the 1x1 ones (forward and input gradient run at 100-200), and
**transposing copies take 520 ms**. XLA rewrites each kernel gradient as a
convolution over ``(C, H, W, N)``-ordered copies of ``x`` and ``dy``, and it does
not keep the activations that feed them: block outputs are elementwise
expressions (BatchNorm, residual add, ReLU) of earlier ones, and XLA fuses the
whole chain into each consumer, so each transposing copy recomputes BatchNorm,
residual adds and ReLUs of up to 15 earlier blocks while reading them in
transposed, cache-hostile order (the output of the first block is recomputed
15 times). That is also why the isolated gain of the matmul vanished: with
``dot(patches, dy)`` XLA's dot wants the contracted axes of its first operand
minor, so it copied ``x`` transposed, with the same recomputation inside, and
these copies took 370-890 ms per step, eating the 2-7x faster matmuls.
``dot(dy, patches)`` followed by transposing the small ``(O, taps * I)`` result
makes XLA transpose ``dy`` instead, whose producer is shallow: the copies drop to
about 40-70 ms and the 1x1 kernel gradients become plain matmuls.

Whole training steps, interleaved in one process (``scripts/bench_compute.py``,
2 shared cores): ResNet-50 (batch 16, 112x112) 1460 ms with XLA's kernel
gradient against 1030 ms with this module's (1.42x, load 4-5); VGG-16 (batch 8,
64x64, all 3x3 but the first) 756 against 789 ms (equal within the noise: only
the first layer qualifies). So the matmul path is the default;
``RESEARCH_CONV_WGRAD=xla`` (or ``set_weight_grad("xla")``) restores XLA's. It
is used for every 1x1 kernel (any stride) and for kernels with
``prod(window) * in_channels <= 64``; other convolutions are left to XLA. Tried
and not kept: patches for every kernel (3x3 included) in whole steps, ResNet-50
1046 against 1030 ms, VGG-16 769 against 789 ms; patches up to 3x3x128
(``PATCH_LIMIT = 1152``): ResNet-50 992 against 1009-1036 ms, VGG-16 713 against
725-736 ms (two control columns, 9 steps, load 2), 2-4%, the size of the noise,
for 9x the activation memory of those layers (3.7 GB for VGG-16's 64-channel
layers at 224x224, batch 32); 1x1 stride-1 convolutions written as one
``dot_general`` in the forward pass as well (so that the input gradient is a
matmul too): ResNet-50 1155 against 1028 ms (slower); an
``optimization_barrier`` on convolution inputs to make XLA keep the activations:
XLA:CPU drops it before fusion, and with XLA's kernel gradient the step took 7 s.
The forward pass and the input gradient are always XLA's.

The weight gradient of ``y = conv(x, w)`` (channels last, stride ``s``, padding
``p``) is ``dw[k, i, o] = sum_{n, q} xpad[n, s*q + k, i] * dy[n, q, o]``: for each
kernel offset ``k`` a strided slice of the padded input, the slices concatenated
on the channel axis (one slice for a 1x1 kernel), then one ``dot_general``
contracting batch and output positions. This is exact (same sum, different
order), tested against ``jax.grad`` of ``lax.conv_general_dilated``.

The mode is read when a function is traced, so jit a fresh function after
switching (``jax.jit`` caches traces by function).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import os
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

MODES = ("matmul", "xla")
# Largest ``prod(window) * in_channels`` that is gathered into patches for one
# matmul (1x1 kernels always are). Measured: 20 (1-D k20, 1 input) wins 3.4x,
# 147 (the 7x7x3 stem) loses 1.3-2.9x, 1152 (3x3x128) loses 2x.
PATCH_LIMIT = 64

# The matmul path by default: whole ResNet-50 steps are 1.4x faster with it (see
# the module docstring); ``bench_compute`` compares both in every run.
_mode = os.environ.get("RESEARCH_CONV_WGRAD", "matmul")
if _mode not in MODES:
    raise ValueError(f"RESEARCH_CONV_WGRAD must be one of {MODES}, got {_mode!r}")


def set_weight_grad(mode: str) -> str:
    """Selects the kernel-gradient formulation for functions traced from now on.

    Args:
        mode: ``"matmul"`` (this module's, where ``_plan`` says it wins; the
            default) or ``"xla"`` (XLA's own convolution gradient everywhere).

    Returns:
        The previous mode.
    """
    global _mode
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    previous, _mode = _mode, mode
    return previous


def get_weight_grad() -> str:
    """The kernel-gradient formulation new traces use."""
    return _mode


@contextlib.contextmanager
def weight_grad(mode: str) -> Iterator[None]:
    """Context manager form of ``set_weight_grad``."""
    previous = set_weight_grad(mode)
    try:
        yield
    finally:
        set_weight_grad(previous)


def _channels_last(lhs_ndim: int) -> tuple[str, str, str]:
    spatial = "DHW"[-(lhs_ndim - 2) :] if lhs_ndim <= 5 else None
    if spatial is None:
        raise ValueError("at most 3 spatial dimensions")
    return f"N{spatial}C", f"{spatial}IO", f"N{spatial}C"


def _plan(window: Sequence[int], in_channels: int) -> bool:
    """Whether the matmul kernel gradient is used for this kernel shape."""
    taps = math.prod(window)
    return taps == 1 or taps * in_channels <= PATCH_LIMIT


def conv_general_dilated(
    lhs: jax.Array,
    rhs: jax.Array,
    window_strides: Sequence[int],
    padding: str | Sequence[tuple[int, int]],
    lhs_dilation: Sequence[int] | None = None,
    rhs_dilation: Sequence[int] | None = None,
    dimension_numbers: Any = None,
    feature_group_count: int = 1,
    batch_group_count: int = 1,
    precision: Any = None,
    preferred_element_type: Any = None,
) -> jax.Array:
    """``lax.conv_general_dilated`` with a matmul kernel gradient where it is faster.

    Same arguments and result as ``lax.conv_general_dilated``. The custom gradient
    applies to channels-last convolutions (``NWC``/``NHWC``/``NDHWC`` inputs,
    ``...IO`` kernels, as ``flax.linen.Conv`` builds them) without dilation or
    grouping whose kernel passes ``_plan``; everything else is passed to
    ``lax.conv_general_dilated`` unchanged. Pass it to ``flax.linen.Conv`` as
    ``conv_general_dilated=`` so parameter trees do not change.
    """
    nd = lhs.ndim - 2
    fallback = functools.partial(
        lax.conv_general_dilated,
        lhs,
        rhs,
        window_strides,
        padding,
        lhs_dilation=lhs_dilation,
        rhs_dilation=rhs_dilation,
        dimension_numbers=dimension_numbers,
        feature_group_count=feature_group_count,
        batch_group_count=batch_group_count,
        precision=precision,
        preferred_element_type=preferred_element_type,
    )
    if _mode == "xla" or nd < 1 or nd > 3 or rhs.ndim != lhs.ndim:
        return fallback()
    names = _channels_last(lhs.ndim)
    wanted = lax.conv_dimension_numbers(lhs.shape, rhs.shape, names)
    given = lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
    unit = (1,) * nd
    if (
        given != wanted
        or tuple(lhs_dilation or unit) != unit
        or tuple(rhs_dilation or unit) != unit
        or feature_group_count != 1
        or batch_group_count != 1
        or preferred_element_type is not None
        or not _plan(rhs.shape[:nd], rhs.shape[nd])
    ):
        return fallback()
    strides = tuple(int(s) for s in window_strides)
    if isinstance(padding, str):
        pads = lax.padtype_to_pads(lhs.shape[1:-1], rhs.shape[:nd], strides, padding)
    else:
        pads = padding
    pads = tuple((int(lo), int(hi)) for lo, hi in pads)
    return _conv(lhs, rhs, strides, pads, names, precision)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5))
def _conv(x, w, strides, pads, names, precision):
    return lax.conv_general_dilated(
        x, w, strides, pads, dimension_numbers=names, precision=precision
    )


def _conv_fwd(x, w, strides, pads, names, precision):
    return _conv(x, w, strides, pads, names, precision), (x, w)


def _conv_bwd(strides, pads, names, precision, residuals, dy):
    x, w = residuals

    def forward_in_x(x):
        return lax.conv_general_dilated(
            x, w, strides, pads, dimension_numbers=names, precision=precision
        )

    # XLA's input gradient (a transposed convolution) is fast on CPU; keep it.
    (dx,) = jax.vjp(forward_in_x, x)[1](dy)
    dw = kernel_grad(x, dy, w.shape, strides, pads, precision)
    return dx, dw.astype(w.dtype)


_conv.defvjp(_conv_fwd, _conv_bwd)


def window_slices(
    xp: jax.Array,
    window: Sequence[int],
    strides: Sequence[int],
    out: Sequence[int],
) -> list[jax.Array]:
    """For each window offset (row-major), the strided slice of the padded
    channels-last input ``xp`` that the offset sees at every output position.

    Each slice has shape ``(N, *out, C)``; shared with ``models.pool``.
    """
    slices = []
    for offset in itertools.product(*(range(k) for k in window)):
        start = (0, *offset, 0)
        limit = (
            xp.shape[0],
            *(o + s * (n - 1) + 1 for o, s, n in zip(offset, strides, out)),
            xp.shape[-1],
        )
        slices.append(lax.slice(xp, start, limit, (1, *strides, 1)))
    return slices


def kernel_grad(
    x: jax.Array,
    dy: jax.Array,
    kernel_shape: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[tuple[int, int]],
    precision: Any = None,
) -> jax.Array:
    """Kernel gradient of a channels-last convolution as one matmul over patches.

    Args:
        x: input ``(N, *spatial, I)``.
        dy: output cotangent ``(N, *out_spatial, O)``.
        kernel_shape: ``(*window, I, O)``.
        strides: window strides, one per spatial dimension.
        pads: ``(low, high)`` padding per spatial dimension (may be negative).
        precision: passed to ``lax.dot_general``.

    Returns:
        ``dw`` of shape ``kernel_shape``.
    """
    nd = x.ndim - 2
    window, in_ch = tuple(kernel_shape[:nd]), kernel_shape[nd]
    if len(strides) != nd or len(pads) != nd or x.shape[-1] != in_ch:
        raise ValueError(
            f"shapes disagree: x {x.shape}, kernel {tuple(kernel_shape)}, "
            f"strides {tuple(strides)}, pads {tuple(pads)}"
        )
    config = [(0, 0, 0), *((lo, hi, 0) for lo, hi in pads), (0, 0, 0)]
    xp = lax.pad(x, jnp.zeros((), x.dtype), config)
    slices = window_slices(xp, window, strides, dy.shape[1:-1])
    # Patches in (window..., I) order, which is the kernel's own layout.
    patches = slices[0] if len(slices) == 1 else jnp.concatenate(slices, axis=-1)
    axes = tuple(range(nd + 1))
    # dy first: XLA:CPU's dot wants its first operand's contracted axes minor and
    # copies it transposed. The patches come from x, which in a whole step XLA
    # does not keep but recomputes inside that copy (BatchNorm, the residual add
    # and ReLU of every earlier block); dy's producer is shallow. Only the small
    # (O, taps * I) result is transposed here.
    dwt = lax.dot_general(dy, patches, ((axes, axes), ((), ())), precision=precision)
    return dwt.T.reshape(kernel_shape)
