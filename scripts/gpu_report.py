"""The GPU page's part of a ``scripts.gpu_check`` run, from its folder alone.

Every figure is read from what the run wrote into its folder
(``results.json``: the machine and every training run; ``models.jsonl``,
``allreduce.json``, ``staging.json``, ``stall.json``, ``install.log``, the eager-SGD
experiment's run in ``eager_sgd/``); each of issue 41's GPU checks is listed
as met or not, with the number that decides it (single medians: the runs keep
no spread). :func:`write_report` writes ``table.md`` and ``checks.json`` at
the end of the run; :func:`render` is the same lines for ``python -m
scripts.results`` (``docs/results/gpu.md``), and :func:`readme` the README's
paragraph on the page.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from research.provenance import read_jobs
from research.strategies import registry
from scripts.bench_allreduce import IN_JIT, ON_HOST

#: A deterministic strategy's accuracy on the GPU is the CPU's within this (up
#: to the platforms' rounding: TF32 on the GPU); the others depend on timing
#: (``StrategyOptions.deterministic``).
ACC_TOLERANCE = 0.02
#: The project's step at most this times torchvision's (ResNet-50, fp32, bf16).
TARGET_RATIO = 0.9


def _f(x: Any, fmt: str = ".1f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, fmt)


def _cell(x: Any) -> str:
    """``x`` as one table cell: its ``|`` escaped (an install line holds some)."""
    return str(x).replace("|", "\\|")


def _models(root: Path, checks: list[dict]) -> list[str]:
    path = root / "models.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    by = {(r["model"], r["precision"], r["framework"]): r for r in rows}
    out = [
        "## Training steps: this project's models against torchvision's",
        "",
        "One step (forward, backward, SGD with momentum, BatchNorm statistics) "
        f"on random {rows[0]['image_size']}x{rows[0]['image_size']} images, median "
        "of the timed steps after warm-up, one configuration at a time "
        f"on the {rows[0]['platform'].upper()} (`scripts/bench_gpu.py`).",
        "",
        "| model | batch | precision | torchvision ms | ours ms | ours / torchvision "
        "| ours img/s | our first step s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model, precision in sorted({(m, p) for m, p, _ in by}):
        ours = by.get((model, precision, "jax")) or {}
        theirs = by.get((model, precision, "torch")) or {}
        ratio = ours["ms"] / theirs["ms"] if ours and theirs else None
        out.append(
            f"| {model} | {(ours or theirs)['batch']} | {precision} "
            f"| {_f(theirs.get('ms'), '.2f')} | {_f(ours.get('ms'), '.2f')} "
            f"| {_f(ratio, '.2f')} | {_f(ours.get('images_per_s'), '.0f')} "
            f"| {_f(ours.get('first_step_s'))} |"
        )
        if model == "resnet50":
            checks.append(
                {
                    "check": f"ResNet-50 {precision} step at most {TARGET_RATIO}x "
                    "torchvision's",
                    "met": ratio is not None and ratio <= TARGET_RATIO,
                    "value": ratio,
                }
            )
    if rows:
        r = rows[0]
        ver = {k: r[k] for k in ("jax", "torch", "torchvision") if k in r}
        sides = {x["framework"]: x for x in rows}
        if "torch" in sides:
            ver.update({k: sides["torch"][k] for k in ("torch", "torchvision")})
        if "jax" in sides:
            ver["jax"] = sides["jax"]["jax"]
            ver["our kernel gradient"] = sides["jax"].get("kernel_gradient")
        out += ["", "Versions: " + ", ".join(f"{k} {v}" for k, v in ver.items()), ""]
    return out


def _strategies(results: dict, checks: list[dict]) -> list[str]:
    rows = results.get("strategies") or []
    if not rows:
        return []
    by = {(r["platform"], r["strategy"], r["ranks"]): r for r in rows}
    gpu = any(p == "gpu" for p, _, _ in by)
    main = "gpu" if gpu else "cpu"
    out = [
        "## Every strategy at 1 and 2 ranks",
        "",
        f"`python -m experiments.train --np N --strategy S --steps ...` (cnn_small, "
        f"the synthetic task), on the {'GPU' if gpu else 'CPU'}"
        + (", and on the CPU (`JAX_PLATFORMS=cpu`) for the accuracy" if gpu else "")
        + "; several runs at a time, so the step times are concurrent ones.",
        "",
        f"| strategy | ranks | {main.upper()} accuracy | CPU accuracy | difference "
        f"| {main.upper()} step ms | samples/s | platforms | allreduce | exit |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    if not gpu:  # the CPU runs are the reference itself
        out[-2:] = [
            "| strategy | ranks | accuracy | step ms | samples/s | platforms "
            "| allreduce | exit |",
            "|---|---|---|---|---|---|---|---|",
        ]
    ran = []
    for (platform, strategy, ranks), r in sorted(by.items()):
        if platform != main:
            continue
        cpu = by.get(("cpu", strategy, ranks), {}) if gpu else {}
        diff = (
            abs(r["acc"] - cpu["acc"])
            if r.get("acc") is not None and cpu.get("acc") is not None
            else None
        )
        acc = f"{_f(r.get('acc'), '.4f')} |"
        if gpu:
            acc += f" {_f(cpu.get('acc'), '.4f')} | {_f(diff, '.4f')} |"
        out.append(
            f"| {strategy} | {ranks} | {acc} {_f(r.get('median_step_ms'), '.2f')} "
            f"| {_f(r.get('samples_per_s'), '.0f')} "
            f"| {','.join(r.get('platforms') or []) or '-'} "
            f"| {r.get('allreduce') or '-'} | {r['rc']} |"
        )
        ran.append(r["rc"] == 0 and r.get("platforms") == [main])
        if gpu and registry.options_class(strategy).deterministic:
            checks.append(
                {
                    "check": f"{strategy} at {ranks} ranks: GPU accuracy within "
                    f"{ACC_TOLERANCE} of the CPU's",
                    "met": diff is not None and diff <= ACC_TOLERANCE,
                    "value": diff,
                }
            )
    checks.insert(
        0,
        {
            "check": f"{_which(s for _, s, _ in by)} at 1 and 2 ranks runs on the "
            f"{main.upper()}",
            "met": bool(ran) and all(ran),
            "value": f"{sum(ran)}/{len(ran)}",
        },
    )
    return [*out, ""]


def _which(strategies: Any) -> str:
    """'every strategy', or the ones named where a run took fewer."""
    names = sorted(set(strategies))
    every = len(names) >= len(registry.names())
    return "every strategy" if every else ", ".join(names)


def _stop(results: dict, checks: list[dict]) -> list[str]:
    rows = results.get("stop") or []
    if not rows:
        return []
    out = [
        "## SIGTERM while training (2 ranks, DeepFreeze checkpoints)",
        "",
        "| strategy | exit | seconds from the signal | stopped at step |",
        "|---|---|---|---|",
    ]
    ok = []
    for r in rows:
        stopped = r.get("stopped") or {}
        out.append(
            f"| {r['strategy']} | {r['rc']} | {_f(r.get('stop_s'))} "
            f"| {stopped.get('step', '-')} |"
        )
        ok.append(r["rc"] == 143 and bool(stopped))
    checks.append(
        {
            "check": f"{_which(r['strategy'] for r in rows)} ends on SIGTERM "
            "(exit 143, the stop recorded)",
            "met": all(ok),
            "value": f"{sum(ok)}/{len(ok)}",
        }
    )
    return [*out, ""]


def _stall(root: Path, checks: list[dict]) -> list[str]:
    """``scripts.gpu_stall``'s rows: a stopped rank on each allreduce path."""
    path = root / "stall.json"
    if not path.exists():
        return []
    rows = json.loads(path.read_text())
    out = [
        "## A stalled rank (SIGSTOP of rank 1 of 2, mid-run)",
        "",
        "| path | platform | exit | seconds to the end | --comm-timeout | "
        "the watchdog's line | left |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        line = (r.get("watchdog_line") or r.get("problem") or "-").replace("|", "/")
        left = len(r.get("left") or []) + len(r.get("gpu_pids_left") or [])
        out.append(
            f"| {r['path']} | {r.get('platform')} | {r.get('rc')} | "
            f"{_f(r.get('end_s'))} | {_f(r.get('comm_timeout_s'), '.0f')} | "
            f"{line[:160]} | {left} |"
        )
    checks.append(
        {
            "check": f"{', '.join(r['path'] for r in rows)}: a stalled rank ends "
            "the job (exit 124 within --comm-timeout + 15 s, the collective "
            "named, nothing left)",
            "met": all(r.get("passed") for r in rows),
            "value": f"{sum(bool(r.get('passed')) for r in rows)}/{len(rows)}",
        }
    )
    return [*out, ""]


def _input(root: Path) -> list[str]:
    """``scripts.bench_input``'s figures (the input stage), when it ran."""
    path = root / "input.json"
    if not path.exists():
        return []
    from scripts.input_report import markdown

    res = json.loads(path.read_text())
    return ["## ImageNet input (this pipeline against torchvision's)", "",
            *markdown(res), ""]  # fmt: skip


def _allreduce(root: Path) -> list[str]:
    path = root / "allreduce.json"
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    out = ["## Allreduce paths", ""]
    for run in data.get("runs", [data]):
        out += [
            f"{run['ranks']} ranks, {run['bytes'] / 1e6:.1f} MB ({run['tree']}), "
            f"median of {run['reps']}; `python -m scripts.bench_allreduce --xla`.",
            "",
            "| variant | median ms | ratio to one MPI_Allreduce of host memory |",
            "|---|---|---|",
        ]
        for name, v in run["variants"].items():
            out.append(f"| {name} | {v['median_s'] * 1e3:.2f} | {v['ratio']:.2f} |")
        out.append("")
    return out


def _staging(root: Path) -> list[str]:
    path = root / "staging.json"
    if not path.exists():
        return []
    from scripts.bench_staging import format_table

    data = json.loads(path.read_text())
    sizes = data["sizes"]
    return [
        "## Staging through host memory",
        "",
        f"One process on {data['device']} ({data['platform']}), median of "
        f"{sizes[0]['reps'] if sizes else '-'}; (x) is the ratio to "
        "pjrt-round-trip; `python -m scripts.bench_staging`.",
        "",
        format_table(data),
        "",
    ]


def _eager(root: Path) -> list[str]:
    """The eager-SGD run's part: rendered from its data (``eager_sgd/``), or,
    in a folder kept before its data were (``eager_sgd-table.md``), the table
    it printed, as it printed it."""
    head = ["## make run's eager-SGD experiment (one seed)", ""]
    run = root / "eager_sgd"
    if (run / "results.json").is_file():
        from research.studies.eager_sgd_page import render as eager

        return [*head, *(("#" + ln if ln.startswith("#") else ln) for ln in eager(run)),
                ""]  # fmt: skip
    table = next((t for t in (run / "table.md", root / "eager_sgd-table.md")
                  if t.is_file()), None)  # fmt: skip
    if table is None:
        return []
    body = table.read_text().strip().splitlines()
    body = [("#" + ln if ln.startswith("#") else ln) for ln in body]
    kept = "Its run's data were not kept: the table as the run printed it."
    return [*head, kept, "", *body, ""]


def _install(log: str | Path | None, checks: list[dict]) -> list[str]:
    if not log or not Path(log).exists():
        return []
    lines = Path(log).read_text(errors="replace").splitlines()
    said = [ln for ln in lines if ln.startswith("[install]")]
    ok = [ln for ln in said if ln.startswith("[install] ok")]
    checks.append(
        {
            "check": "the install ends with mpi4jax importing against mpi4py's MPI",
            "met": bool(ok),
            "value": ok[-1] if ok else (said[-1] if said else None),
        }
    )
    return ["## Install", "", "```", *said[-12:], "```", ""]


#: What the GPU page keeps of a run folder (``python -m scripts.results``).
KEEP = (
    "results.json",
    "models.jsonl",
    "allreduce.json",
    "staging.json",
    "stall.json",
    "install.log",
    "eager_sgd-table.md",
    "eager_sgd/run.json",
    "eager_sgd/results.json",
    "eager_sgd/*/summary.json",
    "eager_sgd/table.md",
)


def report(root: Path, results: dict, install_log: str | Path | None) -> tuple:
    """``(lines, checks)`` of a run: the table and issue 41's checks."""
    checks: list[dict] = []
    m = results.get("machine", {})
    head = [
        "## Machine",
        "",
        f"GPUs: {'; '.join(m.get('gpus') or []) or 'none'}; {m.get('cores')} cores; "
        f"JAX {m.get('jax')} ({m.get('backend')}: "
        f"{', '.join(m.get('devices') or [])}), "
        f"Flax {m.get('flax')}, optax {m.get('optax')}; {m.get('mpi')}; mpi4jax "
        f"{m.get('mpi4jax')} (CUDA support: {m.get('mpi4jax_cuda')}).",
        "",
    ]
    body = [
        *_install(install_log, checks),
        *_models(root, checks),
        *_strategies(results, checks),
        *_stop(results, checks),
        *_stall(root, checks),
        *_input(root),
        *_allreduce(root),
        *_staging(root),
        *_eager(root),
    ]
    lines = ["## Checks", "", "| check | met | figure |", "|---|---|---|"]
    for c in checks:
        v = c["value"]
        shown = _f(v, ".3f") if isinstance(v, float) else _cell(v)
        lines.append(f"| {c['check']} | {'yes' if c['met'] else 'NO'} | {shown} |")
    if results.get("skipped"):
        lines += [
            "",
            "Not run (past the time budget): " + ", ".join(results["skipped"]),
        ]
    if results.get("cut"):
        lines += [
            "",
            "Ended or not started at the deadline: " + ", ".join(results["cut"]),
        ]
    text = "\n".join([*head, *lines, "", *body]).rstrip()
    return text.splitlines(), checks


def write_report(root: Path, results: dict, install_log: str | None) -> list[dict]:
    """Write ``table.md`` and ``checks.json`` (and keep the install log in the
    folder, where the page reads it); returns the checks."""
    if install_log and Path(install_log).is_file():
        kept = root / "install.log"
        if Path(install_log).resolve() != kept.resolve():
            kept.write_text(Path(install_log).read_text(errors="replace"))
    lines, checks = report(root, results, root / "install.log")
    (root / "table.md").write_text("\n".join(lines) + "\n")
    (root / "checks.json").write_text(json.dumps(checks, indent=1, default=str))
    return checks


def render(root: Path) -> list[str]:
    """The run's part of ``docs/results/gpu.md``, from its folder alone."""
    results = json.loads((root / "results.json").read_text())
    return report(root, results, root / "install.log")[0]


def readme(runs: list[Path], sections: dict[str, list[Path]]) -> str | None:
    """The README's paragraph: what the GPU runs showed, from their folders."""
    said = []
    device = ""
    for root in runs:
        results = json.loads((root / "results.json").read_text())
        m = results.get("machine", {})
        device = device or (m.get("devices") or ["?"])[0] + f" (JAX {m.get('jax')})"
        strategies = [
            r for r in results.get("strategies") or [] if r["platform"] == "gpu"
        ]
        if strategies:
            ran = [r for r in strategies if r["rc"] == 0]
            bad = ", ".join(
                f"{r['strategy']} at {r['ranks']} rank{'s' * (r['ranks'] > 1)}"
                for r in strategies
                if r["rc"] != 0
            )
            said.append(
                f"{len(ran)} of {len(strategies)} strategy runs at 1 and 2 ranks "
                "trained" + (f" ({bad} did not)" if bad else "")
            )
        stop = results.get("stop") or []
        if stop:
            ok = sum(r["rc"] == 143 and bool(r.get("stopped")) for r in stop)
            said.append(f"{ok} of {len(stop)} ended on SIGTERM with the stop recorded")
        models = root / "models.jsonl"
        if models.is_file():
            rows = [json.loads(x) for x in models.read_text().splitlines() if x.strip()]
            by = {(r["model"], r["precision"], r["framework"]): r for r in rows}
            step = [
                (prec, by[("resnet50", prec, "jax")], by[("resnet50", prec, "torch")])
                for prec in ("fp32", "bf16")
                if ("resnet50", prec, "jax") in by and ("resnet50", prec, "torch") in by
            ]
            if step:
                said.append(
                    f"a ResNet-50 training step (batch {step[0][1]['batch']}, median "
                    f"of {step[0][1]['steps']}) took "
                    + ", ".join(
                        f"{o['ms'] / t['ms']:.2f}x"
                        + (" torchvision's time" if i == 0 else "")
                        + f" in {p}"
                        for i, (p, o, t) in enumerate(step)
                    )
                )
        path = root / "allreduce.json"
        if path.is_file():
            data = json.loads(path.read_text())
            for run in data.get("runs", [data]):
                v = run["variants"]
                if IN_JIT in v and ON_HOST in v:
                    said.append(
                        f"averaging {run['bytes'] / 1e6:.0f} MB of GPU arrays over "
                        f"{run['ranks']} ranks (median of {run['reps']}): `{IN_JIT}` "
                        f"{v[IN_JIT]['ratio']:.2f}x the time of one MPI_Allreduce "
                        f"of host memory, `{ON_HOST}` {v[ON_HOST]['ratio']:.2f}x"
                    )
    if not said:
        return None
    when = sorted(j["started_utc"][:10] for r in runs for j in read_jobs(r))
    return (
        f"On one {device}, {when[0]} ([docs/results/gpu.md](docs/results/gpu.md), "
        "single runs: no spread): " + "; ".join(said) + "."
    )
