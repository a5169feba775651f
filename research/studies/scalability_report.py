"""SC19 scalability study: rows from run folders into one table, and the cluster list.

``read_rows(dirs)`` gathers every ``results.jsonl`` under the given folders (a
laptop run writes one; a cluster array writes one per task folder), one row per
point id (the last wins, tags merged); ``derived`` adds throughput, parallel
efficiency and the delay absorbed; the tables and the findings' checks are
:mod:`research.studies.scalability_page`'s.
Definitions (per model and strategy; T = median step time):

* throughput = ranks x batch per rank / T (samples/s);
* weak scaling (batch per rank fixed): efficiency = T(1) / T(P);
* strong scaling (global batch B fixed, B/P per rank): efficiency =
  T(1, B) / (P x T(P, B/P));
  T(1) is the same strategy's 1-rank point if measured, else host's (at 1 rank
  every strategy computes the same and communicates nothing);
* delay absorbed = injected delay - (T(delay) - T(0)) at the same strategy and
  link: the part of a straggler's delay that did not reach the step time.


``cluster_lists`` writes one flag file per (ranks, threads) job group for
``scripts/slurm_array.sbatch`` / ``scripts/pbs_array.pbs`` and the commands that
submit them and merge the result.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SECTIONS = (
    ("ranks:weak", "ranks, weak scaling (batch per rank fixed)"),
    ("ranks:strong", "ranks, strong scaling (global batch fixed)"),
    ("threads", "threads x ranks at fixed cores (global batch fixed)"),
    ("batch", "batch size per rank"),
    ("straggler", "straggler on the last rank (delay after its backward pass)"),
    ("checkpoint", "DeepFreeze checkpoint every N steps"),
)


def read_rows(dirs: list[str | Path]) -> list[dict[str, Any]]:
    """Rows of every ``results.jsonl`` in or under ``dirs``, one per point id."""
    by_id: dict[str, dict[str, Any]] = {}
    for d in dirs:
        d = Path(d)
        files = [d] if d.is_file() else sorted(d.rglob("results.jsonl"))
        for f in files:
            for line in f.read_text().splitlines():
                if not line.strip():
                    continue
                row = json.loads(line)
                old = by_id.get(row["id"], {})
                tags = list(dict.fromkeys([*old.get("tags", []), *row.get("tags", [])]))
                by_id[row["id"]] = {**row, "tags": tags}
    return list(by_id.values())


FIELDS = ("model", "strategy", "ranks", "threads", "batch", "link", "delay")
FIELDS += ("ckpt_every",)


def _key(r: dict[str, Any]) -> tuple:
    return tuple(r[k] for k in FIELDS)


def derived(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with ``samples_s``, ``eff`` (per tag), ``absorbed_s``, ``ckpt_overhead``."""
    by = {_key(r): r for r in rows}

    def find(r: dict[str, Any], **kw: Any) -> dict[str, Any] | None:
        return by.get(_key({**r, **kw}))

    def one(r: dict[str, Any], batch: int) -> dict[str, Any] | None:
        """The 1-rank point: same strategy if measured, else host's."""
        same = find(r, ranks=1, threads=1, batch=batch)
        return same or find(
            r, strategy="host", ranks=1, threads=1, batch=batch, link="real"
        )

    out = []
    for r in rows:
        r = dict(r)
        t = r.get("step_s")
        r["samples_s"] = r["ranks"] * r["batch"] / t if t else None
        weak, strong = one(r, r["batch"]), one(r, r["batch"] * r["ranks"])
        r["eff_weak"] = weak["step_s"] / t if weak and t else None
        r["eff_strong"] = strong["step_s"] / (r["ranks"] * t) if strong and t else None
        base = find(r, delay=0.0)
        r["absorbed_s"] = (
            r["delay"] - (t - base["step_s"]) if r["delay"] and base and t else None
        )
        none = find(r, ckpt_every=0)
        r["ckpt_overhead"] = (
            t / none["step_s"] - 1 if r["ckpt_every"] and none and t else None
        )
        out.append(r)
    return out


def cluster_lists(
    points: dict[str, Any], flags: list[str], root: str | Path
) -> tuple[list[Path], str]:
    """Flag files (one line per point) per (ranks, threads) group, and the commands.

    Each line runs one configuration into ``root/<id>``; ``flags`` (the sweep's
    own flags) follow on every line so that the job rebuilds the same plan.
    """
    from research.studies.scalability import jobs

    root = Path(root).absolute()
    root.mkdir(parents=True, exist_ok=True)
    files, cmds = [], []
    for (n, t), ids in jobs(points).items():
        f = root / f"sweep-np{n}-t{t}.txt"
        lines = [f"# {len(ids)} configuration(s) on {n} rank(s), {t} thread(s) each"]
        lines += [f"--points {i} --run-dir {root / i}" for i in ids]
        f.write_text("\n".join(lines) + "\n")
        files.append(f)
        common = " ".join(flags)
        cmds.append(
            f"sbatch --array=0-{len(ids) - 1} -n {n} -c {t} scripts/slurm_array.sbatch "
            f"experiments.scalability {f} {common}"
        )
        cmds.append(
            f"qsub -J 0-{len(ids) - 1} -l select=1:ncpus={n * t}:mpiprocs={n} -v "
            f"MODULE=experiments.scalability,LIST={f},THREADS={t},NP={n},"
            f'ARGS="{common}" scripts/pbs_array.pbs'
        )
    cmds.append(f"python -m experiments.scalability --merge {root}")
    text = "\n".join(cmds) + "\n"
    (root / "submit.sh").write_text("#!/bin/bash\n# one job per configuration\n" + text)
    return files, text
