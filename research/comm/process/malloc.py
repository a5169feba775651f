"""Keep glibc's malloc from handing gradient-sized memory back on every step.

A training step allocates and frees the same large buffers every time: XLA's
results (a ResNet-50 gradient is 161 fresh leaves, 102 MB, per call), MPI's
temporaries, numpy's copies. glibc's defaults make that expensive here:

* memory freed at the top of the heap is returned to the kernel once more than
  ``M_TRIM_THRESHOLD`` lies free (128 KiB, raised dynamically to twice the
  largest freed mmapped chunk, so at most 64 MiB); the next step then touches it
  anew, one 4 KiB page fault at a time;
* allocations above ``M_MMAP_THRESHOLD`` (128 KiB at start, raised dynamically
  up to 32 MiB) are fresh ``mmap``s, unmapped on free, so faulted in every call.

Which of the two a buffer meets depends on what the process freed before, so
the same call costs a different amount in a different process. Measured with
``python -m scripts.bench_allreduce`` (2 ranks, ResNet-50, this 2-core machine):
the fused allreduce took 60 ms with 23,062 page faults per call when other
variants ran in between, and 33 ms with none once the heap was kept.

:func:`keep_heap` fixes both thresholds (``mallopt``): buffers below 32 MiB come
from the heap and freed memory stays in it up to ``trim_bytes``. A process keeps
its peak heap (at most ``trim_bytes`` more than it uses) until it exits, the
trade that jemalloc and tcmalloc make too. :func:`research.comm.world.get_world`
applies it in every rank; ``RESEARCH_MALLOC=default`` leaves glibc as it is, and
so does a ``GLIBC_TUNABLES`` that sets these thresholds already (the user's word
wins). Elsewhere than glibc it does nothing.

Memory above 32 MiB still comes from fresh ``mmap`` s (glibc allows no higher
threshold): VGG-16's 411 MB fc-layer gradient, its momentum and parameters, XLA's
temporaries. Transparent huge pages are in ``madvise`` mode on most Linux
machines and XLA does not ask for them, so those are faulted in 4 KiB at a time
on every step: the kernel gradient of that fc layer (batch 8) took 116 ms alone,
100,000 faults per call, and 48.5 ms with huge pages. :func:`launch_env` adds
``glibc.malloc.hugetlb=1`` (glibc >= 2.35: malloc asks for huge pages for its
mmaps and heap) to the ranks' environment; a tunable is read only when a process
starts, so our launchers set it (``research.entry.launch.relaunch``, the DeepFreeze
study's jobs, the benchmarks); under your own ``mpiexec`` or ``srun`` export
``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` (the batch templates do). Measured
with ``python -m scripts.bench_compute --no-torch``, alternating, two runs each:
VGG-16's step 575 and 579 ms with it, 632 and 636 without; ResNet-50 751 and 713
against 786 and 785.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Any

# mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

#: Allocations below this come from the heap (glibc's cap for its dynamic value).
MMAP_BYTES = 32 * 2**20
#: Free memory the heap may keep at its top before returning it to the kernel.
TRIM_BYTES = 1 << 30

_state: dict[str, str] = {}


def _opted_out(env: Any) -> bool:
    """``RESEARCH_MALLOC=default``: leave glibc's malloc as it is."""
    return env.get("RESEARCH_MALLOC", "").lower() == "default"


def keep_heap(mmap_bytes: int = MMAP_BYTES, trim_bytes: int = TRIM_BYTES) -> str:
    """Fix malloc's thresholds for this process, once; returns what was done.

    Returns:
      ``"kept"`` (thresholds set), or why not: ``"default (RESEARCH_MALLOC)"``,
      ``"default (GLIBC_TUNABLES)"``, ``"default (not glibc)"``.
    """
    if "state" in _state:
        return _state["state"]
    if _opted_out(os.environ):
        state = "default (RESEARCH_MALLOC)"
    elif any(
        k in os.environ.get("GLIBC_TUNABLES", "")
        for k in ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold")
    ):
        state = "default (GLIBC_TUNABLES)"
    else:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            mallopt = libc.mallopt
        except (OSError, AttributeError):
            state = "default (not glibc)"
        else:
            mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
            ok = mallopt(M_MMAP_THRESHOLD, int(mmap_bytes)) and mallopt(
                M_TRIM_THRESHOLD, int(trim_bytes)
            )
            state = "kept" if ok else "default (mallopt refused)"
    _state["state"] = state
    return state


#: The tunable :func:`launch_env` adds.
HUGETLB = "glibc.malloc.hugetlb=1"


def launch_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` for ranks we start: ``GLIBC_TUNABLES`` gains :data:`HUGETLB`.

    Unchanged when ``RESEARCH_MALLOC=default`` or when ``GLIBC_TUNABLES``
    already says something about ``glibc.malloc.hugetlb``. Returns a new dict.
    """
    out = dict(env)
    tunables = out.get("GLIBC_TUNABLES", "")
    if _opted_out(out):
        return out
    if "glibc.malloc.hugetlb" in tunables:
        return out
    out["GLIBC_TUNABLES"] = f"{tunables}:{HUGETLB}" if tunables else HUGETLB
    return out


def state() -> str:
    """What :func:`keep_heap` did in this process ("not applied" before it ran)."""
    return _state.get("state", "not applied")
