"""The one-pass top-k selector: exact top-k set, exactly k, residual exact."""

from __future__ import annotations

import numpy as np
import pytest

from research.comm.sparse import select as sel_mod
from research.comm.sparse.select import EXACT_BELOW, TopKSelector, top_mask
from research.comm.sparse.vector import MeanBuffer, SparseVector


def reference(acc: np.ndarray, k: int) -> np.ndarray:
    """Sorted positions of the k largest |acc| (NaN largest), ties to lower index."""
    key = (acc.view(np.uint32) & 0x7FFFFFFF).astype(np.int64)
    order = np.lexsort((np.arange(acc.size), -key))
    return np.sort(order[:k])


def leaves(rng, sizes, scale=True):
    return [
        (rng.standard_normal(n) * (rng.lognormal() if scale else 1)).astype(np.float32)
        for n in sizes
    ]


def check_step(sel, R, g, p, step, segments_k):
    """One select call against a reference computed independently."""
    flat_g = np.concatenate(g)
    if sel.wd:
        flat_g = flat_g + sel.wd * np.concatenate(p)
    acc = R + flat_g if sel.error_feedback else flat_g
    idx, vals = sel.select(R, g, p, step)
    want = np.concatenate([reference(acc[lo:hi], k) + lo for (lo, hi), k in segments_k])
    np.testing.assert_array_equal(idx, want)
    assert idx.dtype == np.int32 and idx.size == sum(k for _, k in segments_k)
    assert np.array_equal(vals.view(np.uint32), acc[idx].view(np.uint32))
    if sel.error_feedback:
        # Bit for bit: every position is either sent (kept is +0) or kept.
        sent = np.zeros_like(R)
        sent[idx] = vals
        assert np.array_equal((sent + R).view(np.uint32), acc.view(np.uint32))
        assert not np.any(R[idx])
    return idx


@pytest.mark.parametrize("ef", [True, False])
@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_global_matches_exact_top_k_over_steps(ef, wd):
    rng = np.random.default_rng(0)
    sizes = [70_000, 64, 200_003, 5, 90_000]
    dim = sum(sizes)
    k = 3_600  # sampled: k * s / n = 1024 with s < n / 2
    sel = TopKSelector(sizes, [k], wd=wd, error_feedback=ef, seed=3)
    R = np.zeros(dim, np.float32)
    for step in range(4):
        g, p = leaves(rng, sizes), leaves(rng, sizes)
        check_step(sel, R, g, p, step, [((0, dim), k)])
        cands = sel.last_candidates[0]
        assert k <= cands <= 1.5 * k, cands  # the sample did its job


def test_per_layer_small_and_large_segments():
    rng = np.random.default_rng(1)
    sizes = [300_000, 10, 1_000, EXACT_BELOW + 5, 7]
    ks = [3_000, 1, 10, 700, 1]
    offs = np.concatenate([[0], np.cumsum(sizes)])
    segs = [(i, i + 1) for i in range(len(sizes))]
    sel = TopKSelector(sizes, ks, segments=segs)
    R = np.zeros(offs[-1], np.float32)
    for step in range(3):
        g = leaves(rng, sizes)
        check_step(
            sel,
            R,
            g,
            None,
            step,
            [((offs[i], offs[i + 1]), k) for i, k in enumerate(ks)],
        )


def test_too_few_candidates_falls_back_exactly(monkeypatch):
    # A negative margin aims below k: the pass finds too few, the rest is
    # selected exactly from what is left.
    monkeypatch.setattr(sel_mod, "MARGIN", -0.5)
    rng = np.random.default_rng(2)
    sizes = [400_000]
    sel = TopKSelector(sizes, [4_000])
    R = rng.standard_normal(400_000).astype(np.float32)
    check_step(sel, R, leaves(rng, sizes), None, 0, [((0, 400_000), 4_000)])
    assert sel.last_candidates[0] < 4_000


def test_fewer_nonzeros_than_k_and_ties():
    sizes = [200_000]
    g = np.zeros(200_000, np.float32)
    g[[5, 17, 190_000]] = [1.0, -3.0, 2.0]
    sel = TopKSelector(sizes, [2_000])
    R = np.zeros(200_000, np.float32)
    idx = check_step(sel, R, [g], None, 0, [((0, 200_000), 2_000)])
    # The three nonzeros, then zeros from the lowest index on.
    assert {5, 17, 190_000} <= set(idx.tolist()) and idx[0] == 0
    # All equal magnitudes: the lowest indices win.
    R[:] = 0
    sel2 = TopKSelector(sizes, [2_000])
    idx = sel2.select(R, [np.full(200_000, -0.5, np.float32)])[0]
    np.testing.assert_array_equal(idx, np.arange(2_000))


def test_nan_is_sent_like_top_k():
    rng = np.random.default_rng(4)
    g = rng.standard_normal(300_000).astype(np.float32)
    g[123] = np.nan
    sel = TopKSelector([300_000], [3_000])
    idx, vals = sel.select(np.zeros(300_000, np.float32), [g])
    assert 123 in idx and np.isnan(vals[np.searchsorted(idx, 123)])


def test_top_mask_and_bad_input():
    keys = np.array([5, 1, 5, 3, 5], np.uint32)
    np.testing.assert_array_equal(top_mask(keys, 2), [1, 0, 1, 0, 0])
    assert top_mask(keys, 0).sum() == 0 and top_mask(keys, 9).all()
    sel = TopKSelector([10], [2])
    with pytest.raises(ValueError, match="float32 of shape"):
        sel.select(np.zeros(10, np.float64), [np.zeros(10, np.float32)])
    with pytest.raises(ValueError, match="gradient leaves"):
        sel.select(np.zeros(10, np.float32), [])
    with pytest.raises(ValueError, match="outside"):
        TopKSelector([10], [11])
    with pytest.raises(ValueError, match="parameter leaves"):
        TopKSelector([10], [2], wd=0.1).select(
            np.zeros(10, np.float32), [np.zeros(10, np.float32)]
        )


def test_mean_buffer_matches_to_dense():
    buf = MeanBuffer(1000, 3)
    rng = np.random.default_rng(5)
    for dense in (False, True, False, False):
        if dense:
            v = SparseVector.dense(rng.standard_normal(1000).astype(np.float32))
        else:
            idx = np.sort(rng.choice(1000, 50, replace=False))
            v = SparseVector(idx, rng.standard_normal(50).astype(np.float32), 1000)
        want = v.to_dense() / np.float32(3)
        assert np.array_equal(buf.set(v), want)
