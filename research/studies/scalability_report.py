"""SC19 scalability study: rows from run folders into one table, and the cluster list.

``read_rows(dirs)`` gathers every ``results.jsonl`` under the given folders (a
laptop run writes one; a cluster array writes one per task folder), one row per
point id (the last wins, tags merged). ``format_table`` prints one section per
sweep; ``derived`` adds throughput, parallel efficiency and the delay absorbed.
Definitions (per model and strategy; T = median step time):

* throughput = ranks x batch per rank / T (samples/s);
* weak scaling (batch per rank fixed): efficiency = T(1) / T(P);
* strong scaling (global batch B fixed, B/P per rank): efficiency =
  T(1, B) / (P x T(P, B/P));
  T(1) is the same strategy's 1-rank point if measured, else host's (at 1 rank
  every strategy computes the same and communicates nothing);
* delay absorbed = injected delay - (T(delay) - T(0)) at the same strategy and
  link: the part of a straggler's delay that did not reach the step time.

Rows record their nodes; where ranks spanned several (``--hosts``), the table
ends with the link each rank count ran on (the real link was a network).

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


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{1e3 * v:.0f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def _row_line(r: dict[str, Any], tag: str) -> str:
    hidden = None
    if r.get("comm_s"):
        hidden = max(0.0, 1 - (r.get("exposed_s") or 0.0) / r["comm_s"])
    eff = r["eff_strong"] if tag == "ranks:strong" else r["eff_weak"]
    extra = ""
    if tag == "straggler":
        extra = (
            f" delay {_ms(r['delay'])} absorbed {_ms(r['absorbed_s'])} "
            f"late {_ms(r.get('late_median_s'))}"
        )
    elif tag == "checkpoint" and r["ckpt_every"]:
        extra = (
            f" every {r['ckpt_every']}: overhead {_pct(r['ckpt_overhead'])} "
            f"block {_ms(r.get('ckpt_block_s'))}/save "
            f"bg {_ms(r.get('ckpt_bg_s'))}/save "
            f"bg in gaps {_pct(r.get('ckpt_bg_in_gaps'))}"
        )
    elif tag == "checkpoint":
        extra = (
            f" no checkpoint: update gap {_ms(r.get('gap_median_s'))} "
            f"free {_pct(r.get('free_share_median'))}"
        )
    samples = r.get("samples_s")
    return (
        f"{r['model']:<9}{r['strategy']:<10}{r['ranks']:>3}x{r['threads']:<2}"
        f"{r['batch']:>4}{r['link'] if r['link'] != 'real' else '':>9}"
        f"{_ms(r.get('step_s')):>7}{'-' if not samples else f'{samples:.1f}':>8}"
        f"{'-' if eff is None else f'{eff:.2f}':>6}{_ms(r.get('compute_s')):>7}"
        f"{_ms(r.get('comm_s')):>6}{_ms(r.get('exposed_s')):>6}{_pct(hidden):>6}"
        + extra
    )


HEAD = (
    "model    strategy  PxT batch     link step ms  smp/s   eff  comp  comm "
    " expo hidden"
)


def format_table(rows: list[dict[str, Any]]) -> str:
    """One section per sweep; ms unless stated; see the module docstring."""
    rows = derived(rows)
    parts = []
    for tag, title in SECTIONS:
        mine = [r for r in rows if tag in r.get("tags", [])]
        if not mine:
            continue
        mine.sort(
            key=lambda r: (
                r["model"],
                r["strategy"],
                r["ranks"],
                r["threads"],
                r["batch"],
                r["delay"],
                r["ckpt_every"],
            )
        )
        parts.append(
            "\n".join([f"== {title}", HEAD, *(_row_line(r, tag) for r in mine)])
        )
    # Where ranks spanned nodes, the real link was a network: say which.
    nets = sorted(
        {(r["ranks"], r["link_label"]) for r in rows if (r.get("nodes") or 1) > 1}
    )
    if nets:
        parts.append("\n".join(f"{p} ranks: {label}" for p, label in nets))
    return "\n\n".join(parts)


def report(dirs: list[str | Path], out: str | Path, plots: bool = True) -> str:
    """Table (``out/table.md``) and figures (``out/*.png``) from ``dirs``' rows."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = read_rows(dirs)
    text = format_table(rows)
    (out / "table.md").write_text(text + "\n")
    if plots and rows:
        from research.studies.scalability_plots import plot_all

        plot_all(derived(rows), [Path(d) for d in dirs], out)
    return text


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
