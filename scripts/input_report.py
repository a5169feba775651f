"""The figures of ``python -m scripts.bench_input`` as text and as Markdown.

``report`` is what the benchmark prints; ``markdown`` is its section of the GPU
check's table (``scripts.gpu_report``). Both read the dict the benchmark
writes with ``--json``.
"""

from __future__ import annotations

from typing import Any


def report(res: dict[str, Any]) -> str:
    """The figures as the text ``python -m scripts.bench_input`` prints."""
    lines = [
        f"files: {res['files']['files']} of {res['files']['path']} "
        f"({res['files']['mean_kb']} KB, {res['files']['mean_pixels']} pixels "
        f"on average); output {res['size']} px; {res['machine']}",
        "",
        "per core (one thread; median of the rounds)       images/s   x ours",
    ]
    ours = res["per_core"]["ours"]["images_per_s"]  # fmt: skip
    for name, row in res["per_core"].items():
        if "skipped" in row:
            lines.append(f"  {name:<46} skipped: {row['skipped']}")
        else:
            r = row["images_per_s"]
            lines.append(f"  {name:<46} {r:8.0f}   {r / ours:6.2f}")
    lines += ["", f"loaders (batches of {res['batch']})"]
    for w, row in res["loaders"].items():
        cells = [f"ours {row['ours']:.0f}"]
        if "torchvision" in row:
            cells.append(f"torchvision {row['torchvision']:.0f} images/s "
                         f"(ours {row['ours'] / row['torchvision']:.2f}x)")  # fmt: skip
        lines.append(f"  {w} worker(s): " + ", ".join(cells))
    t = res.get("training")
    if t:
        lines += ["", f"training {t['model']}, batch {t['batch']}, {t['steps']} steps, "
                  f"{t['data_workers']} decoding thread(s):",
                  f"  median step: imagenet {t['imagenet_median_step_s']:.3f} s, "
                  f"synthetic {t['synthetic_median_step_s']:.3f} s "
                  f"({t['step_ratio']:.2f}x)",
                  f"  median input wait (imagenet): "
                  f"{t['imagenet_median_data_wait_s'] * 1e3:.1f} ms, "
                  f"{t['wait_fraction']:.1%} of the step"]  # fmt: skip
    return "\n".join(lines)


def markdown(res: dict[str, Any]) -> list[str]:
    """The figures as Markdown tables (``scripts.gpu_report``'s input section)."""
    f = res["files"]
    out = [
        f"{f['files']} files ({f['mean_kb']} KB, {f['mean_pixels']} pixels on "
        f"average) to {res['size']} px; {res['machine']}; "
        "`python -m scripts.bench_input`.",
        "",
        "| per core (one thread) | images/s | x ours |",
        "|---|---|---|",
    ]
    ours = res["per_core"]["ours"]["images_per_s"]  # fmt: skip
    for name, row in res["per_core"].items():
        if "images_per_s" in row:
            r = row["images_per_s"]
            out.append(f"| {name} | {r:.0f} | {r / ours:.2f} |")
    out += ["", "| workers | ours images/s | torchvision images/s |", "|---|---|---|"]
    for w, row in res["loaders"].items():
        tv = row.get("torchvision")
        tv_cell = "-" if tv is None else f"{tv:.0f}"
        out.append(f"| {w} | {row['ours']:.0f} | {tv_cell} |")
    t = res.get("training")
    if t:
        out += ["", f"{t['model']}, batch {t['batch']}, {t['data_workers']} "
                f"decoding threads: median step {t['imagenet_median_step_s']:.3f} s "
                f"reading the files, {t['synthetic_median_step_s']:.3f} s on synthetic "
                f"data ({t['step_ratio']:.2f}x); input wait "
                f"{t['wait_fraction']:.1%} of the step."]  # fmt: skip
    return out
