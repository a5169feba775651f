"""ImageNet (ILSVRC-2012) streamed from disk: ``--dataset imagenet --data-dir DIR``.

Point the project at ImageNet::

    # the folder layout as distributed (train/<wnid>/*.JPEG, val/ in folders or
    # flat with a labels file), or ArrayRecord shards made from it once:
    python -m scripts.imagenet_to_arrayrecord /data/imagenet /scratch/imagenet-ar
    mpiexec -n 8 python -m experiments.train --model resnet50 \\
        --dataset imagenet --data-dir /scratch/imagenet-ar --data-workers 8 \\
        --batch-size 64 --epochs 90 --checkpoint deepfreeze

Options (``--data-opt KEY=VALUE``): ``image_size`` (224; 112 or less for CPU
runs), ``eval_examples`` (0: the whole val split; e.g. 10000 for quicker
evaluations), ``val_labels`` (a flat val split's labels file), ``prefetch_batches``
(2: host batches each rank decodes ahead), ``audit`` (keep every example index
read, in ``summary.json``: for tests of small runs). ``--data-workers N`` sets
each rank's decoding threads.

The parts: ``layout`` (the folder layout, its labels file, the cheap check),
``records`` (ArrayRecord shards and their manifest), ``decode`` (JPEG at reduced
scale, the odd files), ``transforms`` (RandomResizedCrop + flip, resize + centre
crop, per-sample randomness), ``pipeline`` (Grain: the global stream, per-rank
slices, position and resume), ``dataset`` (what the trainer reads). Nothing
here imports MPI or JAX; Grain, simplejpeg and OpenCV load when first used.
"""

from __future__ import annotations

from research.data.base import DataError, register
from research.data.imagenet import layout, records
from research.data.imagenet.dataset import (
    ImageNetData,
    is_records,
    options_problem,
    resolve,
)


def check(
    *,
    path: str | None,
    image_size: int = 224,
    eval_examples: int = 0,
    val_labels: str | None = None,
    prefetch_batches: int = 2,
    audit: bool = False,
) -> None:
    """The launcher's cheap check: options, layout or manifest and shards.

    Raises:
      DataError: the first problem, naming its file.
    """
    del audit
    problem = options_problem(image_size, eval_examples, prefetch_batches)
    if problem:
        raise DataError(problem)
    root = resolve(path)
    if is_records(root):
        records.check_manifest(root)
    else:
        layout.check_folder(root, val_labels)


@register("imagenet", check=check)
def load_imagenet(
    *,
    path: str | None = None,
    seed: int = 0,
    image_size: int = 224,
    eval_examples: int = 0,
    val_labels: str | None = None,
    prefetch_batches: int = 2,
    audit: bool = False,
) -> ImageNetData:
    """ImageNet from a folder layout or ArrayRecord shards (module docstring).

    Raises:
      DataError: a missing or malformed folder, labels file or shard.
    """
    del seed  # the loader's seed orders and augments; the files fix the data
    problem = options_problem(image_size, eval_examples, prefetch_batches)
    if problem:
        raise DataError(problem)
    return ImageNetData(
        resolve(path), image_size=image_size, eval_examples=eval_examples,
        val_labels=val_labels, prefetch_batches=prefetch_batches, audit=audit,
    )  # fmt: skip


__all__ = ["ImageNetData", "check", "load_imagenet"]
