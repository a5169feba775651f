"""``table.md`` and ``checks.json`` of a ``scripts.gpu_check`` run folder.

Every figure is read from what the run wrote (the training runs' folders,
``models.jsonl``, ``allreduce.json``, ``staging.json``, the eager-SGD
experiment's own table); each of issue 41's GPU checks is listed as met or
not, with the number that decides it. ``python -m scripts.results RUN_DIR``
renders the table into ``docs/results/gpu.md``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from research.strategies import registry

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
    table = root / "eager_sgd" / "table.md"
    if not table.exists():
        return []
    body = table.read_text().strip().splitlines()
    body = [("#" + ln if ln.startswith("#") else ln) for ln in body]
    return ["## make run's eager-SGD experiment (one seed)", "", *body, ""]


def _install(log: str | None, checks: list[dict]) -> list[str]:
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


def write_report(root: Path, results: dict, install_log: str | None) -> list[dict]:
    """Write ``table.md`` and ``checks.json``; returns the checks."""
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
    text = "\n".join([*head, *lines, "", *body]).rstrip() + "\n"
    (root / "table.md").write_text(text)
    (root / "checks.json").write_text(json.dumps(checks, indent=1, default=str))
    return checks
