"""scripts.bench_allreduce runs under a real mpiexec and prints its targets.

Timings are not judged here (a shared machine); the benchmark itself prints them.
"""

from __future__ import annotations

import json

import pytest

from tests.harness import python, run_env


def test_malloc_default_reaches_the_ranks(monkeypatch):
    """``--malloc default`` puts RESEARCH_MALLOC=default into the jobs'
    environment, which the ranks report as ``default (RESEARCH_MALLOC)``
    (tests/test_malloc.py); the launch that carries it is the quick run's."""
    from scripts.bench_allreduce import job_env, parse_args

    monkeypatch.delenv("RESEARCH_MALLOC", raising=False)
    assert job_env(parse_args(["--malloc", "default"]))["RESEARCH_MALLOC"] == "default"
    assert "RESEARCH_MALLOC" not in job_env(parse_args([]))


def test_the_gradient_is_resnet50s_unless_asked(capsys):
    """The default tree is ResNet-50's (built from models/, or the built-in
    list without Flax: the same 161 shapes); ``--model`` takes any model, and
    ``--synthetic`` goes with ResNet-50 only."""
    import jax
    import numpy as np

    from scripts.bench_allreduce import parse_args
    from scripts.mpibench import gradient_shapes

    def shapes(tree):
        return sorted(x.shape for x in jax.tree.leaves(tree))

    built, source = gradient_shapes(False)
    listed, listed_source = gradient_shapes(True)
    assert source == "models.get_model('resnet50')"
    assert listed_source == "built-in ResNet-50 shapes"
    assert shapes(built) == shapes(listed) and len(shapes(listed)) == 161
    assert sum(int(np.prod(s)) for s in shapes(listed)) == 25_557_032
    tiny, _ = gradient_shapes(False, "resnet_tiny")
    assert sum(x.size for x in jax.tree.leaves(tiny)) == _tiny_params()
    assert parse_args([]).model == "resnet50"
    for bad in (["--model", "nope"], ["--synthetic", "--model", "vgg16"]):
        with pytest.raises(SystemExit) as e:
            parse_args(bad)
        assert e.value.code == 2
    assert "--synthetic is ResNet-50's built-in shapes" in capsys.readouterr().err


def _tiny_params() -> int:
    """ResNet-tiny's parameter count: the quick run's gradient."""
    import models

    return models.count_params(models.get_model("resnet_tiny"))


#: One benchmark run (the default ``--malloc kept``), not one per malloc: the
#: two runs took 12-16 CPU-s each beside the suite, and differed only in the
#: variable test_malloc_default_reaches_the_ranks checks. Of ResNet-tiny's
#: gradient, not ResNet-50's: compiling the averages of 161 leaves was 26 of
#: the run's 40 CPU-s from an empty compile cache (the tree itself is checked
#: above).
@pytest.mark.launches  # an MPI job: not in make test-fast
def test_one_quick_run(tmp_path):
    out = tmp_path / "bench.json"
    env = {k: v for k, v in run_env().items() if k != "GLIBC_TUNABLES"}
    args = ["-m", "scripts.bench_allreduce", "--ranks", "2", "--reps", "1"]
    args += ["--warmup", "1", "--model", "resnet_tiny", "--json", str(out)]
    proc = python(args, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = json.loads(out.read_text())["runs"]
    assert run["ranks"] == 2 and run["params"] == _tiny_params()
    assert run["tree"] == "models.get_model('resnet_tiny')"
    assert run["malloc"] == "kept"
    names = set(run["variants"])
    assert {"mpi4py-flat", "fused", "host", "fused-mpi4jax"} <= names
    assert {"fused-ring", "host-ring", "host-mpi", "fused-again", "host-again"} <= names
    for name in ("fused", "host"):  # allreduce=auto measured and chose
        m = run["auto"][name]["measured"]
        assert m["ring_s"] > 0 and m["mpi_s"] > 0
        assert run["auto"][name]["ring"] == (m["ring_s"] <= m["mpi_s"])
        assert "hierarchical_s" not in m  # one node: no candidate of its own
        assert f"auto: {name} chose " in proc.stdout
    assert all(v["median_s"] > 0 for v in run["variants"].values())
    assert run["variants"]["mpi4py-flat"]["ratio"] == 1.0
    for name in ("fused", "host"):
        assert f"target: {name} " in proc.stdout
