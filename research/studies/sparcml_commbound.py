"""SparCML study, the communication-bound comparison (``--comm-bound``).

Dense (``host``), top-k with error feedback and top-k with 4-bit values on
models where communication can dominate, on each ``--cb-links`` link, for
each of ``--cb-seeds``: step time, time to the model's target accuracy, final
accuracy, bytes per step; the check (:mod:`research.studies.sparcml_page`)
compares time to target, paired by seed, on each emulated link and on the
real link where the ranks span several nodes (a network; on shared memory it
is not a claim of the paper). The reading
(where sparse training can win) is in ``research/studies/sparcml.py``'s
docstring, the figures in ``experiments/sparcml.py``'s.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from research.studies.sparcml_arms import arm_config, load_arm, run_arm
from research.train.config import DataConfig

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
    """Every model x link x seed x arm of the comparison; rows on rank 0.

    ``cfg``: ``experiments.sparcml.Config`` (its ``train`` is the base).
    """
    from research.train.report import link_label

    rows: list[dict[str, Any]] = []
    for model in cfg.cb_models:
        spec = COMM_BOUND[model]
        for link in cfg.cb_links:
            for seed in cfg.cb_seeds:
                rows += _one(cfg, root, world, model, spec, link, seed, link_label)
    return rows


def _one(cfg, root, world, model, spec, link, seed, link_label) -> list[dict]:
    """The arms of one model, link and seed."""
    rows = []
    base = dataclasses.replace(
        cfg.train,
        model=dataclasses.replace(cfg.train.model, name=model, options={}),
        data=DataConfig(
            name=spec["dataset"], options=dict(spec.get("data_options", {}))
        ),
        batch_size=spec["batch_size"],
        steps=cfg.cb_steps,
        eval_every=cfg.cb_eval_every,
        strategy=dataclasses.replace(cfg.train.strategy, link=link),
        seed=seed,
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
        run_arm(run, f"{model} {link} {arm} seed {seed}", world)
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
                    "seed": seed,
                    "target": target,
                }
            )
    return rows


def step_reached(row: dict[str, Any], target: float) -> int | None:
    """The first evaluated step at or above ``target`` (None: never)."""
    return next((s for s, acc in row.get("curve", []) if acc >= target), None)


def phases_note(topk: dict[str, Any], dense: dict[str, Any]) -> str:
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
