"""``python -m scripts.bench_input``: every figure it reports is measured on the
files it was given, its rows are the ones promised, bad input is one line.

Real JPEGs (``scripts.make_imagenet_sample``), the real pipeline and, where
torchvision is installed (``pip install .[bench]``), torchvision's path; CI has
no torch, so there its rows must say why they are missing.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from scripts import bench_input
from scripts.make_imagenet_sample import make_sample

TORCH = importlib.util.find_spec("torchvision") is not None
SMALL = ["--files", "12", "--rounds", "2", "--workers", "0", "2", "--batch", "4",
         "--loader-images", "8", "--size", "32"]  # fmt: skip


def _run(tmp_path, *extra: str) -> dict:
    out = tmp_path / "bench.json"
    assert bench_input.main([*SMALL, *extra, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_the_per_core_and_loader_rows_on_a_given_folder(tmp_path, capsys):
    data = tmp_path / "imagenet"
    make_sample(data, 3, 5, val_per_class=1, sizes=(60, 120), odd=False)
    res = _run(tmp_path, "--data-dir", str(data), "--no-train")
    assert res["files"]["files"] == 12 and res["files"]["classes"] == 3
    rows = res["per_core"]
    for name in ("decode simplejpeg", "decode pillow", "ours"):
        assert len(rows[name]["rounds"]) == 2
        assert rows[name]["images_per_s"] > 0
    for name in ("torchvision float", "torchvision uint8"):
        if TORCH:
            assert rows[name]["images_per_s"] > 0
        else:
            assert "pip install .[bench]" in rows[name]["skipped"]
    assert set(res["loaders"]) == {"0", "2"}
    for row in res["loaders"].values():
        assert row["ours"] > 0 and (("torchvision" in row) == TORCH)
    assert "training" not in res
    text = capsys.readouterr().out
    assert "decode simplejpeg" in text and "2 worker(s): ours" in text


def test_a_folder_that_is_not_imagenet_is_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code = bench_input.main([*SMALL, "--data-dir", str(tmp_path / "empty")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("bench_input: imagenet:")


def test_bad_flags_are_refused(capsys):
    for argv in (["--workers", "-1"], ["--steps", "2"], ["--rounds", "0"]):
        with pytest.raises(SystemExit) as e:
            bench_input.parse(argv)
        assert e.value.code == 2
    assert "--rounds must be >= 1" in capsys.readouterr().err


@pytest.mark.launches  # two experiments.train runs
def test_training_on_the_files_against_synthetic_data(tmp_path):
    res = _run(tmp_path, "--images", "16", "--train-workers", "1", "--model",
               "cnn_small", "--train-batch", "4", "--steps", "3")  # fmt: skip
    t = res["training"]
    assert t["model"] == "cnn_small" and t["data_workers"] == 1
    assert t["imagenet_median_step_s"] > 0 and t["synthetic_median_step_s"] > 0
    assert 0 <= t["imagenet_median_data_wait_s"] < t["imagenet_median_step_s"]
    assert t["step_ratio"] == pytest.approx(
        t["imagenet_median_step_s"] / t["synthetic_median_step_s"]
    )
