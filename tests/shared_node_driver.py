"""The shared-node reproduction as a real MPI job (``tests/test_shared_node.py``).

    mpiexec -n 3 python -m tests.shared_node_driver RUN_DIR [FAST_DIR]

Issue 25's first reproduction: ``CheckpointConfig(saver="deepfreeze",
every=1).create(world, run_dir)``, ``save``, ``wait`` (with ``FAST_DIR`` as
the fast tier when given, else the default). While the checkpoint is in the
fast tier, every rank writes ``RUN_DIR/result-r<rank>.json``: the fast tier's
root, the transfer file, and the owner and mode of every folder and file in
them; then it closes. A refused folder gives ``{"refused": message}`` instead.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import warnings
from pathlib import Path

from research import privdir
from research.checkpoint import CheckpointConfig, CheckpointError
from research.comm.world import get_world
from tests.checkpoint_state import initial


def _entries(root: Path) -> list[dict]:
    out = []
    for dirpath, dirs, files in os.walk(root):
        for name in [".", *dirs, *files]:
            p = Path(dirpath) / name if name != "." else Path(dirpath)
            st = os.lstat(p)
            out.append(
                {
                    "path": str(p),
                    "kind": "dir" if stat.S_ISDIR(st.st_mode) else "file",
                    "uid": st.st_uid,
                    "mode": stat.S_IMODE(st.st_mode),
                }
            )
    return out


def _write(run_dir: Path, rank: int, doc: dict) -> None:
    """One JSON file per rank (ranks' printed lines interleave)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / f"result-r{rank}.json").write_text(json.dumps(doc))


def main() -> None:
    run_dir = Path(sys.argv[1])
    fast = sys.argv[2] if len(sys.argv) > 2 else "auto"
    world = get_world()
    config = CheckpointConfig(saver="deepfreeze", every=1, fast_dir=fast)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            ckpt = config.create(world, run_dir)
        except CheckpointError as e:
            _write(run_dir, world.rank, {"refused": str(e)})
            return
    ckpt.save(1, initial())
    ckpt.wait()
    fast_root = ckpt.tiers[0].root
    xfer = ckpt._xfer  # noqa: SLF001 - where the rank and its writer share bytes
    st = os.lstat(xfer)
    report = {
        "rank": world.rank,
        "size": world.size,
        "uid": os.geteuid(),
        "tiers": [t.name for t in ckpt.tiers],
        "committed": ckpt.committed_steps("fast"),
        "fast_root": str(fast_root),
        "fast": _entries(fast_root),
        "xfer": {
            "path": str(xfer),
            "link": stat.S_ISLNK(st.st_mode),
            "uid": st.st_uid,
            "mode": stat.S_IMODE(st.st_mode),
            "folder_mode": stat.S_IMODE(os.lstat(xfer.parent).st_mode),
        },
        "warnings": [
            str(w.message)
            for w in caught
            if issubclass(w.category, privdir.PrivateDirWarning)
        ],
    }
    world.comm.Barrier()  # every rank looked before any rank removes its shard
    _write(run_dir, world.rank, report)
    ckpt.close()


if __name__ == "__main__":
    main()
