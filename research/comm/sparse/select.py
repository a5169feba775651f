"""Top-k selection with error feedback at memory speed: one pass, exact result.

Each step, for every segment of the flat gradient (all of it for global top-k,
each parameter array for per-layer top-k), this keeps the residual ``R`` in
place and returns the ``k`` entries of largest magnitude of ``acc = R + (g + wd
* p)``::

    sel = TopKSelector(sizes, ks, wd=0.0, error_feedback=True)
    R = np.zeros(sel.dim, np.float32)                 # the residual, kept by you
    idx, vals = sel.select(R, grad_leaves, param_leaves)   # R updated in place
    # idx: sorted int32 positions; vals = acc[idx]; R = acc with idx zeroed

How, per segment of ``n`` entries:

1. *Threshold from a sample* (before the pass): ``acc`` at ``s`` stratified
   positions (one uniformly drawn in each of ``s`` equal strata), computed with
   the same float32 operations as the pass; the threshold is the sample's
   ``m``-th largest magnitude for ``m = (k / n)(1 + margin) s``. The number of
   entries above it is then ``k (1 + margin)`` with a relative spread of about
   ``1 / sqrt(k s / n)`` whatever the distribution (a quantile's sampling
   error); ``s`` is chosen so that ``k s / n = SAMPLE_HITS`` (1024: 3%), and
   ``margin = MARGIN`` (4 spreads), so fewer than ``k`` candidates happen about
   once in 30,000 steps.
2. *One fused pass* in chunks that stay in cache: ``R += g (+ wd p)``, the
   magnitude as integer bits (``bits & 0x7fffffff``: ordered like ``|x|``, NaN
   above infinity), candidates ``>= threshold``, their values gathered and
   their entries in ``R`` zeroed.
3. *Trim to exactly k*: the candidates' ``k``-th largest magnitude (a partition
   over ~1.13 k values); candidates below it go back into ``R`` bit for bit.
   With fewer than ``k`` candidates (rare), the rest comes from an exact
   selection over the segment's remaining entries.

Every entry above the threshold is a candidate and every other entry is below
every candidate, so the result is the exact top-k set, ties broken towards the
lower index: the sample decides only how fast, never what is selected. The
count is exactly ``k`` (tolerance 0) and the residual is exact: for every
position ``sent + kept == acc`` bit for bit (one of the two is +0.0). NaN
counts as the largest magnitude, as in ``jax.lax.top_k``, so it is sent and
shows.

Segments smaller than ``EXACT_BELOW`` entries, or where the sample would cover
half the segment, skip the sample and select exactly after the pass.

Measured with ``python -m scripts.bench_select`` (the current figures are in
``experiments/sparcml.py``'s docstring; what was tried first is in
``docs/journal.md``): at ResNet-50 size it costs about 2.3 memory passes and
1/30 of the jitted ``jax.lax.top_k``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

#: Expected sample entries above the threshold (sets the sample size).
SAMPLE_HITS = 1024
#: Candidates aimed at: k (1 + MARGIN); 4 spreads of a 1024-hit sample.
MARGIN = 4.0 / math.sqrt(SAMPLE_HITS)
#: Segments below this many entries are selected exactly after the pass.
EXACT_BELOW = 1 << 16
#: Entries per chunk of the fused pass (1 MiB of float32: stays in L2).
CHUNK = 1 << 18
_MAG = np.uint32(0x7FFFFFFF)


def k_for(density: float, n: int) -> int:
    """Entries sent out of ``n`` at ``density`` (at least 1, at most ``n``)."""
    return max(1, min(int(n), math.ceil(density * int(n))))


def top_mask(keys: np.ndarray, m: int) -> np.ndarray:
    """Boolean mask of the ``m`` largest ``keys``, ties to the lower index.

    Args:
      keys: 1-D uint32 magnitude keys (``bits & 0x7fffffff``).
      m: how many to keep, ``0 <= m <= keys.size``.
    """
    n = keys.shape[0]
    if m >= n:
        return np.ones(n, bool)
    if m <= 0:
        return np.zeros(n, bool)
    kth = np.partition(keys, n - m)[n - m]
    keep = keys > kth
    short = m - int(np.count_nonzero(keep))
    if short:
        ties = np.flatnonzero(keys == kth)[:short]
        keep[ties] = True
    return keep


class TopKSelector:
    """Exact top-k per segment with error feedback in one pass (module docstring).

    Args:
      sizes: element counts of the leaves, in ``ravel_pytree`` order.
      ks: entries to select per segment.
      segments: ``(first leaf, end leaf)`` per segment; default one segment of
        all leaves (global top-k). Per-layer: ``[(i, i + 1) for each leaf]``.
      wd: weight decay added to the gradient (``g + wd * p``), 0 for none.
      error_feedback: add the residual and keep what is not sent in it; False:
        the residual buffer is only scratch (overwritten with ``acc``).
      seed: seeds the sample positions (per step: ``[seed, step]``).
    """

    def __init__(
        self,
        sizes: Sequence[int],
        ks: Sequence[int],
        *,
        segments: Sequence[tuple[int, int]] | None = None,
        wd: float = 0.0,
        error_feedback: bool = True,
        seed: int = 0,
    ) -> None:
        self.sizes = [int(n) for n in sizes]
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.dim = int(self.offsets[-1])
        if self.dim >= 2**31:
            raise ValueError("TopKSelector: more than 2**31 - 1 entries")
        if segments is None:
            segments = [(0, len(self.sizes))]
        self.segments = [(int(a), int(b)) for a, b in segments]
        self.ks = [int(k) for k in ks]
        if len(self.ks) != len(self.segments):
            raise ValueError(f"{len(self.ks)} ks for {len(self.segments)} segments")
        for (a, b), k in zip(self.segments, self.ks):
            n = int(self.offsets[b] - self.offsets[a])
            if not 0 <= k <= n:
                raise ValueError(f"k={k} outside [0, {n}] for leaves {a}:{b}")
        self.wd = np.float32(wd)
        self.error_feedback = bool(error_feedback)
        self.seed = int(seed)
        self._fs = np.empty(CHUNK, np.float32)
        self._us = np.empty(CHUNK, np.uint32)
        self._bm = np.empty(CHUNK, bool)
        #: Candidates found by the last call's pass, per segment (for tests
        #: and benchmarks: how close the sample's threshold came to k).
        self.last_candidates: list[int] = []

    @property
    def k(self) -> int:
        return sum(self.ks)

    def _acc_at(self, R, grads, params, pos: np.ndarray, a: int, b: int):
        """``acc`` at sorted flat positions ``pos`` within leaves ``a:b``."""
        out = np.empty(pos.shape[0], np.float32)
        cuts = np.searchsorted(pos, self.offsets[a : b + 1])
        for leaf, lo, hi in zip(range(a, b), cuts[:-1], cuts[1:]):
            if lo == hi:
                continue
            p = pos[lo:hi]
            g = grads[leaf][p - self.offsets[leaf]]
            if self.wd:
                g = g + self.wd * params[leaf][p - self.offsets[leaf]]
            out[lo:hi] = R[p] + g if self.error_feedback else g
        return out

    def _threshold(self, R, grads, params, seg: int, step: int) -> int | None:
        """The segment's candidate threshold as a magnitude key, None: exact."""
        (a, b), k = self.segments[seg], self.ks[seg]
        n = int(self.offsets[b] - self.offsets[a])
        if k == 0:
            return None
        s = math.ceil(SAMPLE_HITS * n / k)
        if n < EXACT_BELOW or 2 * s > n:
            return None
        rng = np.random.default_rng([self.seed, seg, step])
        stride = n / s
        pos = (np.arange(s) * stride).astype(np.int64)
        pos += (rng.random(s) * stride).astype(np.int64)
        np.minimum(pos, n - 1, out=pos)
        pos += self.offsets[a]
        keys = self._acc_at(R, grads, params, pos, a, b).view(np.uint32) & _MAG
        m = min(s, math.ceil(k / n * (1 + MARGIN) * s))
        key = int(np.partition(keys, s - m)[s - m])
        return max(key, 1)  # a zero threshold would make every entry a candidate

    def select(
        self,
        R: np.ndarray,
        grads: Sequence[np.ndarray],
        params: Sequence[np.ndarray] | None = None,
        step: int = 0,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Selected positions (sorted int32) and values; ``R`` becomes the residual.

        Args:
          R: float32 residual of length ``dim``, C-contiguous; updated in place
            (with ``error_feedback=False`` it is scratch: its input is ignored
            and it ends holding ``acc``).
          grads: the gradient's leaves as flat float32 arrays (zero-copy views
            of jax CPU arrays do).
          params: the parameters' leaves likewise (needed when ``wd``).
          step: seeds the sample positions.
        """
        if R.dtype != np.float32 or R.shape != (self.dim,):
            raise ValueError(f"R must be float32 of shape ({self.dim},)")
        if len(grads) != len(self.sizes):
            raise ValueError(
                f"{len(grads)} gradient leaves, expected {len(self.sizes)}"
            )
        if self.wd and params is None:
            raise ValueError("weight decay needs the parameter leaves")
        grads = [np.asarray(g).reshape(-1) for g in grads]
        params = [np.asarray(p).reshape(-1) for p in params] if self.wd else None
        idx_out, val_out, self.last_candidates = [], [], []
        for seg, (a, b) in enumerate(self.segments):
            t = self._threshold(R, grads, params, seg, step)
            idx, vals = self._pass(R, grads, params, a, b, t)
            self.last_candidates.append(int(idx.size))
            idx, vals = self._trim(R, idx, vals, a, b, self.ks[seg])
            idx_out.append(idx)
            val_out.append(vals)
        idx = np.concatenate(idx_out) if len(idx_out) > 1 else idx_out[0]
        vals = np.concatenate(val_out) if len(val_out) > 1 else val_out[0]
        return idx.astype(np.int32, copy=False), vals

    def _pass(self, R, grads, params, a: int, b: int, t: int | None):
        """Accumulate leaves ``a:b`` into ``R``; candidates ``>= t`` out of it."""
        fs, us, bm = self._fs, self._us, self._bm
        ef, wd = self.error_feedback, self.wd
        idx, vals = [], []
        for leaf in range(a, b):
            g, base = grads[leaf], int(self.offsets[leaf])
            for lo in range(0, g.shape[0], CHUNK):
                hi = min(lo + CHUNK, g.shape[0])
                m = hi - lo
                r = R[base + lo : base + hi]
                src = g[lo:hi]
                if wd:
                    np.multiply(params[leaf][lo:hi], wd, out=fs[:m])
                    src = np.add(src, fs[:m], out=fs[:m])
                if ef:
                    np.add(r, src, out=r)
                else:
                    np.copyto(r, src)
                if t is None:
                    continue
                np.bitwise_and(r.view(np.uint32), _MAG, out=us[:m])
                np.greater_equal(us[:m], t, out=bm[:m])
                loc = np.flatnonzero(bm[:m])
                if loc.size:
                    vals.append(r[loc])
                    if ef:
                        r[loc] = 0.0
                    idx.append(loc + (base + lo))
        if not idx:
            return np.empty(0, np.int64), np.empty(0, np.float32)
        return np.concatenate(idx), np.concatenate(vals)

    def _trim(self, R, idx, vals, a: int, b: int, k: int):
        """Exactly ``k`` of the segment: the largest candidates, or more if short."""
        ef = self.error_feedback
        if idx.size > k:
            keep = top_mask(vals.view(np.uint32) & _MAG, k)
            if ef:
                back = ~keep
                R[idx[back]] = vals[back]  # bit for bit what was there
            return idx[keep], vals[keep]
        if idx.size == k:
            return idx, vals
        # Too few candidates (or no sample): the rest exactly from what is left.
        lo, hi = int(self.offsets[a]), int(self.offsets[b])
        keys = R[lo:hi].view(np.uint32) & _MAG
        # Candidates are out of the running; everything left is below them.
        taken = np.zeros(hi - lo, bool)
        taken[idx - lo] = True
        free = np.flatnonzero(~taken)
        more = free[top_mask(keys[free], k - idx.size)] + lo
        extra = R[more].copy()
        if ef:
            R[more] = 0.0
        order = np.argsort(np.concatenate([idx, more]), kind="stable")
        return (
            np.concatenate([idx, more])[order],
            np.concatenate([vals, extra])[order],
        )
