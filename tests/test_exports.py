"""Every package's exports resolve and ``from X import *`` works for each.

A package that exports lazily (``research.checkpoint``: a module
``__getattr__`` and ``__all__``) can name something that is not there; this
imports every package of the project in a fresh process and resolves every
name of its ``__all__``.
"""

from __future__ import annotations

import json

from tests.harness import ROOT, python, run_env

SCRIPT = r"""
import importlib, json, sys
out = {}
for name in sys.argv[1:]:
    problems = []
    try:
        mod = importlib.import_module(name)
        for attr in getattr(mod, "__all__", []):
            try:
                getattr(mod, attr)
            except Exception as e:
                problems.append(f"{attr}: {type(e).__name__}: {e}")
        ns = {}
        exec(f"from {name} import *", ns)
        missing = set(getattr(mod, "__all__", [])) - set(ns)
        problems += [f"{m}: not imported by *" for m in sorted(missing)]
    except Exception as e:
        problems.append(f"import: {type(e).__name__}: {e}")
    out[name] = problems
print("EXPORTS " + json.dumps(out))
"""


def packages() -> list[str]:
    out = []
    for top in ("research", "models", "experiments", "scripts"):
        for init in sorted((ROOT / top).rglob("__init__.py")):
            out.append(".".join(init.parent.relative_to(ROOT).parts))
    return out


def test_every_package_exports_what_it_names():
    names = packages()
    assert "research.checkpoint" in names and "research.comm.sparse" in names
    proc = python(["-c", SCRIPT, *names], env=run_env(RESEARCH_ABORT_ON_ERROR="0"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("EXPORTS "))
    problems = {k: v for k, v in json.loads(line[8:]).items() if v}
    assert not problems, problems
