"""The Grain pipeline: one global stream of samples, every rank its slice of each step.

Sharding. The training split's examples, ``n`` of them, are permuted afresh
each epoch by :func:`epoch_order` (seeded, the same on every rank), and the
epochs' permutations laid end to end make one endless **global stream**:
stream position ``g`` is example ``epoch_order(seed, g // n)[g % n]``. Global
step ``k`` of a run of ``P`` ranks with ``B`` examples per rank takes stream
positions ``[k B P, (k + 1) B P)``, rank ``r`` the ``B`` from ``k B P + r B``.
So ranks read disjoint samples, every sample of an epoch is read exactly once
in it, and a step whose positions straddle two epochs takes the end of one and
the start of the next (nothing is dropped, so a resume at another world size
has nothing to skip either).

Position. :attr:`StreamLoader.position` is the global count of samples
consumed (with its epoch and place in it), the run's world size and batch, and
Grain's own iterator state (``{"next_index": ...}`` in batches, a few bytes). Resumed at
the same world size and batch, the loader restores Grain's state: the next
batches are those the interrupted run would have read. At another world size
it starts a stream from the global count: each remaining sample of the epoch
is read once, none twice. Every rank's position is the same dict, so the
rank-0 copy a checkpoint restore hands to every rank at another world size
serves all.

Determinism. A sample's crop and flip come from (seed, epoch, example index)
(``research/data/imagenet/transforms.py``), never from a worker's stream, so
the same sample is the same pixels whichever rank, thread or resume reads it.
An image no decoder reads is replaced by the next decodable example of the
same epoch's permutation (deterministic too: batch shapes and resumes stay
exact); the loader counts it, says so in one line on the first one, and
:meth:`StreamLoader.summary` lists the files. Evaluation leaves such images
out of its totals.

Workers. ``workers`` threads per rank make batches ahead of the step, each
thread a whole batch (Grain's ``ReadOptions``; ``prefetch_batches`` batches
ahead, at least one per worker): decode and resize release the GIL. Threads,
not processes: a rank forks nothing after MPI started. OpenCV is held to one
thread of its own (process-wide, set when a pipeline starts): the parallelism
is across batches, one per worker, and OpenCV's own pool on top of the workers
would only fight them and the rank's computation for the cores. Throughput per
core and per worker count, against torchvision's path: ``python -m
scripts.bench_input``.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from research.data.imagenet.decode import Undecodable, open_image
from research.data.imagenet.transforms import (
    eval_transform,
    sample_rng,
    train_transform,
)

STREAM = "imagenet-global-stream-v1"
#: Undecodable examples in a row before a sample gives up (a folder of them).
MAX_REPLACEMENTS = 64
_ORDER_TAG = 0x1A6F


def one_opencv_thread() -> None:
    """OpenCV's resize on the calling worker's thread alone (module docstring)."""
    import cv2

    cv2.setNumThreads(1)


def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """The permutation of ``n`` examples in ``epoch``: identical on every rank."""
    return np.random.default_rng([_ORDER_TAG, seed, epoch]).permutation(n)


class _Orders:
    """The last few epochs' permutations, computed once each (thread-safe)."""

    def __init__(self, seed: int, n: int, keep: int = 3) -> None:
        self.seed, self.n, self.keep = seed, n, keep
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, epoch: int) -> np.ndarray:
        with self._lock:
            order = self._cache.get(epoch)
            if order is None:
                order = epoch_order(self.seed, epoch, self.n)
                self._cache[epoch] = order
                while len(self._cache) > self.keep:
                    self._cache.popitem(last=False)
            return order


class Skips:
    """Undecodable images one rank met: a count, the files, one warning line."""

    def __init__(self, rank: int, what: str) -> None:
        self.rank, self.what = rank, what
        self.count = 0
        self.files: dict[str, str] = {}

    def note(self, where: str, reason: str) -> None:
        if self.count == 0:
            print(
                f"r{self.rank} | imagenet: {where} cannot be decoded ({reason}); "
                f"{self.what}; every such image is counted in summary.json "
                "(data.skipped), without another line",
                file=sys.stderr,
                flush=True,
            )
        self.count += 1
        self.files.setdefault(where, reason)

    def record(self) -> dict[str, Any]:
        return {"skipped": self.count, "skipped_files": sorted(self.files)}


class StreamLoader:
    """One rank's training batches of the global stream (see the module docstring).

    Args:
      split: the training split (``example(i) -> (bytes, label)``, ``where(i)``).
      batch_size: examples per rank per step.
      rank: this rank.
      size: ranks in the job.
      seed: the permutations' and augmentations' seed (the same on all ranks).
      image_size: output side in pixels.
      workers: decoding threads (0: in the thread that asks for the batch).
      prefetch_batches: batches decoded ahead.
      audit: keep the example indices of every batch read (``summary()["audit"]``;
        a device feed reads ahead of the steps trained), for
        tests and audits of small runs.

    Attributes:
      steps_per_epoch: ``n / (batch_size * size)`` (a float: steps straddle).
    """

    def __init__(
        self,
        split: Any,
        *,
        batch_size: int,
        rank: int,
        size: int,
        seed: int,
        image_size: int,
        workers: int = 1,
        prefetch_batches: int = 2,
        audit: bool = False,
    ) -> None:
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"need 0 <= rank < size, got rank={rank}, size={size}")
        if batch_size < 1 or workers < 0 or prefetch_batches < 1:
            raise ValueError("need batch_size >= 1, workers >= 0, prefetch >= 1")
        self.split, self.n = split, len(split)
        if batch_size * size > self.n:
            raise ValueError(
                f"a step of {batch_size} x {size} ranks needs more than the "
                f"{self.n} training images; use a smaller batch or fewer ranks"
            )
        self.batch_size, self.rank, self.size = batch_size, rank, size
        self.seed, self.image_size = seed, image_size
        self.workers, self.prefetch = workers, prefetch_batches
        self.steps_per_epoch = self.n / (batch_size * size)
        self._orders = _Orders(seed, self.n)
        self._origin, self._steps = 0, 0  # stream origin; steps consumed since
        self._state: Any = None  # Grain's state to restore when (re)built
        self._iter: Any = None
        self._reasons: dict[int, list[tuple[str, str]]] = {}
        self._lock = threading.Lock()
        self.skips = Skips(rank, "training reads the next image of the epoch instead")
        self.audit: list[list[int]] | None = [] if audit else None
        #: Evaluation's skips, reported with the loader's (set by the dataset).
        self.eval_skips: Skips | None = None

    # -- the stream --------------------------------------------------------------
    def _global(self, j: int) -> int:
        """Stream position of this rank's ``j``-th sample since the origin."""
        step, i = divmod(j, self.batch_size)
        return self._origin + (step * self.size + self.rank) * self.batch_size + i

    def _sample(self, j: int) -> dict[str, Any]:
        g = self._global(j)
        epoch, k = divmod(g, self.n)
        order = self._orders(epoch)
        bad: list[tuple[str, str]] = []
        for t in range(MAX_REPLACEMENTS):
            index = int(order[(k + t) % self.n])
            data, label = self.split.example(index)
            try:
                image = open_image(data)
                rng = sample_rng(self.seed, epoch, index)
                pixels = train_transform(image, self.image_size, rng)
            except Undecodable as e:
                bad.append((self.split.where(index), str(e)))
                continue
            if bad:
                with self._lock:
                    self._reasons[g] = bad
            return {"image": pixels, "label": np.int32(label),
                    "index": np.int64(index), "stream": np.int64(g),
                    "bad": np.int32(len(bad))}  # fmt: skip
        raise RuntimeError(
            f"imagenet: {MAX_REPLACEMENTS} undecodable images in a row from "
            f"{bad[0][0]}: the data are damaged; check the folder"
        )

    def _batch(self, step: int) -> dict[str, np.ndarray]:
        """This rank's ``step``-th batch since the origin, its samples stacked."""
        items = [
            self._sample(step * self.batch_size + i) for i in range(self.batch_size)
        ]
        return {key: np.stack([it[key] for it in items]) for key in items[0]}

    def _build(self) -> Any:
        import grain

        one_opencv_thread()
        # A worker makes a whole batch: one hand-off between threads a batch,
        # not a sample (one worker measured 0.88-0.96x none's rate, against
        # 0.72-0.84x with a sample a hand-off; journal, 2026-12-03).
        ds = grain.MapDataset.range(sys.maxsize).map(self._batch)
        options = grain.ReadOptions(
            num_threads=self.workers,
            prefetch_buffer_size=max(self.prefetch, self.workers)
            if self.workers
            else 0,
        )
        it = iter(ds.to_iter_dataset(options))
        if self._state is not None:
            it.set_state(self._state)
            self._state = None
        return it

    # -- the protocol ------------------------------------------------------------
    def next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        """The next ``(images uint8 (B, S, S, 3), labels int32 (B,))``."""
        if self._iter is None:
            self._iter = self._build()
        batch = next(self._iter)
        want = self._global(self._steps * self.batch_size)
        if int(batch["stream"][0]) != want:  # Grain's state and ours disagree
            raise RuntimeError(
                f"imagenet: the pipeline gave stream position "
                f"{int(batch['stream'][0])} where {want} was due"
            )
        self._steps += 1
        for g, n_bad in zip(batch["stream"], batch["bad"]):
            if n_bad:
                with self._lock:
                    for where, why in self._reasons.pop(int(g), ()):
                        self.skips.note(where, why)
        if self.audit is not None:
            self.audit.append([int(i) for i in batch["index"]])
        return batch["image"], batch["label"]

    @property
    def samples(self) -> int:
        """Global stream samples consumed, all ranks together."""
        return self._origin + self._steps * self.batch_size * self.size

    @property
    def position(self) -> dict[str, Any]:
        """The global position and Grain's state (see the module docstring)."""
        g = self.samples
        if self._iter is not None:
            state = self._iter.get_state()
        else:
            state = self._state
        return {
            "stream": STREAM,
            "samples": g,
            "epoch": g // self.n,
            "in_epoch": g % self.n,
            "examples": self.n,
            "seed": self.seed,
            "world_size": self.size,
            "batch_size": self.batch_size,
            "origin": self._origin,
            "grain": state,
        }

    def set_position(self, position: Mapping[str, Any]) -> None:
        """Continue from ``position``: exactly (Grain's state) at the same world
        size and batch, from the global count at another.

        Raises:
          ValueError: not this stream's position, or of another dataset or seed.
        """
        try:
            stream, g = position["stream"], int(position["samples"])
            n, seed = int(position["examples"]), int(position["seed"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"imagenet: position {dict(position)!r} is not a stream position "
                "(saved by another dataset?)"
            ) from None
        if stream != STREAM or n != self.n or seed != self.seed:
            raise ValueError(
                f"imagenet: the checkpoint's data position is of {n} examples, "
                f"seed {seed}; this run has {self.n}, seed {self.seed}: resume "
                "with the same data and --seed"
            )
        self.close()
        same = (position.get("world_size"), position.get("batch_size")) == (
            self.size,
            self.batch_size,
        )
        origin = int(position.get("origin", g))
        if same and position.get("grain") is not None:
            self._origin = origin
            self._steps = (g - origin) // (self.batch_size * self.size)
            self._state = position["grain"]
        else:  # another world size or batch: a fresh stream from the count
            self._origin, self._steps, self._state = g, 0, None

    def close(self) -> None:
        """Stop Grain's threads (no collective: safe on an error path)."""
        if self._iter is not None:
            it, self._iter = self._iter, None
            self._state = it.get_state()
            close = getattr(it, "close", None)
            if close is not None:
                close()

    def summary(self) -> dict[str, Any]:
        out = self.skips.record()
        if self.eval_skips is not None:
            ev = self.eval_skips.record()
            out["eval_skipped"] = ev["skipped"]
            out["eval_skipped_files"] = ev["skipped_files"]
        out["samples"] = self.samples
        if self.audit is not None:
            out["audit"] = self.audit
        return out


def eval_batches(
    split: Any,
    lo: int,
    hi: int,
    *,
    batch_size: int,
    image_size: int,
    workers: int,
    skips: Skips,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Batches of examples ``[lo, hi)`` of ``split``, centre-cropped, in order;
    undecodable ones are left out (and noted in ``skips``)."""
    import grain

    def sample(i: int) -> dict[str, Any]:
        data, label = split.example(i)
        try:
            pixels = eval_transform(open_image(data), image_size)
            ok = True
        except Undecodable as e:
            pixels = np.zeros((image_size, image_size, 3), np.uint8)
            ok, reason = False, str(e)
            with lock:
                reasons[i] = reason
        return {"image": pixels, "label": np.int32(label), "index": np.int64(i),
                "ok": np.bool_(ok)}  # fmt: skip

    lock, reasons = threading.Lock(), {}
    if hi <= lo:
        return
    one_opencv_thread()
    ds = grain.MapDataset.range(lo, hi).map(sample)
    options = grain.ReadOptions(
        num_threads=workers, prefetch_buffer_size=2 * batch_size if workers else 0
    )
    it = iter(ds.to_iter_dataset(options).batch(batch_size))
    try:
        for batch in it:
            ok = batch["ok"]
            if not ok.all():
                for i in batch["index"][~ok]:
                    with lock:
                        why = reasons.pop(int(i), "undecodable")
                    skips.note(split.where(int(i)), why)
                if not ok.any():
                    continue
                yield batch["image"][ok], batch["label"][ok]
            else:
                yield batch["image"], batch["label"]
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
