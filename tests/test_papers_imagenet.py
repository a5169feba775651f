"""The papers that trained on ImageNet take ``--dataset imagenet --data-dir DIR``.

eager-SGD, DeepFreeze and SC18 overlap, at ``--paper-scale`` (224x224): the
config that reaches training names the dataset and its folder, keeps the
image size and none of the synthetic preset's options, so the class count
comes from the folder. A real eager-SGD run on 3 MPI ranks reads a generated
ImageNet-format sample (``scripts.make_imagenet_sample``); a bad folder is one
line before any rank starts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts.make_imagenet_sample import make_sample
from tests.harness import python

WNIDS = ["n00000000", "n00000001", "n00000002"]


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("papers") / "imagenet"
    make_sample(root, 3, 6, val_per_class=1, sizes=(40, 60))
    return root


def _paper(sample: Path) -> list[str]:
    return ["--paper-scale", "--dataset", "imagenet", "--data-dir", str(sample)]


def _reaches_training_on_imagenet(train, sample: Path) -> None:
    """``train`` (a TrainConfig) reads ``sample`` at 224x224, its classes
    the folder's (3), not the preset's 1000."""
    from research.data import get_dataset

    assert (train.data.name, train.data.dir) == ("imagenet", str(sample))
    assert train.data.options == {"image_size": 224}
    assert train.model.options["image_size"] == 224
    data = get_dataset(train.data.name, path=train.data.dir, **train.data.options)
    assert data.num_classes == 3 and data.input_shape == (224, 224, 3)
    assert data.record()["classes"] == WNIDS


def test_eager_sgd_at_paper_scale_trains_every_arm_on_imagenet(sample):
    from experiments.eager_sgd import parse
    from research.studies.eager_sgd import arm_config, base_config

    cfg = parse([*_paper(sample), "--data-workers", "8"])
    assert (cfg.train.model.name, cfg.launch.np, cfg.full_every) == ("resnet50", 64, 32)
    for arm in ("balanced", "allreduce", "solo", "ps"):
        run = arm_config(
            base_config(cfg), arm, 0, Path("runs"), allreduce_strategy="sync",
            full_every=cfg.full_every, reference_steps=cfg.reference_steps,
        )  # fmt: skip
        _reaches_training_on_imagenet(run, sample)
        assert run.data.workers == 8
    # The synthetic task of the preset is unchanged without --dataset.
    synthetic = parse(["--paper-scale"]).train
    assert synthetic.data.name == "synthetic_images"
    assert synthetic.data.options["num_classes"] == 1000


def test_deepfreeze_at_paper_scale_checkpoints_a_run_on_imagenet(sample):
    import models
    from experiments.deepfreeze import parse

    cfg = parse(_paper(sample))
    assert (cfg.train.model.name, cfg.launch.np) == ("resnet50", 64)
    _reaches_training_on_imagenet(cfg.train, sample)
    vgg = parse([*_paper(sample), "--model", "vgg16"]).train
    _reaches_training_on_imagenet(vgg, sample)
    # The ResNet stem is not VGG's: the paper's VGG builds with these options.
    assert "stem" not in vgg.model.options
    models.get_model("vgg16", num_classes=3, **vgg.model.options)
    # On ImageNet the default model is an image model at laptop scale too.
    small = parse(["--dataset", "imagenet", "--data-dir", str(sample)]).train
    assert small.model.name == "resnet50" and small.data.options == {"image_size": 32}


def test_overlap_at_paper_scale_times_steps_on_imagenet(sample):
    from experiments.overlap import parse
    from research.studies.overlap import run_config

    cfg = parse([*_paper(sample), "--data-workers", "4"])
    for model in ("vgg16", "resnet50"):
        run = run_config(cfg, model, "overlap", "real", Path("runs") / model)
        _reaches_training_on_imagenet(run, sample)
        assert run.data.workers == 4 and run.eval_every == 0
    default = run_config(parse(["--paper-scale"]), "vgg16", "host", "real", None)
    assert default.data.name == "synthetic_images"
    assert default.data.options["num_classes"] == 1000


def test_overlap_refuses_a_bad_folder_and_its_own_size_in_one_line(
    sample, tmp_path, capsys
):
    from experiments.overlap import parse

    for argv, says in (
        (["--dataset", "imagenet", "--data-dir", str(tmp_path)], "train not found"),
        (["--dataset", "imagenet"], "no data folder given (--data-dir)"),
        (
            [*_paper(sample), "--data-opt", "image_size=64"],
            "the steps' size is --image-size",
        ),
    ):
        with pytest.raises(SystemExit) as e:
            parse(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err.strip()
        assert says in err and "\n" not in err, err


def test_deepfreeze_names_a_bad_folder_before_any_rank_starts(tmp_path):
    empty = tmp_path / "empty"
    (empty / "train").mkdir(parents=True)
    proc = python(
        [
            *("-m", "experiments.deepfreeze", "--np", "3"),
            *("--dataset", "imagenet", "--data-dir", str(empty)),
            *("--run-dir", str(tmp_path / "run")),
        ],
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "holds no class folders" in lines[0], proc.stderr
    assert "r0 |" not in proc.stdout and not (tmp_path / "run").exists()


@pytest.mark.launches
def test_eager_sgd_reads_imagenet_on_three_ranks(tmp_path):
    # Without the odd files: an undecodable image's place goes to the next of
    # the stream (a sample twice), and this run checks one exact epoch.
    sample = tmp_path / "imagenet"
    make_sample(sample, 3, 6, val_per_class=1, sizes=(40, 60), odd=False)
    run = tmp_path / "eager"
    proc = python(
        [
            *("-m", "experiments.eager_sgd", "--np", "3", "--model", "cnn_small"),
            *("--dataset", "imagenet", "--data-dir", str(sample)),
            *("--data-opt", "image_size=16", "--data-opt", "audit=true"),
            *("--arms", "allreduce", "--reference-steps", "0", "--imbalance", "none"),
            *("--batch-size", "2", "--steps", "3", "--eval-every", "3"),
            *("--run-dir", str(run), "--no-plots", "--no-progress"),
        ],
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((run / "allreduce-s0" / "summary.json").read_text())
    assert summary["world_size"] == 3 and summary["steps"] == 3
    config = json.loads((run / "allreduce-s0" / "config.json").read_text())
    data = config["data"]
    assert (data["name"], data["source"], data["image_size"]) == (
        "imagenet",
        "folder",
        16,
    )
    assert data["classes"] == WNIDS and data["train_examples"] == 18
    # 3 steps of 3 ranks x 2 images: the folder's epoch, each image once.
    audits = [r["audit"] for r in summary["data"]["per_rank"]]
    seen = [i for a in audits for batch in a[:3] for i in batch]
    assert sorted(seen) == list(range(18))
    assert summary["data"]["median_data_wait_s"] >= 0
    assert summary["final_test_acc"] is not None  # val read too (3 images)
