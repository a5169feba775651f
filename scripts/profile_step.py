"""Per-op profile of one jitted training step on XLA:CPU.

Runs ``scripts.bench_compute``'s training step of a model under
``jax.profiler`` (two steps after two warm-up steps) with XLA's optimized HLO
dumped beside it, matches every thunk of the trace to its HLO instruction and
prints the time per step by kind of op (a fusion is named by the ops inside it,
e.g. ``transpose_copy_fusion[copy,transpose]``), then the costliest ops, then
every convolution and dot with its GFLOP/s. Times are summed over the threads
that ran thunks, so they add up to more than the step's wall time, and a
library call running on other threads counts only on its caller.

This is how ``models/conv.py`` found where ResNet-50's step goes (its
docstring has the figures). Example::

    python -m scripts.profile_step --model resnet50 --mode xla
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import math
import os
import re
import tempfile
import time


def _computations(text: str) -> dict[str, list[str]]:
    """HLO computation name -> its instruction lines."""
    comps: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
        if head and not line.startswith(" "):
            current = head.group(1)
            comps[current] = []
        elif current and line.startswith("  "):
            comps[current].append(line)
    return comps


def _instructions(comps: dict[str, list[str]]) -> dict[str, str]:
    found: dict[str, str] = {}
    for lines in comps.values():
        for line in lines:
            m = re.match(r"\s+(?:ROOT )?%([\w.\-]+) = ", line)
            if m:
                found.setdefault(m.group(1), line)
    return found


def _body(line: str, comps: dict[str, list[str]]) -> list[str]:
    called = re.search(r"calls=%([\w.\-]+)", line)
    return comps.get(called.group(1), []) if called else [line]


def _kind(name: str, instr: dict[str, str], comps: dict[str, list[str]]) -> str:
    line = instr.get(name)
    if line is None:
        return "runtime:" + re.sub(r"\.\d+$", "", name)
    op = re.match(r"\s+(?:ROOT )?%[\w.\-]+ = \S+(?: \S+)? ([\w\-]+)\(", line)
    if op is None or op.group(1) != "fusion":
        return op.group(1) if op else "?"
    ops = set()
    for b in _body(line, comps):
        ops.update(re.findall(r"= \S+ (convolution|dot|transpose|reduce|copy)\(", b))
    base = re.sub(r"[.]\d+$", "", name)
    return f"{base}[{','.join(sorted(ops))}]"


def _dims(text: str) -> list[int]:
    return [int(d) for d in text.split(",") if d]


def _contraction(line: str, comps: dict[str, list[str]]) -> tuple[str, float] | None:
    """A fusion's (or op's) convolution or dot: a label and its FLOPs."""
    body = _body(line, comps)
    shapes = {}
    for b in body:
        m = re.match(r"\s+(?:ROOT )?%([\w.\-]+) = f32\[([\d,]*)\]", b)
        if m:
            shapes[m.group(1)] = _dims(m.group(2))
    for b in body:
        for op in ("convolution", "dot"):
            m = re.search(rf"= f32\[([\d,]*)\]\S* {op}\(([^)]*)\)", b)
            if not m:
                continue
            out = _dims(m.group(1))
            lhs, rhs = (shapes.get(n) for n in re.findall(r"%([\w.\-]+)", m.group(2)))
            if lhs is None or rhs is None:
                return None
            if op == "convolution":
                labels = re.search(r"dim_labels=\w+_(\w+)->", b).group(1)
                per_out = math.prod(rhs) / rhs[labels.index("o")]
            else:
                dims = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", b)
                per_out = math.prod(lhs[d] for d in _dims(dims.group(1)))
            return f"{op} {lhs} x {rhs} -> {out}", 2 * math.prod(out) * per_out
    return None


def report(trace_dir: str, dump_dir: str, steps: int, top: int) -> None:
    """Prints the per-kind, per-op and per-contraction tables of one trace."""
    (path,) = glob.glob(f"{trace_dir}/plugins/profile/*/perfetto_trace.json.gz")
    with gzip.open(path) as f:
        events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    traced = {e.get("name") for e in events if e.get("ph") == "X"}
    best = (-1, {}, {})
    # The module whose instructions name the most traced thunks: the step.
    for hlo_file in glob.glob(f"{dump_dir}/*cpu_after_optimizations.txt"):
        with open(hlo_file) as f:
            comps = _computations(f.read())
        instr = _instructions(comps)
        best = max(best, (len(traced & instr.keys()), comps, instr), key=lambda b: b[0])
    _, comps, instr = best
    per_op: collections.Counter = collections.Counter()
    for e in events:
        name = e.get("name", "")
        skip = ("Thunk", "Slinky", "$", "end: ")
        if e.get("ph") == "X" and not any(s in name for s in skip):
            per_op[name] += e["dur"] / 1e3 / steps
    kinds: collections.Counter = collections.Counter()
    counts: collections.Counter = collections.Counter()
    for name, ms in per_op.items():
        kinds[_kind(name, instr, comps)] += ms
        counts[_kind(name, instr, comps)] += 1
    print(f"\nthunk time per step: {sum(per_op.values()):.0f} ms (summed over threads)")
    for kind, ms in kinds.most_common(top):
        print(f"{ms:9.1f} ms {counts[kind]:5d}x  {kind}")
    print("\ncostliest ops")
    for name, ms in per_op.most_common(top):
        print(f"{ms:9.1f} ms  {name:<32} {_kind(name, instr, comps)}")
    rows: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for name, ms in per_op.items():
        found = name in instr and _contraction(instr[name], comps)
        if found:
            row = rows[found[0]]
            row[0] += 1
            row[1] += ms
            row[2] += found[1]
    print("\nconvolutions and dots (XLA's operand order), by time")
    for label, (n, ms, flops) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:top]:
        rate = flops / ms / 1e6 if ms else 0.0
        print(
            f"{ms:9.1f} ms {int(n):3d}x {flops / 1e9:6.2f} GFLOP {rate:5.0f}/s  {label}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--mode", default="matmul", help="models.conv mode")
    parser.add_argument("--top", type=int, default=25, help="rows per table")
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="profile_step_")
    dump = os.path.join(work, "hlo")
    # Before the backend starts: XLA reads its flags once.
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_dump_to={dump} --xla_dump_hlo_as_text"
    import jax

    from scripts import bench_compute

    if args.model not in bench_compute.SIZES:
        parser.error(f"model must be one of {sorted(bench_compute.SIZES)}")
    step, flops = bench_compute.make_jax_step(args.model, args.mode)
    for _ in range(2):
        jax.block_until_ready(step())
    start = time.perf_counter()
    jax.block_until_ready(step())
    ms = (time.perf_counter() - start) * 1e3
    print(f"{args.model} ({args.mode}): one step {ms:.0f} ms, {flops / 1e9:.1f} GFLOP")
    print(f"load average {os.getloadavg()}, files in {work}")
    trace = os.path.join(work, "trace")
    jax.profiler.start_trace(trace, create_perfetto_trace=True)
    for _ in range(2):
        jax.block_until_ready(step())
    jax.profiler.stop_trace()
    report(trace, dump, 2, args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
