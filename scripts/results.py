"""Render the docs' results pages from run folders: ``docs/results/NAME.md``.

    python -m scripts.results RUN_ROOT [RUN_ROOT ...] [--out docs/results] [--note TEXT]
    python -m scripts.results RUN_ROOT ... --section "Real network (local cluster)"

Each ``RUN_ROOT`` is the folder one ``python -m experiments.NAME`` wrote. The
page says what produced the table: the command, the UTC time it ran, the
machine and its load, the nodes and their link where the ranks spanned several,
and the commit (from ``RUN_ROOT/run.json``, see :mod:`research.provenance`),
then the experiment's own ``table.md`` exactly as the run wrote it, then its
figures (copied next to the page). Several roots of one experiment become one
page with a part per run, in the order given. A page is replaced whole: the
tables in ``docs/results/`` are never typed by hand, and the previous ones stay
in git history and the journal (``docs/journal.md``).

``--section TITLE`` renders the roots (of one experiment) into a named section
of that experiment's page instead: a ``## TITLE`` part between generated
markers (``<!-- begin section: TITLE -->`` ... ``<!-- end section: TITLE -->``)
that replaces the section of that title and leaves the rest of the page as it
is (a page that does not exist yet gets the usual head first). A section's
figures go to ``NAME/<slug of TITLE>/``, apart from the page's own. Rendering
the whole page again keeps its sections and their figures, after the new runs.
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
    "network": "The network: the link model against TCP between nodes",
    "gpu": "GPUs: every strategy, the allreduce paths and the models on a GPU",
}
#: The program that writes each experiment's run folder, where not
#: ``experiments.<name>``.
PROGRAMS = {"network": "scripts.bench_link", "gpu": "scripts.gpu_check"}

#: The markers around a named section (``--section``).
BEGIN, END = "<!-- begin section: {} -->", "<!-- end section: {} -->"
_SECTION = re.compile(
    r"<!-- begin section: (?P<title>.+?) -->\n.*?<!-- end section: (?P=title) -->\n?",
    re.S,
)


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
    nodes = [j for j in jobs if j.get("network")]
    if nodes:
        widest = max(nodes, key=lambda j: len(j.get("hosts") or ()))
        counts = "/".join(str(n) for n in sorted({len(j["hosts"]) for j in nodes}))
        machine = (
            f"{counts} nodes ({', '.join(widest['hosts'])}; "
            f"{widest['network']}), each node {machine.split(': ', 1)[1]}"
        )
    code = first.get("commit") or "not a git checkout"
    # Runs recorded before sub-jobs' --job was split off: the typed command.
    command = re.sub(r" --job[ =]\S+", "", first["command"])
    # What a driver adds to the jobs it launches (experiments.overlap).
    command = re.sub(r" --run-dir \S+ --point$", "", command)
    return (
        f"`{command}` ({ranks} ranks, {len(jobs)} MPI job"
        f"{'s' if len(jobs) > 1 else ''}), {first['started_utc'][:16]} to {ended} "
        f"UTC, on {machine}; 1-minute load average {load} (the run's own ranks "
        f"count); code {code}. Run folder `{root.name}`."
    )


def _as_markdown(table: str) -> list[str]:
    """``table.md`` as the page shows it: tables and headings as written, each
    other line (a check, a note) as a list item so lines do not run together;
    a fenced block (a log) as written."""
    out = []
    fenced = False
    for line in table.rstrip().splitlines():
        if line.startswith("```"):
            fenced = not fenced
            out.append(line)
            continue
        plain = line.strip() and not line.startswith(("|", "#", "!", "-", "*", " "))
        out.append(f"- {line}" if plain and not fenced else line)
    return out


def _read(roots: list[Path]) -> dict[str, list[tuple[Path, list[dict]]]]:
    """The roots by experiment, each with its job records; checks each has a table."""
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
    return by_experiment


def _notes(note: str | list[str] | None, runs: int) -> list[str | None]:
    """One note per run: none, the same for every run, or one each."""
    if note is None or isinstance(note, str):
        return [note] * runs
    if len(note) == 1:
        return list(note) * runs
    if len(note) != runs:
        raise ResultsError(
            f"{len(note)} --note lines for {runs} run folders: give one for every "
            "run, or one per run in the order of the folders"
        )
    return list(note)


def _runs(
    runs: list[tuple[Path, list[dict]]],
    out: Path,
    figures: Path,
    notes: list[str | None],
    heading: str,
) -> list[str]:
    """Lines of one or several runs: provenance, note, table, figures (copied to
    ``figures``, a ``run<i>`` folder each when there are several)."""
    lines: list[str] = []
    for i, ((root, jobs), note) in enumerate(zip(runs, notes, strict=True), start=1):
        if len(runs) > 1:
            lines += ["", f"{heading} Run {i}"]
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
    return lines


def _head(experiment: str, command: str) -> list[str]:
    program = PROGRAMS.get(experiment, f"experiments.{experiment}")
    return [
        f"# {TITLES.get(experiment, experiment)}",
        "",
        f"<!-- Generated by `{command}`: regenerate, do not edit. -->",
        "",
        f"What the experiment does and how to read it: the docstring of "
        f"`{program.replace('.', '/')}.py` (`python -m {program} "
        "--help`). Earlier runs: `docs/journal.md`.",
    ]


def slug(title: str) -> str:
    """A section's folder name: ``"Real network (local cluster)"`` ->
    ``"real-network-local-cluster"``."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def check_title(title: str) -> str:
    """``title`` stripped, or ResultsError: one line, no marker text, a slug."""
    title = title.strip()
    if not title or "\n" in title or "-->" in title or "<!--" in title:
        raise ResultsError(
            f"--section {title!r}: a section title is one line of text without "
            "'<!--' or '-->'"
        )
    if not slug(title) or re.fullmatch(r"run\d+", slug(title)):
        raise ResultsError(
            f"--section {title!r}: the title needs letters or digits to name its "
            "figures' folder (and may not be 'runN', the page's own run folders)"
        )
    return title


def sections(page: str) -> dict[str, str]:
    """The named sections of a page's text: title -> its block, markers included."""
    return {m["title"]: m[0].rstrip("\n") for m in _SECTION.finditer(page)}


def render(
    roots: list[Path], out: Path, note: str | list[str] | None = None
) -> list[Path]:
    """Write one page per experiment found in ``roots``; returns the pages.

    ``note``: a line added under each run's provenance (what else was running,
    anything the records cannot say), or a list of one line per root. The named
    sections of an existing page (``--section``) and their figures are kept,
    after the runs.
    """
    notes = dict(zip(roots, _notes(note, len(roots)), strict=True))
    by_experiment = _read(roots)
    out.mkdir(parents=True, exist_ok=True)
    pages = []
    for experiment, runs in by_experiment.items():
        page = out / f"{experiment}.md"
        kept = sections(page.read_text()) if page.is_file() else {}
        figures = out / experiment
        if figures.exists():
            keep = {slug(t) for t in kept}
            for child in figures.iterdir():
                if child.name in keep and child.is_dir():
                    continue
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        command = "python -m scripts.results " + " ".join(str(r) for r, _ in runs)
        lines = _head(experiment, command)
        lines += _runs(runs, out, figures, [notes[r] for r, _ in runs], "##")
        for block in kept.values():
            lines += ["", block]
        page.write_text("\n".join(lines) + "\n")
        pages.append(page)
    return pages


def render_section(
    roots: list[Path], out: Path, title: str, note: str | list[str] | None = None
) -> Path:
    """Write ``roots`` (one experiment's) as the section ``title`` of its page.

    Replaces that section where the page has it, else appends it; the rest of
    the page stays as it is. Figures go to ``out/<experiment>/<slug(title)>/``.
    Returns the page.
    """
    title = check_title(title)
    notes = _notes(note, len(roots))
    by_experiment = _read(roots)
    if len(by_experiment) > 1:
        raise ResultsError(
            "a section belongs to one page: the run folders are of "
            + ", ".join(sorted(by_experiment))
        )
    ((experiment, runs),) = by_experiment.items()
    out.mkdir(parents=True, exist_ok=True)
    figures = out / experiment / slug(title)
    if figures.exists():
        shutil.rmtree(figures)
    command = (
        "python -m scripts.results "
        + " ".join(str(r) for r, _ in runs)
        + f' --section "{title}"'
    )
    block = [
        BEGIN.format(title),
        f"## {title}",
        "",
        f"<!-- Generated by `{command}`: regenerate, do not edit. -->",
        *_runs(runs, out, figures, notes, "###"),
        END.format(title),
    ]
    text = "\n".join(block)
    page = out / f"{experiment}.md"
    old = page.read_text() if page.is_file() else "\n".join(_head(experiment, command))
    match = next((m for m in _SECTION.finditer(old) if m["title"] == title), None)
    if match:
        new = old[: match.start()] + text + "\n" + old[match.end() :]
    else:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    page.write_text(new)
    return page


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
        action="append",
        help="a line under each run's provenance, e.g. what else was running; "
        "given once per run folder, one for each, in order",
    )
    p.add_argument(
        "--section",
        metavar="TITLE",
        help="render into the section TITLE of the experiment's page, replacing "
        "only that section (e.g. 'Real network (local cluster)')",
    )
    args = p.parse_args(argv)
    try:
        if args.section is not None:
            pages = [render_section(args.roots, args.out, args.section, args.note)]
        else:
            pages = render(args.roots, args.out, args.note)
    except ResultsError as e:
        print(f"python -m scripts.results: error: {e}", file=sys.stderr)
        return 2
    for page in pages:
        print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
