"""The sparse allreduce (SparCML) under mpiexec: every algorithm against a dense
Allreduce of the same data, identical bytes on every rank and run, awkward sizes
(empty ranks, dim not divisible by P, dim < P, int64 indices), auto's agreement,
the background form and quantized values. Written for any number of ranks."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from research.comm.sparse import (
    ALGORITHMS,
    SparseVector,
    dequantize,
    isparse_allreduce,
    predicted_bytes,
    quantize,
    sparse_allreduce,
)

ALL = (*ALGORITHMS, "auto")


@pytest.fixture(scope="module")
def comm():
    c = MPI.COMM_WORLD.Dup()
    yield c
    c.Free()


def contribution(comm, dim, density, *, pattern="hetero", dtype=np.float32, seed=0):
    """This rank's vector: nnz grows with rank ("hetero"), odd ranks empty
    ("holes"), or nobody has anything ("empty")."""
    r, P = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng((seed, r, dim))
    if pattern == "empty" or (pattern == "holes" and r % 2):
        k = 0
    elif pattern == "hetero":
        k = min(dim, round(dim * density * 2 * (r + 1) / (P + 1)))
    else:
        k = min(dim, round(dim * density))
    idx = np.sort(rng.choice(dim, k, replace=False))
    return SparseVector(idx, rng.standard_normal(k).astype(dtype), dim)


def dense_sum(comm, v):
    ref = v.to_dense().astype(np.float64)
    comm.Allreduce(MPI.IN_PLACE, ref, MPI.SUM)
    return ref


def same_on_every_rank(comm, out: SparseVector) -> bool:
    mine = out.values.tobytes() + (b"D" if out.is_dense else out.indices.tobytes())
    return all(b == mine for b in comm.allgather(mine))


@pytest.mark.parametrize("algorithm", ALL)
@pytest.mark.parametrize("dim", [1, 3, 1000, 1003])
@pytest.mark.parametrize("density", [0.001, 0.01, 0.1, 0.5, 1.0])
@pytest.mark.parametrize("pattern", ["hetero", "holes", "uniform"])
def test_sum_matches_dense_allreduce_and_is_identical(
    comm, algorithm, dim, density, pattern
):
    v = contribution(comm, dim, density, pattern=pattern)
    out = sparse_allreduce(comm, v, algorithm)
    assert out.dim == dim and out.dtype == np.float32
    np.testing.assert_allclose(out.to_dense(), dense_sum(comm, v), atol=1e-5)
    assert same_on_every_rank(comm, out)
    again = sparse_allreduce(comm, v, algorithm)
    assert again.to_dense().tobytes() == out.to_dense().tobytes()  # run to run
    if not out.is_dense:
        assert np.all(np.diff(out.indices) > 0)


@pytest.mark.parametrize("algorithm", ALL)
def test_all_empty_and_dense_inputs_and_float64(comm, algorithm):
    empty = contribution(comm, 500, 0.0, pattern="empty")
    out = sparse_allreduce(comm, empty, algorithm)
    assert not out.to_dense().any() and same_on_every_rank(comm, out)
    rng = np.random.default_rng(comm.Get_rank())
    dense = SparseVector.dense(rng.standard_normal(777))
    out = sparse_allreduce(comm, dense, algorithm)
    assert out.dtype == np.float64 and out.is_dense
    np.testing.assert_allclose(out.to_dense(), dense_sum(comm, dense), rtol=1e-12)
    assert same_on_every_rank(comm, out)


@pytest.mark.parametrize("density", [0.0005, 0.01, 0.3, 1.0])
def test_auto_picks_the_same_algorithm_everywhere(comm, density):
    v = contribution(comm, 20_000, density, seed=3)
    out, stats = sparse_allreduce(comm, v, "auto", return_stats=True)
    assert stats.algorithm in ALGORITHMS
    assert len(set(comm.allgather(stats.algorithm))) == 1
    np.testing.assert_allclose(out.to_dense(), dense_sum(comm, v), atol=1e-5)


@pytest.mark.parametrize("algorithm", ["ssar_rd", "ssar_sag", "auto"])
def test_int64_indices_large_dim_sparse_only(comm, algorithm):
    dim = 2**33 + 7  # a dense float32 vector would take 32 GiB
    r = comm.Get_rank()
    rng = np.random.default_rng(r)
    idx = np.unique(
        np.concatenate([[0, dim - 1, 2**31 + r], rng.integers(0, dim, 200)])
    )
    v = SparseVector(idx, np.ones(idx.size, np.float32) * (r + 1), dim)
    out = sparse_allreduce(comm, v, algorithm)
    assert not out.is_dense and out.indices.dtype == np.int64
    every = comm.allgather((v.indices, v.values))
    keys = np.concatenate([i for i, _ in every])
    vals = np.concatenate([x for _, x in every])
    want_idx, inverse = np.unique(keys, return_inverse=True)
    want = np.zeros(want_idx.size, np.float64)
    np.add.at(want, inverse, vals)
    np.testing.assert_array_equal(out.indices, want_idx)
    np.testing.assert_allclose(out.values, want)
    assert same_on_every_rank(comm, out)


def test_disagreeing_ranks_raise_everywhere(comm):
    dim = 100 + (comm.Get_rank() if comm.Get_size() > 1 else 1)
    with pytest.raises(ValueError, match="disagree on dim"):
        sparse_allreduce(comm, SparseVector.empty(dim), "ssar_rd")


def test_nonblocking_several_in_flight(comm):
    cases = [
        (contribution(comm, 3001, d, seed=s), a)
        for s, (d, a) in enumerate(
            [(0.01, "ssar_rd"), (0.2, "ssar_sag"), (0.05, "dsar_sag"), (0.5, "auto")]
        )
    ]
    handles = [isparse_allreduce(comm, v, a) for v, a in cases]
    outs = [h.wait(timeout=60) for h in handles]
    for (v, a), h, out in zip(cases, handles, outs):
        blocking = sparse_allreduce(comm, v, h.stats.algorithm)
        assert out.to_dense().tobytes() == blocking.to_dense().tobytes(), a
        assert same_on_every_rank(comm, out)
        assert h.done() and h.stats.bytes_sent > 0


@pytest.mark.parametrize("algorithm", ALL)
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("density", [0.01, 0.3, 1.0])
def test_quantized_is_the_sum_of_dequantized_contributions(
    comm, algorithm, bits, density
):
    v = contribution(comm, 4099, density, seed=bits)
    seed = (bits, comm.Get_rank())
    out, st = sparse_allreduce(
        comm,
        v,
        algorithm,
        bits=bits,
        rng=np.random.default_rng(seed),
        return_stats=True,
    )
    mine = dequantize(quantize(v.values, bits, np.random.default_rng(seed)))
    deq = SparseVector(v.indices, mine, v.dim)
    np.testing.assert_allclose(out.to_dense(), dense_sum(comm, deq), atol=1e-5)
    assert same_on_every_rank(comm, out)
    # Same numbers as the full-precision collective run on those contributions.
    plain, st0 = sparse_allreduce(comm, deq, st.algorithm, return_stats=True)
    assert plain.to_dense().tobytes() == out.to_dense().tobytes()
    if st.algorithm in ("ssar_rd", "ssar_sag") and density <= 0.01:
        # Fewer bytes in all (a rank sending only merged sums saves nothing).
        saved = comm.allreduce(st0.bytes_sent - st.bytes_sent)
        assert saved > 0


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("density", [0.001, 0.01, 0.1])
def test_measured_bytes_match_the_model(comm, algorithm, density):
    P, dim = comm.Get_size(), 200_000
    v = contribution(comm, dim, density, pattern="uniform", seed=11)
    _, st = sparse_allreduce(comm, v, algorithm, return_stats=True)
    mean = comm.allreduce(st.bytes_sent) / P
    model = predicted_bytes(algorithm, comm.allgather(v.nnz), dim, P)
    assert mean == pytest.approx(model, rel=0.03, abs=64)


def test_ensure_calibrated_measures_once_where_none_exists(
    comm, tmp_path_factory, monkeypatch
):
    """A fresh machine has no calibration: ``ensure_calibrated`` measures it
    (collective), rank 0 saves it and says so; a second call finds it."""
    import json
    from pathlib import Path

    from research.comm.sparse.calibration import ensure_calibrated, load_model

    folder = comm.bcast(str(tmp_path_factory.mktemp("cost")) if comm.rank == 0 else 0)
    path = Path(folder) / f"cost-{comm.Get_size()}.json"
    monkeypatch.setenv("RESEARCH_SPARSE_COST", str(path))
    said = []
    assert ensure_calibrated(comm, say=said.append) == path
    comm.Barrier()
    assert path.exists() and load_model(comm.Get_size()).source == str(path)
    assert json.loads(path.read_text())["beta"] > 0
    assert (len(said) == 1) == (comm.rank == 0)
    stamp = path.stat().st_mtime_ns
    ensure_calibrated(comm, say=said.append)
    assert path.stat().st_mtime_ns == stamp and len(said) == (comm.rank == 0)


def test_auto_measures_briefly_on_first_use_and_caches_per_machine_and_mpi(
    comm, tmp_path_factory, monkeypatch, recwarn
):
    """No calibration anywhere: the first ``auto`` call measures one (every
    rank, silently), rank 0 caches it under this machine's and MPI's key, and
    the next communicator loads it; a cache file measured for another MPI is
    not used but measured over."""
    import json
    from pathlib import Path

    from research.comm.sparse import calibration

    folder = comm.bcast(str(tmp_path_factory.mktemp("xdg")) if comm.rank == 0 else 0)
    monkeypatch.delenv("RESEARCH_SPARSE_COST", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", folder)
    vec = SparseVector(np.array([comm.rank]), np.ones(1, np.float32), 64)
    first = comm.Dup()
    out = sparse_allreduce(first, vec, "auto")
    want = np.zeros(64, np.float32)
    want[: comm.size] = 1
    np.testing.assert_array_equal(out.to_dense(), want)
    model = calibration.cached_model(first)
    saved = sorted((Path(folder) / "research").glob("sparse_cost_*.json"))
    assert len(saved) == 1 and model.source == str(saved[0])
    record = json.loads(saved[0].read_text())
    assert record["key"]["size"] == comm.size and record["key"]["mpi"]
    assert not [w for w in recwarn if "calibrat" in str(w.message)]
    stamp = saved[0].stat().st_mtime_ns
    second = comm.Dup()
    assert calibration.agreed_model(second).alpha == model.alpha  # loaded
    assert saved[0].stat().st_mtime_ns == stamp
    comm.Barrier()
    if comm.rank == 0:  # as if measured under another MPI library
        saved[0].write_text(
            json.dumps({**record, "key": {**record["key"], "mpi": "x"}})
        )
    comm.Barrier()
    third = comm.Dup()
    again = calibration.agreed_model(third)
    assert again.source == str(saved[0])
    assert json.loads(saved[0].read_text())["key"] == record["key"]  # measured anew
    for c in (first, second, third):
        c.Free()
