"""Single-process tests of research.comm.sparse: vectors, merges, quantization,
the wire format and the cost model. The collectives run under mpiexec in
tests/mpi/test_sparse.py."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from research.comm.sparse import (
    DEFAULTS,
    CostModel,
    SparseVector,
    choose,
    dequantize,
    goes_dense,
    index_dtype,
    predicted_bytes,
    predicted_time,
    quant,
    quantize,
    wire,
)
from research.comm.sparse.vector import merge, sum_sorted_runs


def rand_vec(rng, dim, k, dtype=np.float32):
    idx = np.sort(rng.choice(dim, k, replace=False))
    return SparseVector(idx, rng.standard_normal(k).astype(dtype), dim)


# --- SparseVector -------------------------------------------------------------


@pytest.mark.parametrize(
    "indices, values, dim, err",
    [
        ([2, 1], [1.0, 2.0], 5, ValueError),  # unsorted
        ([1, 1], [1.0, 2.0], 5, ValueError),  # duplicate
        ([0, 5], [1.0, 2.0], 5, ValueError),  # out of range
        ([-1, 2], [1.0, 2.0], 5, ValueError),  # negative
        ([0, 1], [1.0], 5, ValueError),  # lengths differ
        ([0.0, 1.0], [1.0, 2.0], 5, TypeError),  # float indices
        ([[0, 1]], [[1.0, 2.0]], 5, ValueError),  # 2-D
        ([0], [1.0], 0, ValueError),  # dim not positive
        ([0], [1.0], 2.5, TypeError),  # dim not an integer
    ],
)
def test_validation(indices, values, dim, err):
    with pytest.raises(err):
        SparseVector(np.asarray(indices), np.asarray(values, np.float32), dim)


def test_values_must_be_float_and_dense_form_sized():
    with pytest.raises(TypeError):
        SparseVector([0, 1], np.array([1, 2]), 4)
    with pytest.raises(ValueError):
        SparseVector(None, np.zeros(3, np.float32), 4)


def test_from_dense_round_trip_and_properties():
    x = np.array([0, 1.5, 0, -2, 0, 0, 3], np.float32)
    v = SparseVector.from_dense(x)
    assert v.nnz == 3 and v.density == pytest.approx(3 / 7)
    assert v.indices.dtype == np.int32 and not v.is_dense
    np.testing.assert_array_equal(v.to_dense(), x)
    d = SparseVector.dense(x)
    assert d.is_dense and d.nnz == 7
    np.testing.assert_array_equal(d.indices, np.arange(7))
    assert SparseVector.empty(10).nnz == 0


def test_int64_indices_for_huge_dim_without_dense_allocation():
    dim = 2**33 + 3
    v = SparseVector(np.array([0, 2**31, 2**32 + 5, dim - 1]), np.ones(4), dim)
    assert v.indices.dtype == np.int64 and index_dtype(dim) == np.int64
    assert index_dtype(2**31 - 1) == np.int32 and index_dtype(2**31) == np.int64
    assert v.density == 4 / dim
    w = SparseVector(np.array([2**32 + 5]), np.array([2.0]), dim)
    m = merge(v, w)
    assert not m.is_dense and m.indices.dtype == np.int64
    np.testing.assert_array_equal(m.indices, [0, 2**31, 2**32 + 5, dim - 1])
    np.testing.assert_array_equal(m.values, [1, 1, 3, 1])
    with pytest.raises(ValueError):
        SparseVector(np.array([dim]), np.ones(1), dim)


# --- dense switch and merges --------------------------------------------------


def test_dense_switch_rule_boundary():
    # float32 values, int32 indices: a pair costs 8 bytes, a dense value 4.
    assert goes_dense(50, 100, 4, 4) and not goes_dense(49, 100, 4, 4)
    # float64 with int64 indices: same 2:1 ratio; float32 with int64: 3:1.
    assert goes_dense(34, 100, 8, 4) and not goes_dense(33, 100, 8, 4)
    rng = np.random.default_rng(0)
    a, b, c = rand_vec(rng, 100, 24), rand_vec(rng, 100, 25), rand_vec(rng, 100, 25)
    assert not merge(a, b).is_dense  # 49 pairs < 50 values: stays sparse
    assert merge(b, c).is_dense  # 50 pairs cost as much as 100 values


@pytest.mark.parametrize("k1, k2", [(0, 0), (0, 10), (10, 0), (30, 20), (300, 400)])
def test_merge_is_the_sum_and_symmetric(k1, k2):
    rng = np.random.default_rng(k1 * 7 + k2)
    a, b = rand_vec(rng, 1000, k1), rand_vec(rng, 1000, k2)
    ab, ba = merge(a, b), merge(b, a)
    np.testing.assert_array_equal(ab.to_dense(), a.to_dense() + b.to_dense())
    assert ab.to_dense().tobytes() == ba.to_dense().tobytes()
    if not ab.is_dense:
        assert np.all(np.diff(ab.indices) > 0)


def test_sum_sorted_runs_adds_in_run_order():
    runs = [np.array([1, 4]), np.array([0, 4, 9]), np.array([4])]
    vals = [np.array([1e8, 1.0]), np.array([2.0, -1e8, 3.0]), np.array([0.5])]
    s = sum_sorted_runs(runs, vals, 10)
    np.testing.assert_array_equal(s.indices, [0, 1, 4, 9])
    # index 4: (1.0 + -1e8) + 0.5 in run order, in float64
    np.testing.assert_array_equal(s.values, [2.0, 1e8, (1.0 - 1e8) + 0.5, 3.0])


# --- quantization -------------------------------------------------------------


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_quantization_is_unbiased(bits):
    rng = np.random.default_rng(bits)
    x = (rng.standard_normal(1100) * np.exp(rng.standard_normal(1100))).astype(
        np.float32
    )
    draws = 4000
    total = np.zeros(x.shape, np.float64)
    for _ in range(draws):
        total += dequantize(quantize(x, bits, rng))
    mean = total / draws
    # Each draw is one of two neighbouring levels, so its standard deviation is at
    # most step / 2; the mean of `draws` independent draws then has a standard
    # deviation of at most step / (2 sqrt(draws)). Six of those bound every one
    # of the 1,100 elements with a failure chance below 1e-5 (union bound).
    q = quantize(x, bits, rng)
    step = np.repeat(q.scales / quant.levels(bits), quant.BUCKET)[: x.size]
    bound = 6 * step / (2 * np.sqrt(draws)) + 1e-6 * np.abs(x)
    assert np.all(np.abs(mean - x) <= bound)
    # A biased rounding (nearest level) fails this check on the same data.
    nearest = np.rint(np.abs(x) / step) * step * np.sign(x)
    assert np.any(np.abs(nearest - x) > bound)


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_values_on_levels_are_exact(bits, dtype):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(1500).astype(dtype)
    on = dequantize(quantize(x, bits, rng))
    assert on.dtype == dtype
    for seed in range(3):
        again = dequantize(quantize(on, bits, np.random.default_rng(seed)))
        assert again.tobytes() == on.tobytes()
    # Bucket maxima decode exactly; zeros stay zero.
    z = dequantize(quantize(np.zeros(600, dtype), bits, rng))
    assert np.all(z == 0)


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("n", [0, 1, 3, 7, 513, 1000])
def test_pack_round_trip_and_size(bits, n):
    rng = np.random.default_rng(n)
    codes = rng.integers(0, 2 * quant.levels(bits) + 1, n).astype(np.uint8)
    packed = quant.pack(codes, bits)
    assert packed.nbytes == -(-n * bits // 8)
    np.testing.assert_array_equal(quant.unpack(packed, bits, n), codes)


def test_quantized_slices_decode_like_the_whole():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(2000).astype(np.float32)
    q = quantize(x, 4, rng)
    full = dequantize(q)
    for a, b in [(0, 0), (0, 2000), (100, 700), (511, 513), (1500, 2000)]:
        s = q.slice(a, b)
        assert dequantize(s).tobytes() == full[a:b].tobytes()


def test_quantize_argument_checks():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError):
        quantize(np.ones(4, np.float32), 3, rng)
    with pytest.raises(ValueError):
        quantize(np.array([1.0, np.nan]), 4, rng)
    with pytest.raises(TypeError):
        quantize(np.ones(4, np.int32), 4, rng)


# --- wire format --------------------------------------------------------------


def test_wire_round_trip_every_kind():
    rng = np.random.default_rng(5)
    idx = np.array([3, 9, 100], np.int64)
    val = np.array([1.0, -2.0, 0.25])
    for i, v, q in [
        (idx, val, None),
        (None, val, None),
        (idx, None, quantize(val, 8, rng)),
        (None, None, quantize(val, 2, rng)),
    ]:
        buf = wire.encode(i, v, q)
        kind = int(buf[:8].view(np.int64)[0])
        assert buf.nbytes == wire.nbytes(kind, 3, 8, 8, q.bits if q else 0)
        got_i, got_v = wire.decode(buf, np.dtype(np.int64), np.dtype(np.float64))
        want = dequantize(q) if q is not None else v
        np.testing.assert_array_equal(got_v, want)
        if i is None:
            assert got_i is None
        else:
            np.testing.assert_array_equal(got_i, i)


# --- cost model ---------------------------------------------------------------


def test_predicted_bytes_exact_cases():
    d, k = 10_000, 100
    # Two ranks, recursive doubling: agreement row (40 B) + one sparse message.
    assert predicted_bytes("ssar_rd", k, d, 2) == 40 + 32 + k * 8
    # Dense: agreement + a bandwidth-optimal allreduce, 2 (P-1)/P x 4 d bytes.
    assert predicted_bytes("dense", k, d, 4) == 3 * 40 + 2 * 3 * 4 * d // 4
    # Quantized first hop: indices + 4-bit codes + one scale per 512 values.
    q = predicted_bytes("ssar_rd", k, d, 2, bits=4)
    assert q == 40 + 32 + k * 4 + k // 2 + 4
    assert predicted_bytes("ssar_rd", 0, d, 2) == 40 + 32  # a bare header
    per = predicted_bytes("ssar_sag", [0, 50, 100], d, 3, per_rank=True)
    assert len(per) == 3 and per[0] < per[1] < per[2]


def test_predicted_bytes_follow_density():
    d, P = 1_000_000, 4
    for alg in ("ssar_rd", "ssar_sag"):
        b = [predicted_bytes(alg, f * d, d, P) for f in (0.001, 0.01, 0.1)]
        assert b[0] < b[1] < b[2]
    # Sparse split-allgather never sends more than about twice the dense split.
    full = predicted_bytes("ssar_sag", d, d, P)
    assert full <= 1.01 * predicted_bytes("dsar_sag", d, d, P) + 8 * P * 64


#: A 10 Gb/s-class network and a slower CPU (the defaults before 2026-11-26).
NETWORK = CostModel(5e-6, 8e-10, 2e-8, 2e-9, 2e-5, 2e-9, 2e-10)


def test_choose_sparse_when_sparse_dense_when_dense():
    d, P = 25_600_000, 4
    for model in (DEFAULTS, NETWORK):
        assert choose(model, [d // 1000] * P, d, 4, 4) in ("ssar_rd", "ssar_sag")
    assert choose(NETWORK, [d] * P, d, 4, 4) in ("dense", "dsar_sag")
    t = [predicted_time(DEFAULTS, "ssar_sag", f * d, d, P) for f in (1e-3, 1e-2, 0.1)]
    assert t[0] < t[1] < t[2]
    with pytest.raises(ValueError):
        predicted_bytes("nope", 1, 10, 2)
    with pytest.raises(ValueError):
        predicted_bytes("dense", [1, 2], 10, 3)


def test_model_file_round_trip_and_defaults_without_a_word(tmp_path, monkeypatch):
    """No calibration file: the documented defaults, silently (the first
    ``auto`` call under MPI measures one: tests/mpi/test_sparse.py)."""
    from research.comm.sparse import calibration

    path = tmp_path / "cost.json"
    monkeypatch.setenv("RESEARCH_SPARSE_COST", str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert calibration.load_model(4) is DEFAULTS
    monkeypatch.setenv("RESEARCH_SPARSE_COST", "defaults")
    assert calibration.default_path(4) is None and calibration.load_model(4) is DEFAULTS
    monkeypatch.setenv("RESEARCH_SPARSE_COST", str(path))
    m = CostModel(1e-6, 2e-10, 3e-8, 4e-9, 5e-6, 6e-10)
    path.write_text(json.dumps({**m.__dict__, "size": 4}))
    got = calibration.load_model(4)
    assert got.alpha == 1e-6 and got.ar_beta == 6e-10 and got.source == str(path)


def test_the_cache_is_per_machine_mpi_and_ranks(tmp_path, monkeypatch):
    """Another machine or MPI library is another key, so another file; a
    file whose recorded key differs is not used."""
    from research.comm.sparse import calibration

    monkeypatch.delenv("RESEARCH_SPARSE_COST", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    key = calibration.cache_key(4)
    assert key["size"] == 4 and key["nodes"] == 1
    assert "MPI" in key["mpi"] or "mpi" in key["mpi"].lower()
    here = calibration.default_path(4)
    assert here.parent == tmp_path / "research" and here.name.startswith(
        "sparse_cost_4_"
    )
    other_mpi = calibration.default_path(4, {**key, "mpi": "Open MPI v4.1.4"})
    other_cpu = calibration.default_path(4, {**key, "machine": "another CPU"})
    assert len({here, other_mpi, other_cpu, calibration.default_path(8)}) == 4
    m = CostModel(1e-6, 2e-10, 3e-8, 4e-9, 5e-6, 6e-10)
    here.parent.mkdir(parents=True)
    here.write_text(json.dumps({**m.__dict__, "key": key}))
    assert calibration.load_model(4).alpha == 1e-6
    here.write_text(json.dumps({**m.__dict__, "key": {**key, "mpi": "other"}}))
    assert calibration.load_model(4) is DEFAULTS  # measured for another MPI


def test_model_charges_each_step_what_the_code_does():
    import dataclasses

    d, P, k = 25_600_000, 4, 256_000  # 1%: every result stays sparse
    slow_scatter = dataclasses.replace(DEFAULTS, delta=100 * DEFAULTS.delta)
    # Split-allgather assembles disjoint ordered pieces by concatenation: a
    # scatter cost must not enter its time, while it does for the dense split.
    for alg, moves in (("ssar_sag", False), ("dsar_sag", True)):
        a = predicted_time(DEFAULTS, alg, k, d, P)
        b = predicted_time(slow_scatter, alg, k, d, P)
        assert (b > 1.5 * a) == moves, alg
    # Recursive doubling merges: its time follows gamma, not the copy speed.
    slow_merge = dataclasses.replace(DEFAULTS, gamma=10 * DEFAULTS.gamma)
    assert predicted_time(slow_merge, "ssar_rd", k, d, P) > 3 * predicted_time(
        DEFAULTS, "ssar_rd", k, d, P
    )
    # A file written before the copy field existed still loads (its default).
    old = {f: 1e-9 for f in ("alpha", "beta", "gamma", "delta", "ar_alpha", "ar_beta")}
    assert CostModel(**old).copy == DEFAULTS.copy
