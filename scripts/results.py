"""Render the docs' results pages from run folders: ``docs/results/NAME.md``.

    python -m scripts.results RUN_ROOT [RUN_ROOT ...] [--out docs/results] [--note TEXT]

Each ``RUN_ROOT`` is the folder one ``python -m experiments.NAME`` wrote. The
page says what produced the table: the command, the UTC time it ran, the
machine and its load, and the commit (from ``RUN_ROOT/run.json``, see
:mod:`research.provenance`), then the experiment's own ``table.md`` exactly as
the run wrote it, then its figures (copied next to the page). Several roots of
one experiment become one page with a section per run, in the order given. A
page is replaced whole: the tables in ``docs/results/`` are never typed by
hand, and the previous ones stay in git history and the journal
(``docs/journal.md``).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import time
from collections import defaultdict
from pathlib import Path

from research.provenance import read_jobs

#: Page titles: the paper each experiment reproduces.
TITLES = {
    "eager_sgd": "eager-SGD: partial collectives under load imbalance (PPoPP'20)",
    "deepfreeze": "DeepFreeze: asynchronous sharded checkpointing (CCGrid'20)",
    "overlap": "SC18: gradient averaging overlapped with computation (MLHPC@SC18)",
    "sparcml": "SparCML: sparse allreduce (SC19)",
    "scalability": "Scalability and fine-grain parallelism (MLHPC@SC19)",
    "adaptive": "Adaptive averaging: dense, top-k or partial, chosen while it trains",
    "train": "experiments.train",
}


class ResultsError(Exception):
    """A run folder that cannot be rendered; the message says why."""


def _experiment_of(root: Path, jobs: list[dict]) -> str:
    if jobs:
        return str(jobs[0]["experiment"])
    name = root.name.rsplit("-", 2)[0]  # runs/<experiment>-<date>-<time>
    if name in TITLES:
        return name
    raise ResultsError(
        f"{root}: no run.json saying which experiment wrote it (runs made before "
        "provenance was recorded: run the experiment again)"
    )


def _provenance(root: Path, jobs: list[dict]) -> str:
    table = root / "table.md"
    written = time.strftime("%Y-%m-%d %H:%M", time.gmtime(table.stat().st_mtime))
    if not jobs:
        return f"Run folder `{root.name}`, table written {written} UTC (no run.json)."
    first = jobs[0]
    sizes = sorted({int(j.get("world_size", 0)) for j in jobs})
    ranks = "/".join(str(s) for s in sizes)
    ended = jobs[-1].get("ended_utc", written)
    if ended[:10] == first["started_utc"][:10]:
        ended = ended[11:16]
    starts = [j["load_average"][0] for j in jobs if j.get("load_average")]
    ends = [j["load_average_end"][0] for j in jobs if j.get("load_average_end")]

    def span(xs: list[float]) -> str:
        return f"{min(xs):.1f}-{max(xs):.1f}" if len(xs) > 1 else f"{xs[0]:.1f}"

    load = f"{span(starts)} as the job{'s' if len(jobs) > 1 else ''} started"
    if ends:
        load += f", {span(ends)} as {'they' if len(jobs) > 1 else 'it'} ended"
    mem = first.get("memory_gib")
    machine = (
        f"{first.get('host', '?')}: {first.get('cpu', '?')}, "
        f"{first.get('cores', '?')} cores" + (f", {mem} GiB" if mem else "")
    )
    code = first.get("commit") or "not a git checkout"
    # Runs recorded before sub-jobs' --job was split off: the typed command.
    command = re.sub(r" --job[ =]\S+", "", first["command"])
    return (
        f"`{command}` ({ranks} ranks, {len(jobs)} MPI job"
        f"{'s' if len(jobs) > 1 else ''}), {first['started_utc'][:16]} to {ended} "
        f"UTC, on {machine}; 1-minute load average {load} (the run's own ranks "
        f"count); code {code}. Run folder `{root.name}`."
    )


def _as_markdown(table: str) -> list[str]:
    """``table.md`` as the page shows it: tables and headings as written, each
    other line (a check, a note) as a list item so lines do not run together."""
    out = []
    for line in table.rstrip().splitlines():
        plain = line.strip() and not line.startswith(("|", "#", "!", "-", "*", " "))
        out.append(f"- {line}" if plain else line)
    return out


def render(roots: list[Path], out: Path, note: str | None = None) -> list[Path]:
    """Write one page per experiment found in ``roots``; returns the pages.

    ``note``: a line added under each run's provenance (what else was running,
    anything the records cannot say).
    """
    by_experiment: dict[str, list[tuple[Path, list[dict]]]] = defaultdict(list)
    for root in roots:
        if not root.is_dir():
            raise ResultsError(f"{root}: no such run folder")
        if not (root / "table.md").is_file():
            raise ResultsError(
                f"{root}: no table.md (the run did not finish, or this is one arm's "
                "folder: pass the experiment's run root)"
            )
        jobs = read_jobs(root)
        by_experiment[_experiment_of(root, jobs)].append((root, jobs))
    out.mkdir(parents=True, exist_ok=True)
    pages = []
    for experiment, runs in by_experiment.items():
        figures = out / experiment
        if figures.exists():
            shutil.rmtree(figures)
        lines = [
            f"# {TITLES.get(experiment, experiment)}",
            "",
            "<!-- Generated by `python -m scripts.results "
            + " ".join(str(r) for r, _ in runs)
            + "`: regenerate, do not edit. -->",
            "",
            f"What the experiment does and how to read it: the docstring of "
            f"`experiments/{experiment}.py` (`python -m experiments.{experiment} "
            "--help`). Earlier runs: `docs/journal.md`.",
        ]
        for i, (root, jobs) in enumerate(runs, start=1):
            if len(runs) > 1:
                lines += ["", f"## Run {i}"]
            lines += ["", _provenance(root, jobs), ""]
            if note:
                lines += [note, ""]
            lines += _as_markdown((root / "table.md").read_text())
            pngs = sorted(root.glob("*.png"))
            if pngs:
                dest = figures if len(runs) == 1 else figures / f"run{i}"
                dest.mkdir(parents=True, exist_ok=True)
                lines.append("")
                for png in pngs:
                    shutil.copy2(png, dest / png.name)
                    rel = dest.relative_to(out) / png.name
                    lines.append(f"![{png.stem}]({rel.as_posix()})")
        page = out / f"{experiment}.md"
        page.write_text("\n".join(lines) + "\n")
        pages.append(page)
    return pages


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m scripts.results",
        description=__doc__.split("\n\n")[0],
        epilog="Example: python -m scripts.results runs/eager_sgd-20261124-161000",
    )
    p.add_argument("roots", nargs="+", type=Path, help="run folders (run roots)")
    p.add_argument(
        "--out",
        type=Path,
        default=Path("docs/results"),
        help="where the pages go (default %(default)s)",
    )
    p.add_argument(
        "--note",
        help="a line under each run's provenance, e.g. what else was running",
    )
    args = p.parse_args(argv)
    try:
        pages = render(args.roots, args.out, args.note)
    except ResultsError as e:
        print(f"python -m scripts.results: error: {e}", file=sys.stderr)
        return 2
    for page in pages:
        print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
