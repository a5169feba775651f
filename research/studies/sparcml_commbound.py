"""SparCML study, the communication-bound comparison (``--comm-bound``).

Dense (``host``), top-k with error feedback and top-k with 4-bit values on
models where communication can dominate, on each ``--cb-links`` link, one seed:
step time, time to the model's target accuracy, final accuracy, bytes per
step; the check compares time to target on each emulated link and on the real
link where the ranks span several nodes (a network; on shared memory it is not a
claim of the paper). The reading
(where sparse training can win) is in ``research/studies/sparcml.py``'s
docstring, the figures in ``experiments/sparcml.py``'s.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from research.comm.link import Link
from research.studies.sparcml_arms import arm_config, load_arm, run_arm

#: Models of the comparison: what each trains on (full sizes; tiny ones for tests).
COMM_BOUND: dict[str, dict[str, Any]] = {
    "candle_p1b2": {"dataset": "synthetic_tabular", "batch_size": 32, "target": 0.25},
    "resnet50": {
        "dataset": "synthetic_images",
        "data_options": {"image_size": 32},
        "batch_size": 8,
        "target": 0.6,
    },
    "candle_p1b2_tiny": {
        "dataset": "synthetic_tabular",
        "data_options": {"features": 256, "n_train": 512, "n_test": 64},
        "batch_size": 8,
        "target": 0.2,
    },
    "resnet_tiny": {
        "dataset": "synthetic_images",
        "data_options": {"image_size": 16, "n_train": 256, "n_test": 64},
        "batch_size": 8,
        "target": 0.2,
    },
}
COMM_ARMS = ("dense", "topk_ef", "topk_4bit")


def run_comm_bound(cfg, root: Path, world) -> list[dict[str, Any]]:
    """Every model x link x arm of the comparison, one seed; rows on rank 0.

    ``cfg``: ``experiments.sparcml.Config`` (its ``train`` is the base).
    """
    from research.train.report import link_label

    rows: list[dict[str, Any]] = []
    for model in cfg.cb_models:
        spec = COMM_BOUND[model]
        for link in cfg.cb_links:
            base = dataclasses.replace(
                cfg.train,
                model=model,
                model_options={},
                dataset=spec["dataset"],
                data_options=dict(spec.get("data_options", {})),
                batch_size=spec["batch_size"],
                steps=cfg.cb_steps,
                eval_every=cfg.cb_eval_every,
                link=link,
                seed=cfg.seeds[0],
            )
            for arm in COMM_ARMS:
                run = arm_config(
                    base,
                    arm,
                    root / "comm_bound" / f"{model}-{link}",
                    density=cfg.train_density,
                    bits=cfg.bits,
                    scope=cfg.scope,
                    warmup_steps=cfg.sparse_warmup,
                )
                run_arm(run, f"{model} {link} {arm}", world)
                world.barrier()
                if world.rank == 0:
                    target = cfg.cb_target or spec["target"]
                    r = load_arm(Path(run.run_dir), target)
                    rows.append(
                        {
                            **r,
                            "model": model,
                            "link": link,
                            "link_label": link_label(link, world),
                            "nodes": world.nodes,
                            "arm": arm,
                            "target": target,
                        }
                    )
    return rows


def format_comm_bound(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'model':>12} {'link':>7} {'arm':>10} {'ms/step':>8} "
        f"{'target':>6} {'reached':>9} {'final acc':>9} {'MB/step/rank':>12}"
    ]
    for r in rows:
        t, b = r["time_to_target_s"], r["bytes_per_step"]
        lines.append(
            f"{r['model']:>12} {r['link']:>7} {r['arm']:>10} "
            f"{1e3 * (r['mean_step_s'] or float('nan')):8.1f} {r['target']:6g} "
            f"{'-' if t is None else f'{t:.1f} s':>9} {r['final_test_acc']:9.4f} "
            f"{'-' if b is None else f'{b / 1e6:.3f}':>12}"
        )
    real = sorted({r["link_label"] for r in rows if _network(r)})
    lines += [f"real: {label}" for label in real]
    return "\n".join(lines)


def _network(row: dict[str, Any]) -> bool:
    """A real-link row whose ranks spanned several nodes (rows written before
    nodes were recorded: no)."""
    return not Link.parse(row["link"]).emulated and (row.get("nodes") or 1) > 1


def _step_reached(row: dict[str, Any], target: float) -> int | None:
    """The first evaluated step at or above ``target`` (None: never)."""
    return next((s for s, acc in row.get("curve", []) if acc >= target), None)


def _phases_note(topk: dict[str, Any], dense: dict[str, Any]) -> str:
    """Where the step time goes, and what the selection costs against what the
    smaller allreduce saves (the reason a FAIL fails, in numbers)."""
    pt, pd = topk.get("phases_ms") or {}, dense.get("phases_ms") or {}
    if not pt or not pd:
        return ""

    def parts(p: dict[str, float]) -> str:
        return " + ".join(f"{k} {v:.0f}" for k, v in p.items())

    note = f"; ms per step: top-k {parts(pt)}; dense {parts(pd)}"
    if "select" in pt and "comm" in pt and "comm" in pd:
        saved = pd["comm"] - pt["comm"]
        note += (
            f"; selection {pt['select']:.0f} ms against {saved:.0f} ms the "
            "smaller allreduce saves"
        )
    return note


def comm_bound_checks(rows: list[dict[str, Any]]) -> list[str]:
    """Top-k with error feedback faster to ``target`` than dense on each emulated
    link and on a real network (ranks on several nodes), for P1B2 (the claim)
    and the other models (reported the same way)."""
    out = []
    at = {(r["model"], r["link"], r["arm"]): r for r in rows}
    for (model, spec, arm), r in at.items():
        if arm != "topk_ef" or not (Link.parse(spec).emulated or _network(r)):
            continue
        d = at.get((model, spec, "dense"))
        if d is None:
            continue
        link = (
            spec if Link.parse(spec).emulated else f"real network, {r['nodes']} nodes"
        )
        ts, td, target = r["time_to_target_s"], d["time_to_target_s"], r["target"]
        steps = (
            f"steps {1e3 * (r['mean_step_s'] or 0):.0f} vs "
            f"{1e3 * (d['mean_step_s'] or 0):.0f} ms"
        )
        steps += _phases_note(r, d)
        if ts is None or td is None:
            why = "top-k" if ts is None else "dense"
            if ts is None and td is None:
                why = "neither"
            out.append(
                f"FAIL  {model}, {link}: top-k + EF faster to {target:g} than dense: "
                f"{why} reached it ({steps}; final acc {r['final_test_acc']:.4f} vs "
                f"{d['final_test_acc']:.4f})"
            )
            continue
        reached = ""
        at_s, at_d = _step_reached(r, target), _step_reached(d, target)
        if at_s is not None and at_d is not None:
            reached = f"; reached at step {at_s} vs {at_d}"
        out.append(
            f"{'PASS' if ts < td else 'FAIL'}  {model}, {link}: top-k + EF faster "
            f"to {target:g} than dense: {ts:.1f} s vs {td:.1f} s ({steps}{reached})"
        )
    return out
