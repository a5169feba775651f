"""Convolution with a matmul kernel gradient: drop-in ``lax.conv_general_dilated``.

Why: XLA:CPU computes the kernel (weight) gradient of a convolution as another
convolution, and for 1x1 kernels and few-input-channel kernels that path is several
times slower than the same contraction written as one matmul. In a whole step it
also costs transposing copies: XLA rewrites each kernel gradient as a convolution
over ``(C, H, W, N)``-ordered copies of ``x`` and ``dy``, and it does not keep the
activations that feed them: block outputs are elementwise expressions (BatchNorm,
residual add, ReLU) of earlier ones, and XLA fuses the whole chain into each
consumer, so each transposing copy recomputes up to 15 earlier blocks while reading
them in transposed, cache-hostile order. With ``dot(patches, dy)`` XLA's dot wants
the contracted axes of its first operand minor, so it copies ``x`` transposed, with
the same recomputation inside; ``dot(dy, patches)`` followed by transposing the
small ``(O, taps * I)`` result makes XLA transpose ``dy`` instead, whose producer is
shallow, and the 1x1 kernel gradients become plain matmuls.

Whole ResNet-50 training steps ran 1.42x faster on XLA:CPU with this module's
kernel gradient (VGG-16, all 3x3 but the first layer: equal within the noise), so
the default, ``auto``, takes the matmul path where JAX computes on the CPU and
XLA's own gradient elsewhere (on a GPU, cuDNN's kernels are what XLA has for
it); ``RESEARCH_CONV_WGRAD=matmul|xla`` (or ``set_weight_grad``) forces one.
It is used for every 1x1 kernel (any stride) and for kernels with
``prod(window) * in_channels <= 64``; other convolutions are left to XLA. The
forward pass and the input gradient are always XLA's. The measurements (taken with
XLA:CPU's convolutions on YNNPACK, before ``models.xla_cpu`` sent them to Eigen;
``scripts/bench_compute.py`` has the whole-step figures since) and what was tried
and not kept are in ``docs/journal.md`` (2026-11-25).

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

MODES = ("auto", "matmul", "xla")
# Largest ``prod(window) * in_channels`` that is gathered into patches for one
# matmul (1x1 kernels always are). Measured: 20 (1-D k20, 1 input) wins 3.4x,
# 147 (the 7x7x3 stem) loses 1.3-2.9x, 1152 (3x3x128) loses 2x.
PATCH_LIMIT = 64

# ``auto``: the matmul path on the CPU, where whole ResNet-50 steps are 1.4x
# faster with it (see the module docstring; ``bench_compute`` compares both in
# every run), XLA's on any other platform.
_mode = os.environ.get("RESEARCH_CONV_WGRAD", "auto")
if _mode not in MODES:
    raise ValueError(f"RESEARCH_CONV_WGRAD must be one of {MODES}, got {_mode!r}")


def set_weight_grad(mode: str) -> str:
    """Selects the kernel-gradient formulation for functions traced from now on.

    Args:
        mode: ``"auto"`` (the default: ``matmul`` where JAX's default backend
            is the CPU, else ``xla``), ``"matmul"`` (this module's, where
            ``_plan`` says it wins) or ``"xla"`` (XLA's own convolution
            gradient everywhere).

    Returns:
        The previous mode.
    """
    global _mode
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    previous, _mode = _mode, mode
    return previous


def get_weight_grad() -> str:
    """The kernel-gradient formulation new traces use (``auto`` resolved)."""
    if _mode == "auto":
        return "matmul" if jax.default_backend() == "cpu" else "xla"
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
    if get_weight_grad() == "xla" or nd < 1 or nd > 3 or rhs.ndim != lhs.ndim:
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
