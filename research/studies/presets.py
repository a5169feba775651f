"""What the experiment entry points share: parser frame, presets, run folder.

``--model`` names a preset (model options and the synthetic task that fits the
model) and ``--paper-scale`` swaps in the paper's defaults; both are applied
after parsing so that flags given explicitly still win.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from research.cli import ArgumentParser, add_train_flags
from research.train.config import TrainConfig


def experiment_parser(
    prog: str, doc: str, defaults: TrainConfig, np_: int = 4
) -> argparse.ArgumentParser:
    """The parser of a study: first paragraph of ``doc`` as description, the
    rest as epilog, the training flags with ``defaults``, ``np_`` ranks."""
    p = ArgumentParser(
        prog=prog,
        description=doc.split("\n\n")[0],
        epilog=doc.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_train_flags(p, defaults)
    p.set_defaults(np_=np_)  # launched by the module itself
    return p


def parse_with_presets(
    p: argparse.ArgumentParser,
    argv: list[str],
    presets: Mapping[str, Mapping[str, Any]],
    paper_scale: Mapping[str, Any],
    *,
    presets_at_paper_scale: bool = True,
) -> argparse.Namespace:
    """Parse ``argv``, then apply ``--paper-scale`` and the ``--model`` preset.

    With ``--paper-scale`` its values become the parser's defaults, so explicit
    flags still override them. ``presets_at_paper_scale=False`` leaves the model
    preset out at paper scale (the preset then is a laptop-sized variant).
    """
    args = p.parse_args(argv)
    if args.paper_scale:
        p.set_defaults(**paper_scale)  # explicit flags still override
        args = p.parse_args(argv)
    use = presets_at_paper_scale or not args.paper_scale
    apply_model_preset(args, presets.get(args.model, {}) if use else {})
    return args


def apply_model_preset(args: argparse.Namespace, preset: Mapping[str, Any]) -> None:
    """Put ``preset``'s model, dataset and options into ``args`` (in place)."""
    args.model = preset.get("model", args.model)
    if "dataset" in preset and args.dataset == "synthetic_images":
        args.dataset = preset["dataset"]
    # Preset options first, so --model-opt/--data-opt given by the user win.
    args.model_options = [
        f"{k}={v!r}" for k, v in preset.get("model_options", {}).items()
    ] + list(args.model_options or [])
    args.data_options = [
        f"{k}={v!r}" for k, v in preset.get("data_options", {}).items()
    ] + list(args.data_options or [])


def run_root(run_dir: str | None, world, experiment: str) -> Path:
    """``run_dir``, else rank 0's ``runs/<experiment>-<time>`` on every rank."""
    if run_dir:
        return Path(run_dir).absolute()
    from research.rundir import default_run_dir

    return Path(world.bcast(default_run_dir(experiment) if world.rank == 0 else None))


def start_job(args: argparse.Namespace, experiment: str, *, compile_cache: bool = True):
    """An experiment's start inside its MPI job: ``(world, run root)``.

    Threads per rank first (XLA reads them when it starts), the compile cache,
    MPI, then the abort hook at once, so a failure anywhere after ends the job.
    Rank 0 appends the job's provenance to ``root/run.json``
    (:mod:`research.provenance`).
    """
    from research.comm.world import get_world, install_abort_on_error
    from research.launch import set_threads

    set_threads(args.threads)
    if compile_cache:
        enable_compile_cache()
    world = get_world()
    install_abort_on_error()
    root = run_root(args.run_dir, world, experiment)
    if world.rank == 0:
        from research.provenance import record_job

        record_job(root, experiment, world.size)  # what docs/results cites
    return world, root


def enable_compile_cache() -> None:
    """Share compiled programs between ranks and arms through a disk cache.

    Every arm builds the same model, so without it each arm recompiles (5-15 s
    per arm on the loaded 2-core machine). ``JAX_COMPILATION_CACHE_DIR`` wins.
    """
    import jax

    default = os.path.join(os.path.expanduser("~"), ".cache", "research-jax")
    jax.config.update(
        "jax_compilation_cache_dir",
        os.environ.get("JAX_COMPILATION_CACHE_DIR", default),
    )
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
