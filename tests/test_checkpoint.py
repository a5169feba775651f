"""Single-process checkpoint tests: partition, names, checksums, manifest, tiers,
snapshots under donation, Orbax shards, and DeepFreeze in a world of one."""

from __future__ import annotations

import json
import warnings
import zlib
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from research import privdir
from research.checkpoint import CheckpointConfig, CheckpointWarning
from research.checkpoint.integrity import (
    CorruptShardError,
    array_crc32,
    copy_verified,
    scan_dir,
    verify_dir,
)
from research.checkpoint.leaves import (
    Flattener,
    LeafSpec,
    check_compatible,
    nest,
    rebuild,
    unnest,
)
from research.checkpoint.manifest import (
    committed_steps,
    read_manifest,
    update_manifest,
    write_manifest,
)
from research.checkpoint.partition import (
    LOCAL,
    imbalance,
    partition_by_bytes,
    plan,
    shard_bytes,
)
from research.checkpoint.shard import new_checkpointer, read_shard, shard_args
from research.checkpoint.snapshot import Snapshotter
from research.checkpoint.tiers import (
    Tier,
    clean_rank_dir,
    default_fast_root,
    local_steps,
)
from tests.checkpoint_state import advance, host, identical, initial, state_at


# -- partition -------------------------------------------------------------------------
def test_partition_is_balanced_and_deterministic():
    rng = np.random.default_rng(0)
    sizes = [int(x) for x in rng.integers(1, 10_000, size=200)]
    for parts in (1, 2, 3, 4, 8):
        owners = partition_by_bytes(sizes, parts)
        assert owners == partition_by_bytes(sizes, parts)
        loads = [sum(b for b, o in zip(sizes, owners) if o == r) for r in range(parts)]
        assert sum(loads) == sum(sizes) and max(loads) / (sum(sizes) / parts) < 1.02
    with pytest.raises(ValueError):
        partition_by_bytes(sizes, 0)


def test_plan_cuts_large_leaves_and_keeps_local_ones_whole():
    specs = [
        LeafSpec("params/in/kernel", (4096, 1024), "float32"),  # 86% of the bytes
        LeafSpec("params/in/bias", (1024,), "float32"),
        LeafSpec("params/out/kernel", (1024, 600), "float32"),
        LeafSpec("batch_stats/mean", (4096,), "float32"),
        LeafSpec("rng", (2,), "uint32", "key"),
    ]
    for parts in (2, 4, 8):
        units = plan(specs, parts, rank_local=("batch_stats",))
        assert units == plan(specs, parts, rank_local=("batch_stats",))
        assert imbalance([u for u in units if u.owner != LOCAL], parts) <= 1.25
        blocks = sorted(u.rows for u in units if u.leaf == "params/in/kernel")
        assert blocks[0][0] == 0 and blocks[-1][1] == 4096 and len(blocks) > 1
        assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
        local = [u for u in units if u.leaf == "batch_stats/mean"]
        assert len(local) == 1 and local[0].owner == LOCAL and local[0].rows is None
    whole = plan(specs, 4, split=False)
    assert len(whole) == len(specs) and imbalance(whole, 4) > 3
    assert sum(shard_bytes(plan(specs, 1), 1)) == sum(s.nbytes for s in specs)


# -- named leaves ----------------------------------------------------------------------
def test_names_nest_and_rebuild():
    s = state_at(2)
    fl = Flattener()
    leaves, changed = fl.flatten(s)
    assert changed and not fl.flatten(s)[1]
    assert "params/big/kernel" in fl.names and "opt_state/0/head/bias" in fl.names
    assert "rng" in fl.names and fl.specs[fl.names.index("rng")].kind == "key"
    named = dict(zip(fl.names, host(leaves)))
    assert unnest(nest(named)).keys() == named.keys()
    back = rebuild(initial(), {n: np.asarray(v) for n, v in named.items()})
    assert identical(back, s)
    assert jax.dtypes.issubdtype(back["rng"].dtype, jax.dtypes.prng_key)


def test_flax_train_state_names_and_mismatch_message():
    import optax
    from flax.training import train_state

    params = {"Dense_0": {"kernel": jnp.ones((3, 2)), "bias": jnp.zeros(2)}}
    ts = train_state.TrainState.create(
        apply_fn=None, params=params, tx=optax.sgd(0.1, momentum=0.9)
    )
    fl = Flattener()
    fl.flatten(ts)
    assert "params/Dense_0/kernel" in fl.names and "step" in fl.names
    assert any(n.startswith("opt_state/") for n in fl.names)
    stored = [s.as_dict() for s in fl.specs]
    stored[fl.names.index("params/Dense_0/kernel")]["shape"] = [4, 2]
    with pytest.raises(ValueError, match="params/Dense_0/kernel"):
        check_compatible(fl.specs, stored)


# -- checksums and verified copies -----------------------------------------------------
def test_crc_and_verify_name_the_bad_file(tmp_path):
    a = np.arange(100, dtype=np.float32)
    assert array_crc32(a) == zlib.crc32(a.tobytes())
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.bin").write_bytes(b"hello world" * 100)
    (tmp_path / "y.bin").write_bytes(b"abc")
    files = scan_dir(tmp_path)
    verify_dir(tmp_path, files)
    data = bytearray((tmp_path / "d" / "x.bin").read_bytes())
    data[5] ^= 1
    (tmp_path / "d" / "x.bin").write_bytes(bytes(data))
    with pytest.raises(CorruptShardError, match=r"d/x\.bin: crc32 mismatch"):
        verify_dir(tmp_path, files)
    (tmp_path / "y.bin").write_bytes(b"ab")
    with pytest.raises(CorruptShardError, match=r"y\.bin: truncated"):
        verify_dir(tmp_path, {"y.bin": files["y.bin"]})
    with pytest.raises(CorruptShardError, match=r"y\.bin: changed since"):
        copy_verified(
            tmp_path, tmp_path.parent / "copy", {"y.bin": files["y.bin"]}, fsync=False
        )


# -- manifest and tiers ----------------------------------------------------------------
def test_manifest_update_and_unreadable(tmp_path):
    update_manifest(tmp_path, tier="persistent", add=[{"step": 10}, {"step": 20}])
    update_manifest(tmp_path, tier="persistent", add=[{"step": 30}], remove=[10])
    m = read_manifest(tmp_path)
    assert committed_steps(m) == [30, 20] and m["tier"] == "persistent"
    assert not list(tmp_path.glob(".manifest*"))  # no temporary file left behind
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.warns(CheckpointWarning, match="unreadable"):
        assert committed_steps(read_manifest(tmp_path)) == []
    write_manifest(tmp_path, {"format": "other"})
    with pytest.warns(CheckpointWarning, match="unknown format"):
        read_manifest(tmp_path)


def test_tiers_ignore_and_clean_leftovers(tmp_path):
    t = Tier("fast", tmp_path)
    for name in ("10", "20", "30.orbax-checkpoint-tmp", "20.flush-tmp", "40"):
        (t.rank_dir(1) / name).mkdir(parents=True)
    assert local_steps(t, 1) == [10, 20, 40]
    clean_rank_dir(t, 1, keep={10, 20})
    assert sorted(p.name for p in t.rank_dir(1).iterdir()) == ["10", "20"]
    root = default_fast_root(tmp_path / "persist")
    assert root == default_fast_root(tmp_path / "persist")
    # In this user's private folder (tests/test_shared_node.py checks it).
    assert root.parent == privdir.base() and root.name.startswith("ckpt-")


# -- snapshots under donation ----------------------------------------------------------
@partial(jax.jit, donate_argnums=0)
def _bump(xs):
    return [x * 2.0 + 1.0 for x in xs]


@pytest.mark.parametrize("mode", ["view", "host", "device"])
def test_snapshot_survives_donated_steps(mode):
    xs = [jnp.full((1 << 16,), float(i)) for i in range(3)]
    expected = [np.array(x) for x in xs]
    snap = Snapshotter(mode)
    taken = snap.take(xs)
    for _ in range(4):
        xs = _bump(xs)  # would reuse the donated buffers were they free
        garbage = [jnp.ones((1 << 16,)) * 7 for _ in range(3)]  # noqa: F841
    got = snap.materialize(taken)
    assert all(np.array_equal(g, e) for g, e in zip(got, expected))
    snap.release(taken)


def test_host_snapshot_reuses_its_buffers():
    snap = Snapshotter("host")
    xs = [jnp.ones((8,)), jnp.zeros((4,))]
    first = snap.take(xs)
    snap.release(first)
    second = snap.take(xs)
    assert all(a is b for a, b in zip(first, second))


def test_auto_snapshot_is_view_on_cpu():
    assert Snapshotter("auto").mode == "view"
    with pytest.raises(ValueError):
        Snapshotter("bogus")


# -- Orbax shards ----------------------------------------------------------------------
def test_shard_is_a_standard_orbax_item(tmp_path):
    arrays = {
        "params/Dense_0/kernel": np.arange(6, dtype=np.float32).reshape(2, 3),
        "step": np.asarray(3, np.int32),
    }
    ck = new_checkpointer(use_async=True)
    ck.save(tmp_path / "7", args=shard_args(arrays, {"step": 7, "extra": {"a": 1}}))
    ck.wait_until_finished()
    ck.close()
    got, meta = read_shard(tmp_path / "7", list(arrays))
    assert meta["step"] == 7 and meta["extra"] == {"a": 1}
    assert all(np.array_equal(got[k], v) for k, v in arrays.items())
    # orbax-checkpoint alone (the README recipe)
    plain = ocp.StandardCheckpointer().restore(tmp_path / "7" / "state")
    np.testing.assert_array_equal(
        plain["params"]["Dense_0"]["kernel"], arrays["params/Dense_0/kernel"]
    )
    assert json.loads((tmp_path / "7" / "shard" / "metadata").read_text())["step"] == 7


# -- DeepFreeze in a world of one ------------------------------------------------------
def test_deepfreeze_alone_falls_back_from_a_corrupt_step(tmp_path):
    from research.comm.world import get_world

    ckpt = CheckpointConfig(
        directory=str(tmp_path / "p"), fast_dir=str(tmp_path / "f"), fsync=False
    ).create(get_world())
    s = initial()
    saved = {}
    for k in range(1, 5):
        s = advance(s)
        if k % 2 == 0:
            saved[k] = host(s)
            rec = ckpt.save(k, s)
            assert rec.blocking_s < 5
    ckpt.wait()
    assert ckpt.committed_steps("persistent") == [2, 4]
    for tier in ("f", "p"):
        d = tmp_path / tier / "rank0" / "4"
        f = max(
            (p for p in d.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size
        )
        f.write_bytes(b"\0" * f.stat().st_size)
        bad = f
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = ckpt.restore(state_at(0))
    ckpt.close()
    assert r.step == 2 and identical(r.state, saved[2])
    assert any(str(bad) in str(w.message) for w in caught)
    assert ckpt.summary()["restore_s"] > 0


@pytest.mark.parametrize("fast", [True, False])
def test_deepfreeze_syncs_the_shard_only_where_it_persists(tmp_path, fast):
    # The writer syncs a shard it writes only into the last tier: with a fast
    # tier the flush makes the persistent copy durable; without one the
    # write itself must, before the manifest commits the step.
    from research.checkpoint.deepfreeze import DeepFreeze
    from research.comm.world import get_world

    ck = DeepFreeze(
        get_world(),
        tmp_path / "p",
        fast_dir=tmp_path / "f" if fast else None,
        writer="thread",
    )
    sent = []
    handle = ck._local.handle
    ck._local.handle = lambda req, progress: sent.append(req) or handle(req, progress)
    ck.save(1, initial())
    ck.wait()
    ck.close()
    writes = [r for r in sent if r["op"] == "write"]
    assert [r["fsync"] for r in writes] == [not fast]
    assert ck.committed_steps("persistent") == [1]


def test_saver_names_before_the_rename_are_refused_in_one_line(capsys):
    """The savers' names before their rename (never released) are unknown
    names now, refused before launch with the valid ones."""
    from experiments.train import parse

    with pytest.raises(TypeError):
        CheckpointConfig(strategy="rank0-sync")  # the keyword before saver=
    assert (
        "unknown checkpoint saver 'rank0-sync'"
        in CheckpointConfig(saver="rank0-sync").validate()
    )
    with pytest.raises(SystemExit) as exc:
        parse(["--checkpoint", "orbax-sync"])
    assert exc.value.code == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if "error:" in ln]
    assert len(err) == 1 and "unknown checkpoint saver 'orbax-sync'" in err[0], err
    assert "orbax-blocking" in err[0]


def test_config_validation():
    assert CheckpointConfig().validate() is None
    assert "unknown checkpoint saver" in CheckpointConfig(saver="x").validate()
    assert CheckpointConfig(on_busy="later").validate()
    assert CheckpointConfig(saver="none").create(None) is None
