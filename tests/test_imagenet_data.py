"""``--dataset imagenet``: the folder and shard sources, transforms, sharding, resume.

Every test reads a real ImageNet-format folder of real JPEG files written by
``scripts.make_imagenet_sample`` (with ImageNet's odd files: grayscale, CMYK,
a PNG named .JPEG, truncated and garbage files) and real ArrayRecord shards
written by ``scripts.imagenet_to_arrayrecord``; nothing is mocked.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from research.data import DataError, check_dataset, get_dataset
from research.data.imagenet import layout, records
from research.data.imagenet.decode import Undecodable, open_image
from research.data.imagenet.pipeline import StreamLoader, epoch_order
from research.data.imagenet.transforms import (
    RATIO,
    SCALE,
    crop_box,
    eval_transform,
    sample_rng,
    train_transform,
)
from scripts import imagenet_to_arrayrecord as to_ar
from scripts.make_imagenet_sample import make_sample

SIZE = 24  # output side: small, so the tests stay quick


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    """4 classes of 10 train images (6 odd files among them, 2 extra) and 3 val each."""
    root = tmp_path_factory.mktemp("imagenet") / "sample"
    make_sample(root, 4, 10, val_per_class=3, sizes=(40, 90))
    return root


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> Path:
    """No odd files: every example decodes (the sharding and resume tests)."""
    root = tmp_path_factory.mktemp("imagenet") / "clean"
    make_sample(root, 3, 11, val_per_class=2, sizes=(40, 80), odd=False, seed=1)
    return root


@pytest.fixture(scope="module")
def shards(sample, tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("imagenet") / "shards"
    assert to_ar.main([str(sample), str(dst), "--per-shard", "9"]) == 0
    return dst


def _data(path: Path, **opts):
    return get_dataset("imagenet", path=str(path), image_size=SIZE, **opts)


def _batches(loader, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    return [loader.next_batch() for _ in range(n)]


# -- the folder layout and its checks -------------------------------------------
def test_the_class_index_is_the_sorted_wnids_and_goes_into_the_record(sample):
    data = _data(sample)
    wnids = json.loads((sample / "sample.json").read_text())["classes"]
    assert data.classes == sorted(wnids) and data.num_classes == 4
    rec = data.record()
    assert rec["classes"] == sorted(wnids) and rec["source"] == "folder"
    assert rec["train_examples"] == 42 and rec["val_examples"] == 12
    assert data.example_batch().dtype == np.uint8
    assert data.example_batch().shape == (1, SIZE, SIZE, 3)


def test_a_flat_val_with_its_labels_file_reads_as_the_folders_do(tmp_path):
    make_sample(tmp_path, 3, 4, val_per_class=2, sizes=(40, 60), val_layout="flat")
    data = _data(tmp_path)
    assert len(data.val) == 6
    lines = (tmp_path / "val_labels.txt").read_text().split("\n")
    want = {ln.split()[0]: data.classes.index(ln.split()[1]) for ln in lines if ln}
    got = {Path(f).name: int(y) for f, y in zip(data.val.files, data.val.labels)}
    assert got == want


def _problem(path: Path, **opts) -> str | None:
    return check_dataset("imagenet", str(path), opts)


def test_bad_folders_fail_in_one_line_naming_the_file(sample, tmp_path):
    assert _problem(sample) is None
    empty = tmp_path / "empty"
    empty.mkdir()
    assert f"{empty / 'train'} not found" in _problem(empty)
    (empty / "train").mkdir()
    assert "holds no class folders" in _problem(empty)

    root = tmp_path / "copy"
    shutil.copytree(sample, root)
    (root / "train" / "n00000009").mkdir()
    problem = _problem(root)
    assert f"class folder {root / 'train' / 'n00000009'} holds no images" in problem
    assert "\n" not in problem
    shutil.rmtree(root / "train" / "n00000009")
    shutil.rmtree(root / "val")
    assert f"{root / 'val'} not found" in _problem(root)


def test_a_labels_file_that_does_not_match_val_is_named(tmp_path):
    make_sample(tmp_path, 2, 3, val_per_class=2, sizes=(40, 60), val_layout="flat")
    labels = tmp_path / "val_labels.txt"
    good = labels.read_text()
    lines = good.strip().split("\n")
    labels.write_text("\n".join(lines[1:]) + "\n")  # an image without a line
    problem = _problem(tmp_path)
    assert lines[0].split()[0] in problem and str(labels) in problem
    labels.write_text(good + "ILSVRC2012_val_00000999.JPEG n00000000\n")
    assert "ILSVRC2012_val_00000999.JPEG, which is not in" in _problem(tmp_path)
    labels.write_text(good.replace("n00000001", "n09999999", 1))
    assert "'n09999999' is not a class of train/" in _problem(tmp_path)
    labels.write_text("just-one-field\n")
    assert f"{labels}:1: expected 'FILE WNID'" in _problem(tmp_path)
    labels.unlink()
    assert "is flat (no class folders)" in _problem(tmp_path)


def test_wrong_options_are_refused(sample):
    assert "image_size must be an int >= 8" in _problem(sample, image_size=4)
    assert "no option(s) colour" in _problem(sample, colour=1)
    with pytest.raises(DataError, match="no data folder given"):
        get_dataset("imagenet")


# -- decoding ImageNet's odd files ----------------------------------------------
def test_odd_files_decode_or_are_named_undecodable(sample):
    odd = json.loads((sample / "sample.json").read_text())["odd_files"]
    assert {o["kind"] for o in odd} >= {"grayscale", "cmyk", "png", "garbage"}
    for o in odd:
        data = (sample / o["file"]).read_bytes()
        if o["expect"] == "decoded":
            px = eval_transform(open_image(data), SIZE)
            assert px.shape == (SIZE, SIZE, 3) and px.dtype == np.uint8, o
            assert px.std() > 0, o  # an image, not a blank
        else:
            with pytest.raises(Undecodable):
                eval_transform(open_image(data), SIZE)


def test_training_skips_what_it_cannot_decode_and_counts_it(sample, capfd):
    data = _data(sample)
    loader = data.loader(batch_size=8, rank=0, size=1, seed=0, workers=2)
    for x, y in _batches(loader, 12):  # two epochs of 42, and more
        assert x.shape == (8, SIZE, SIZE, 3) and x.dtype == np.uint8
        assert y.dtype == np.int32 and y.min() >= 0 and y.max() < 4
    summary = loader.summary()
    undecodable = {
        str(sample / o["file"])
        for o in json.loads((sample / "sample.json").read_text())["odd_files"]
        if o["expect"] == "undecodable" and o["file"].startswith("train/")
    }
    assert set(summary["skipped_files"]) == undecodable
    assert summary["skipped"] >= 2 * len(undecodable)  # once per epoch each
    err = capfd.readouterr().err
    assert err.count("cannot be decoded") == 1  # one warning line, then counts
    loader.close()


# -- transforms -----------------------------------------------------------------
def test_random_resized_crop_stays_in_the_image_and_in_its_ranges():
    rng = np.random.default_rng(0)
    areas, ratios = [], []
    for _ in range(2000):
        h, w = int(rng.integers(50, 700)), int(rng.integers(50, 700))
        top, left, ch, cw = crop_box(rng, h, w)
        assert top >= 0 and top + ch <= h and left >= 0 and left + cw <= w
        areas.append(ch * cw / (h * w))
        ratios.append(cw / ch)
    areas, ratios = np.array(areas), np.array(ratios)
    assert SCALE[0] * 0.9 < areas.min() and areas.max() <= 1.0
    # Drawn uniformly in 8-100%; a draw that does not fit is drawn again, so
    # large areas at a far ratio are rarer (torchvision's sampling).
    assert areas.max() > 0.9 and 0.2 < np.median(areas) < 0.6
    inside = (ratios > RATIO[0] * 0.95) & (ratios < RATIO[1] * 1.05)
    assert inside.mean() > 0.97


def test_a_samples_crop_depends_on_seed_epoch_and_index_only(sample):
    data = (sample / "train/n00000001/n00000001_3.JPEG").read_bytes()
    a = train_transform(open_image(data), SIZE, sample_rng(0, 2, 17))
    b = train_transform(open_image(data), SIZE, sample_rng(0, 2, 17))
    c = train_transform(open_image(data), SIZE, sample_rng(0, 3, 17))
    assert (a == b).all() and not (a == c).all()


def test_reduced_scale_decoding_gives_the_crop_at_least_its_output_size(tmp_path):
    make_sample(tmp_path, 1, 1, val_per_class=1, sizes=(600, 640), odd=False)
    data = next((tmp_path / "train").rglob("*.JPEG")).read_bytes()
    image = open_image(data)
    small = image.pixels(image.height // 4, image.width // 4)
    assert image.height // 4 <= small.shape[0] < image.height // 2
    full = image.pixels()
    assert full.shape[:2] == (image.height, image.width)
    # Centre crop at reduced scale against the full decode: the same picture.
    px = eval_transform(image, 112)
    import cv2

    side = round(min(full.shape[:2]) * 0.875)
    t, left = (full.shape[0] - side) // 2, (full.shape[1] - side) // 2
    ref = cv2.resize(full[t : t + side, left : left + side], (112, 112),
                     interpolation=cv2.INTER_AREA)  # fmt: skip
    assert np.abs(px.astype(int) - ref.astype(int)).mean() < 6


def test_the_stem_normalises_uint8_with_imagenets_mean_and_std():
    import jax.numpy as jnp

    from models.inputs import MEAN, STD, prepare

    x = np.random.default_rng(0).integers(0, 256, (2, 4, 4, 3), dtype=np.uint8)
    want = (x / 255.0 - np.array(MEAN)) / np.array(STD)
    got = prepare(x, jnp.float32)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    assert prepare(x, jnp.bfloat16).dtype == jnp.bfloat16
    f = np.ones((1, 2), np.float32)
    assert (np.asarray(prepare(f, jnp.float32)) == f).all()  # floats: only cast


# -- sharding: one global permutation, every rank its slice ---------------------
def _indices(loader: StreamLoader, steps: int) -> list[int]:
    loader.audit = []
    _batches(loader, steps)
    return [i for batch in loader.audit for i in batch]


def test_three_ranks_read_disjoint_slices_of_each_epochs_permutation(clean):
    data = _data(clean)
    n = len(data.train)  # 33: 3 ranks x batch 4 = 12 a step, steps straddle
    ranks = [
        data.loader(batch_size=4, rank=r, size=3, seed=5, workers=1) for r in range(3)
    ]
    steps = 11  # 132 samples: 4 epochs exactly
    got = [_indices(loader, steps) for loader in ranks]
    stream = []
    for k in range(steps):  # the global stream, step by step, rank by rank
        for r in range(3):
            stream += got[r][4 * k : 4 * k + 4]
    for epoch in range(4):
        part = stream[epoch * n : (epoch + 1) * n]
        assert sorted(part) == list(range(n)), epoch  # each once, none skipped
        assert part == list(epoch_order(5, epoch, n))
    assert stream[:n] != stream[n : 2 * n]  # each epoch permuted afresh
    for loader in ranks:
        loader.close()


def test_folder_and_shards_give_the_same_batches(sample, shards):
    a = _data(sample).loader(batch_size=6, rank=1, size=3, seed=0, workers=2)
    b = _data(shards).loader(batch_size=6, rank=1, size=3, seed=0, workers=0)
    assert _data(shards).record()["source"] == "arrayrecord"
    for (xa, ya), (xb, yb) in zip(_batches(a, 5), _batches(b, 5)):
        assert (xa == xb).all() and (ya == yb).all()
    a.close(), b.close()
    ea = list(_data(sample).eval_batches(5, 0, 2))
    eb = list(_data(shards).eval_batches(5, 0, 2))
    assert len(ea) == len(eb) > 0
    for (xa, ya), (xb, yb) in zip(ea, eb):
        assert (xa == xb).all() and (ya == yb).all()


def test_evaluation_covers_val_once_over_the_ranks_and_leaves_out_the_undecodable(
    sample,
):
    data = _data(sample)
    seen = 0
    for r in range(3):
        for x, y in data.eval_batches(4, r, 3):
            assert x.shape[1:] == (SIZE, SIZE, 3) and len(x) == len(y)
            seen += len(y)
    assert seen == len(data.val) - 1  # the sample's one garbage val file


# -- exact resume ---------------------------------------------------------------
def test_resume_at_the_same_world_size_gives_the_same_next_batches(clean):
    data = _data(clean)

    def loader():
        return data.loader(batch_size=4, rank=2, size=3, seed=1, workers=2)

    through = loader()
    want = _batches(through, 9)
    first = loader()
    _batches(first, 4)
    position = json.loads(json.dumps(first.position))  # as a checkpoint keeps it
    first.close()
    assert position["grain"] is not None and position["samples"] == 4 * 12
    again = loader()
    again.set_position(position)
    for (x, y), (wx, wy) in zip(_batches(again, 5), want[4:]):
        assert (x == wx).all() and (y == wy).all()
    through.close(), again.close()


def _stream(loaders: list[StreamLoader], steps: int) -> list[int]:
    """The global stream the ranks read: step by step, rank by rank."""
    got = [_indices(loader, steps) for loader in loaders]
    batch = loaders[0].batch_size
    return [
        i
        for k in range(steps)
        for mine in got
        for i in mine[k * batch : (k + 1) * batch]
    ]


def test_resume_at_another_world_size_reads_the_rest_of_the_epoch_once(clean):
    data = _data(clean)
    n = len(data.train)  # 33
    three = [data.loader(batch_size=4, rank=r, size=3, seed=2) for r in range(3)]
    before = _stream(three, 2)  # 24 of epoch 0
    position = three[0].position
    assert all(loader.position == position for loader in three)
    two = [data.loader(batch_size=3, rank=r, size=2, seed=2) for r in range(2)]
    for loader in two:
        loader.set_position(json.loads(json.dumps(position)))
    after = _stream(two, 2)  # 12: epoch 0's last 9, epoch 1's first 3
    epoch0 = before + after[:9]
    assert sorted(epoch0) == list(range(n))  # none twice, none skipped
    assert epoch0 == list(epoch_order(2, 0, n))
    assert after[9:] == list(epoch_order(2, 1, n)[:3])
    for loader in three + two:
        loader.close()


def test_a_position_of_other_data_is_refused(clean, sample):
    a = _data(clean).loader(batch_size=4, rank=0, size=1, seed=0)
    b = _data(sample).loader(batch_size=4, rank=0, size=1, seed=0)
    with pytest.raises(ValueError, match="resume with the same data and --seed"):
        b.set_position(a.position)
    with pytest.raises(ValueError, match="not a stream position"):
        b.set_position({"step": 3})


def test_the_device_feed_never_records_batches_read_ahead(clean):
    from research.train.prefetch import DeviceFeed

    data = _data(clean)
    plain = data.loader(batch_size=4, rank=0, size=2, seed=3)
    want = _batches(plain, 8)
    feed = DeviceFeed(data.loader(batch_size=4, rank=0, size=2, seed=3), depth=2)
    for x, _ in want[:3]:
        got = feed.next_batch()
        assert (np.asarray(got[0]) == x).all() and feed.wait_s >= 0
    position = feed.position
    assert position["samples"] == 3 * 8  # not the batches queued behind
    feed.close()
    resumed = DeviceFeed(data.loader(batch_size=4, rank=0, size=2, seed=3))
    resumed.set_position(position)
    for x, y in want[3:]:
        got = resumed.next_batch()
        assert (np.asarray(got[0]) == x).all() and (np.asarray(got[1]) == y).all()
    resumed.close()
    plain.close()


def test_the_device_feed_raises_the_loaders_error_in_the_training_thread(clean):
    from research.train.prefetch import DeviceFeed

    loader = _data(clean).loader(batch_size=4, rank=0, size=1, seed=0)
    loader.split = None  # what a vanished file system does to reads: they raise
    feed = DeviceFeed(loader)
    with pytest.raises(AttributeError):  # None has no example(): raised here
        feed.next_batch()
    feed.close()


# -- the converter --------------------------------------------------------------
def test_the_converter_resumes_keeps_finished_shards_and_verifies(sample, tmp_path):
    dst = tmp_path / "ar"
    assert to_ar.main([str(sample), str(dst), "--per-shard", "10"]) == 0
    manifest = json.loads((dst / records.MANIFEST).read_text())
    assert manifest["classes"] == layout.classes_of(sample)
    assert manifest["splits"]["train"]["records"] == 42
    first = dst / manifest["splits"]["train"]["shards"][0]["file"]
    last = dst / manifest["splits"]["train"]["shards"][-1]["file"]
    t_first = first.stat().st_mtime_ns
    last.unlink()  # interrupted before the last train shard was renamed
    (dst / records.MANIFEST).unlink()
    assert to_ar.main([str(sample), str(dst), "--per-shard", "10"]) == 0
    assert first.stat().st_mtime_ns == t_first and last.is_file()
    assert json.loads((dst / records.MANIFEST).read_text()) == manifest
    assert to_ar.main(["--verify", str(dst)]) == 0
    assert to_ar.main([str(sample), str(dst), "--per-shard", "7"]) == 2  # other plan


def test_a_truncated_or_changed_shard_is_named_before_training(
    shards, tmp_path, capsys
):
    root = tmp_path / "cut"
    shutil.copytree(shards, root)
    shard = sorted(root.glob("train-*.array_record"))[1]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    problem = _problem(root)
    assert f"shard {shard} is" in problem and "truncated or changed" in problem
    shard.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size, changed
    assert _problem(root) is None  # the cheap check reads sizes and counts
    assert to_ar.main(["--verify", str(root)]) == 2
    assert f"shard {shard} has sha256" in capsys.readouterr().err
    (root / records.MANIFEST).write_text("{not json")
    assert "is not a readable manifest" in _problem(root)
