#!/usr/bin/env bash
# Creates a venv (default .venv at the repository root; VENV=DIR for another) when
# missing and installs the project into it. Idempotent: `make` calls it only when
# pyproject.toml or this script changed.
#
#   bash scripts/install.sh             laptop/CI: MPICH from the `mpich` wheel
#   bash scripts/install.sh --site-mpi  cluster: mpi4py, mpi4jax and the native
#                                       ring built with MPICC, else the first
#                                       mpicc on PATH (it says which)
#   --cuda, --cpu                       JAX's CUDA or CPU build; by default the CUDA
#                                       build where `nvidia-smi -L` lists a GPU
#   --dry-run (or INSTALL_DRY_RUN=1)    print the plan and change nothing
#
# The CUDA build: where the base Python (PYTHON, default python3) already has a
# JAX with a CUDA plugin in range (a GPU image's), the venv uses it as it is
# (--system-site-packages); else jax[cuda13] or jax[cuda12] by the driver's CUDA
# version (JAX_CUDA=12 or 13 to choose). mpi4jax is built with CUDA (CUDA_PATH: the
# toolkit next to nvcc, else /usr/local/cuda) and MPI4JAX_BUILD_MPICC set to the
# mpicc of the MPI that mpi4py loads, checked before the build.
# Offline (PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR, e.g. scripts/gpu_wheels.sh's .whl/)
# no step needs the network; tools of the dev extra found in neither the folder
# nor the base Python are left out, and named.
set -euo pipefail
cd "$(dirname "$0")/.."

# The ranges pyproject.toml pins (tests/test_install_pins.py checks that they agree).
JAX_RANGE=">=0.10,<0.12"
NUMPY_RANGE=">=2.0,<3"
MPI4PY_RANGE=">=4.1,<5"
MPICH_RANGE=">=5.0,<6"
MPI4JAX_RANGE=">=0.9.1,<0.10"
JAX_MIN="${JAX_RANGE#>=}"; JAX_MIN="${JAX_MIN%%,*}"; JAX_BELOW="${JAX_RANGE##*<}"

USAGE="usage: bash scripts/install.sh [--site-mpi] [--cuda | --cpu] [--dry-run]"
say() { echo "[install] $*"; }
die() { echo "[install] $*" >&2; exit 2; }

SITE_MPI=0
BUILD=auto
case "${INSTALL_DRY_RUN:-0}" in ""|0|false|no) DRY_RUN=0 ;; *) DRY_RUN=1 ;; esac
for arg in "$@"; do
  case "$arg" in
    --site-mpi) SITE_MPI=1 ;;
    --cuda|--cpu)
      if [ "$BUILD" != auto ] && [ "$BUILD" != "${arg#--}" ]; then
        die "--cuda and --cpu exclude each other ($USAGE)"
      fi
      BUILD="${arg#--}" ;;
    --dry-run) DRY_RUN=1 ;;
    -h|--help) echo "$USAGE"; exit 0 ;;
    *) echo "$USAGE" >&2; exit 2 ;;
  esac
done
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
case "$VENV" in /*) VENV_ABS="$VENV" ;; *) VENV_ABS="$PWD/$VENV" ;; esac
case "${PIP_NO_INDEX:-}" in ""|0|false|no|off) OFFLINE=0 ;; *) OFFLINE=1 ;; esac
command -v "$PYTHON" >/dev/null 2>&1 || die "PYTHON=$PYTHON: not found; set PYTHON=/path/to/python3 (3.11 or newer)"

# The MPI library a program built with the wrapper $1 loads: the first line of
# MPI_Get_library_version, which needs no MPI_Init. Fails, with the compiler's
# output on stderr, where $1 cannot build an MPI program.
mpi_library_of() {
  local dir rc=0
  dir="$(mktemp -d)"
  printf '#include <mpi.h>\n#include <stdio.h>\nint main(void) { char v[MPI_MAX_LIBRARY_VERSION_STRING]; int n; MPI_Get_library_version(v, &n); printf("%%s\\n", v); return 0; }\n' > "$dir/probe.c"
  if "$1" "$dir/probe.c" -o "$dir/probe" >"$dir/log" 2>&1; then
    "$dir/probe" | head -1 | sed 's/[[:space:]]*$//'
  else
    cat "$dir/log" >&2
    rc=1
  fi
  rm -rf "$dir"
  return "$rc"
}

if [ "$SITE_MPI" = 1 ]; then
  # One MPI for everything: the MPICC given, else the first mpicc on PATH, as an
  # absolute path; mpi4py, mpi4jax and the native ring are all built with it.
  if [ -n "${MPICC:-}" ]; then
    FROM="MPICC"
    MPICC_PATH="$(command -v "$MPICC" || true)"
  else
    FROM="the first mpicc on PATH; set MPICC=/path/to/mpicc for another"
    MPICC_PATH="$(command -v mpicc || true)"
  fi
  if [ -z "$MPICC_PATH" ]; then
    echo "[install] --site-mpi: ${MPICC:-no mpicc on PATH}: not found; load the site's MPI first (e.g. module load openmpi) or set MPICC" >&2
    exit 2
  fi
  MPICC="$MPICC_PATH"
  ON_PATH="$(command -v mpicc || true)"
  if [ "$FROM" = "MPICC" ] && [ -n "$ON_PATH" ] \
    && [ "$(readlink -f "$ON_PATH")" != "$(readlink -f "$MPICC")" ]; then
    FROM="MPICC; not $ON_PATH, the first mpicc on PATH"
  fi
  # Its C++ wrapper: the same name with mpicxx (mpicc.openmpi: mpicxx.openmpi).
  MPICXX="$(dirname "$MPICC")/$(basename "$MPICC" | sed 's/mpicc/mpicxx/')"
  [ -x "$MPICXX" ] || MPICXX="$(dirname "$MPICC")/mpicxx"
  SITE_LIBRARY="$(mpi_library_of "$MPICC")" \
    || die "--site-mpi: $MPICC cannot build an MPI program (its output is above)"
  echo "[install] --site-mpi: building mpi4py, mpi4jax and the native ring with $MPICC ($FROM; C++: $MPICXX): $SITE_LIBRARY"
  # The wheel's mpi.h (VENV/include) and mpicxx (VENV/bin) come first at build
  # time and would shadow the site MPI's: mpi4py then links the site's libmpi
  # against MPICH's declarations, and the native ring against the wrong MPI.
  if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -m pip show -q mpich >/dev/null 2>&1; then
    echo "[install] --site-mpi: $VENV holds the mpich wheel, whose headers would shadow the site MPI's; use a fresh VENV=DIR or \`$VENV/bin/python -m pip uninstall mpich mpi4py mpi4jax\` first" >&2
    exit 2
  fi
  MPI4JAX_CC="$MPICC"
else
  MPI4JAX_CC="$VENV_ABS/bin/mpicc"
fi

# --- JAX: the CPU or the CUDA build, and why -------------------------------------
GPU=""
DRIVER_CUDA=""
if command -v nvidia-smi >/dev/null 2>&1; then
  GPU="$(nvidia-smi -L 2>/dev/null | grep -m1 '^GPU ' | sed 's/ (UUID:.*//' || true)"
  DRIVER_CUDA="$(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: *[0-9][0-9.]*' | head -1 | grep -o '[0-9][0-9.]*$' || true)"
  SEEN="${GPU:-nvidia-smi -L lists no GPU}"
else
  SEEN="no nvidia-smi on PATH"
fi
case "$BUILD" in
  cuda) WHY="--cuda" ;;
  cpu) WHY="--cpu${GPU:+, although nvidia-smi -L lists $GPU}" ;;
  auto)
    if [ -n "$GPU" ]; then BUILD=cuda; WHY="nvidia-smi -L lists $GPU; --cpu for the CPU build"
    else BUILD=cpu; WHY="no NVIDIA GPU: $SEEN; --cuda for the CUDA build"; fi ;;
esac
if [ "$BUILD" = cuda ]; then
  say "JAX: the CUDA build ($WHY; the driver's CUDA: ${DRIVER_CUDA:-unknown})"
else
  say "JAX: the CPU build ($WHY)"
fi
DRIVER_MAJOR="${DRIVER_CUDA%%.*}"

# What the base Python has: its version, whether it is itself a venv (whose
# packages a --system-site-packages venv made from it would not see), the folders
# its packages come from, and whether its JAX is a CUDA build this install can use.
JAX_FROM=cpu
BASE_SITES=""
BASE_IS_VENV=0
BASE_PYVER=""
BASE_JAX=""
BASE_WHY=""
CUDA_MAJOR=""
CUDA_WHY=""
if [ "$BUILD" = cuda ]; then
  JAX_FROM=pip
  BASE_INFO="$("$PYTHON" - "$JAX_MIN" "$JAX_BELOW" "$DRIVER_CUDA" <<'EOF'
import importlib.metadata as md
import os
import re
import sys

lo, below, driver = sys.argv[1], sys.argv[2], sys.argv[3]


def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return ""


def release(v):
    return tuple(int(x) for x in re.match(r"\d+(?:\.\d+)*", v).group(0).split("."))


print(f"pyver={sys.version_info[0]}.{sys.version_info[1]}")
print(f"venv={int(sys.prefix != sys.base_prefix)}")
sites = [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")]
print("sites=" + os.pathsep.join(p for p in sites if os.path.isdir(p)))
jax, jaxlib = version("jax"), version("jaxlib")
plugins = [(f"jax-cuda{m}-plugin", m) for m in (13, 12) if version(f"jax-cuda{m}-plugin")]
fits = [(n, m) for n, m in plugins if not driver or m <= int(driver.split(".")[0])]
if not jax:
    why = "it has no jax"
elif not plugins:
    why = f"its jax {jax} has no CUDA plugin (jax-cuda13-plugin or jax-cuda12-plugin)"
elif not release(lo) <= release(jax) < release(below):
    why = f"its jax {jax} is outside the range >={lo},<{below}"
elif not fits:
    why = f"its {plugins[0][0]} needs a newer driver than this one (CUDA {driver})"
elif version(fits[0][0]) != jaxlib:
    why = f"its {fits[0][0]} {version(fits[0][0])} is not its jaxlib's version ({jaxlib})"
else:
    print(f"use=jax {jax}, jaxlib {jaxlib}, {fits[0][0]} {jaxlib}")
    why = ""
print(f"why={why}")
EOF
)" || die "$PYTHON could not be run to look for a JAX with CUDA; set PYTHON=/path/to/python3"
  while IFS='=' read -r key value; do
    case "$key" in
      pyver) BASE_PYVER="$value" ;;
      venv) BASE_IS_VENV="$value" ;;
      sites) BASE_SITES="$value" ;;
      use) BASE_JAX="$value"; JAX_FROM=base ;;
      why) BASE_WHY="$value" ;;
    esac
  done <<< "$BASE_INFO"
  if [ "$JAX_FROM" = pip ]; then
    CUDA_MAJOR="${JAX_CUDA:-}"
    if [ -n "$CUDA_MAJOR" ]; then CUDA_WHY="JAX_CUDA=$CUDA_MAJOR"
    elif [ -z "$DRIVER_MAJOR" ]; then
      CUDA_MAJOR=12; CUDA_WHY="the driver's CUDA is unknown: cuda12 runs on drivers from 525 on; JAX_CUDA=13 for CUDA 13"
    elif [ "$DRIVER_MAJOR" -ge 13 ]; then CUDA_MAJOR=13; CUDA_WHY="the driver runs CUDA $DRIVER_CUDA"
    elif [ "$DRIVER_MAJOR" -eq 12 ]; then CUDA_MAJOR=12; CUDA_WHY="the driver runs CUDA $DRIVER_CUDA"
    else die "the driver runs CUDA $DRIVER_CUDA; JAX's CUDA builds need 12 or newer: update the NVIDIA driver, or --cpu"
    fi
    case "$CUDA_MAJOR" in 12|13) ;; *) die "JAX_CUDA=$CUDA_MAJOR: JAX's CUDA builds are 12 and 13" ;; esac
  fi
fi

# --- CUDA_PATH: the toolkit mpi4jax's CUDA bridge is compiled against ---------------
# Where an nvcc is on PATH mpi4jax's build makes a CUDA bridge and fails unless
# CUDA_PATH names a real toolkit: the one next to nvcc, else /usr/local/cuda. The
# CUDA build needs one (jax[cuda12] brings its own: the nvidia-cuda-nvcc-cu12
# wheel, which mpi4jax's build prefers).
CUDA_TOOLKIT=""
if [ -n "${CUDA_PATH:-}" ]; then
  [ -f "$CUDA_PATH/include/cuda_runtime.h" ] \
    || die "CUDA_PATH=$CUDA_PATH holds no include/cuda_runtime.h: point it at a CUDA toolkit, or unset it"
  CUDA_TOOLKIT="$CUDA_PATH"
elif command -v nvcc >/dev/null 2>&1 || [ "$BUILD" = cuda ]; then
  cands=(/usr/local/cuda)
  if command -v nvcc >/dev/null 2>&1; then
    cands=("$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")" /usr/local/cuda)
  fi
  for cand in "${cands[@]}"; do
    if [ -f "$cand/include/cuda_runtime.h" ]; then CUDA_TOOLKIT="$cand"; break; fi
  done
fi
TOOLKIT_CUDA=""
if [ -n "$CUDA_TOOLKIT" ]; then
  v="$(sed -n 's/^#define CUDART_VERSION *\([0-9]*\).*/\1/p' "$CUDA_TOOLKIT/include/cuda_runtime_api.h" 2>/dev/null | head -1)"
  [ -n "$v" ] && TOOLKIT_CUDA="$((v / 1000)).$((v % 1000 / 10))"
fi
if [ "$JAX_FROM" = pip ] && [ "$CUDA_MAJOR" = 12 ]; then
  # mpi4jax's build takes the toolkit of the nvidia-cuda-nvcc-cu12 and
  # nvidia-cuda-runtime-cu12 wheels (nvidia/cuda_nvcc, nvidia/cuda_runtime beside
  # mpi4py) over CUDA_PATH: JAX's own CUDA. (CUDA 13's wheels lay out nvidia/cu13,
  # which it does not look for: there CUDA_PATH counts.)
  CUDA_TOOLKIT=""
  TOOLKIT_CUDA=""
elif [ "$BUILD" = cuda ]; then
  if [ -z "$CUDA_TOOLKIT" ]; then
    die "the CUDA build needs a CUDA toolkit for mpi4jax's CUDA bridge, and none was found (nvcc on PATH, /usr/local/cuda): install one, or set CUDA_PATH"
  fi
  if [ -n "$TOOLKIT_CUDA" ] && [ -n "$DRIVER_MAJOR" ] && [ "${TOOLKIT_CUDA%%.*}" -gt "$DRIVER_MAJOR" ]; then
    die "the CUDA toolkit at $CUDA_TOOLKIT is CUDA $TOOLKIT_CUDA, newer than the driver's CUDA $DRIVER_CUDA: mpi4jax's CUDA bridge would not load; set CUDA_PATH to a toolkit of CUDA ${DRIVER_MAJOR}.x or older, or update the driver"
  fi
fi

# --- An existing venv must fit the plan ----------------------------------------------
# jax_at: "venv" or "base" (where its jax comes from) or "none"; plugin: the CUDA
# plugin it sees and where from, if any; mpi4py_at, mpi4jax_at alike.
venv_info() {
  "$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
import os
import sys

prefix = os.path.realpath(sys.prefix)


def where(name):
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        return "none"
    at = os.path.realpath(str(dist.locate_file("")))
    return "venv" if at.startswith(prefix + os.sep) else "base"


print("jax_at=" + where("jax"))
for name in ("jax-cuda13-plugin", "jax-cuda12-plugin"):
    if where(name) != "none":
        print(f"plugin={name} ({where(name)})")
        break
print("mpi4py_at=" + where("mpi4py"))
print("mpi4jax_at=" + where("mpi4jax"))
EOF
}
VENV_STATE="new"
if [ -x "$VENV/bin/python" ]; then
  VENV_STATE="exists, kept"
  INFO="$(venv_info)" || die "$VENV/bin/python does not run: remove $VENV (rm -rf $VENV) and run this again"
  JAX_AT="$(sed -n 's/^jax_at=//p' <<< "$INFO")"
  PLUGIN="$(sed -n 's/^plugin=//p' <<< "$INFO")"
  if [ "$JAX_FROM" = base ] && [ "$JAX_AT" = venv ]; then
    die "$VENV has its own jax, which would hide the base Python's CUDA JAX ($BASE_JAX): remove $VENV (rm -rf $VENV) or choose VENV=DIR"
  elif [ "$JAX_FROM" = base ] && [ "$JAX_AT" = none ]; then
    die "$VENV does not see the base Python's packages (made without them): remove $VENV (rm -rf $VENV) or choose VENV=DIR"
  elif [ "$JAX_FROM" = cpu ] && [ -n "$PLUGIN" ]; then
    die "the CPU build was chosen but $VENV sees $PLUGIN, with which JAX would run on the GPU: a fresh VENV=DIR, or remove $VENV (rm -rf $VENV)"
  fi
fi

# --- The plan --------------------------------------------------------------------------
PTH_NOTE=""
VENV_ARGS=()
if [ "$JAX_FROM" = base ]; then
  VENV_ARGS=(--system-site-packages)
  if [ "$BASE_IS_VENV" = 1 ]; then
    PTH_NOTE=", and $VENV/lib/python$BASE_PYVER/site-packages/_research_base_site.pth adds ${BASE_SITES//:/, } (the base Python is itself a venv, whose packages --system-site-packages alone would not show)"
  fi
fi
say "plan: venv $VENV ($VENV_STATE): $PYTHON -m venv ${VENV_ARGS[*]:+${VENV_ARGS[*]} }$VENV$PTH_NOTE"
case "$JAX_FROM" in
  base) say "plan: JAX: the base Python's $BASE_JAX, not reinstalled" ;;
  pip) say "plan: JAX: jax[cuda$CUDA_MAJOR]$JAX_RANGE from pip ($CUDA_WHY; not the base Python's: $BASE_WHY)" ;;
  cpu) say "plan: JAX: jax$JAX_RANGE and jaxlib from pip (CPU)" ;;
esac
if [ "$SITE_MPI" = 1 ]; then
  say "plan: mpi4py: mpi4py$MPI4PY_RANGE in $VENV, built with $MPICC unless the one there loads $SITE_LIBRARY"
else
  say "plan: mpi4py: the mpi4py$MPI4PY_RANGE wheel in $VENV (before any of the base Python's), loading the mpich$MPICH_RANGE wheel's libmpi from $VENV/lib"
fi
if [ -n "$CUDA_TOOLKIT" ]; then
  CUDA_SAID="CUDA_PATH=$CUDA_TOOLKIT (CUDA ${TOOLKIT_CUDA:-of unknown version})"
elif [ "$BUILD" = cuda ]; then
  CUDA_SAID="CUDA: the nvidia-cuda-nvcc-cu12 and -runtime-cu12 wheels that jax[cuda12] brings (mpi4jax's build prefers them to CUDA_PATH)"
else
  CUDA_SAID="CUDA_PATH unset: no CUDA toolkit, no CUDA bridge"
fi
say "plan: mpi4jax: mpi4jax$MPI4JAX_RANGE from source with MPI4JAX_BUILD_MPICC=$MPI4JAX_CC, checked to be the MPI mpi4py loads; $CUDA_SAID"
if [ "$OFFLINE" = 1 ]; then
  say "plan: pip offline (PIP_NO_INDEX): wheels from ${PIP_FIND_LINKS:-nowhere: PIP_FIND_LINKS is unset} and the base Python"
fi
if [ "$DRY_RUN" = 1 ]; then
  say "dry run: nothing changed"
  exit 0
fi

# --- The venv --------------------------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
  echo "[install] creating $VENV with $($PYTHON --version)${VENV_ARGS[*]:+ (${VENV_ARGS[*]})}"
  "$PYTHON" -m venv "${VENV_ARGS[@]}" "$VENV"
  if [ "$JAX_FROM" = base ] && [ "$BASE_IS_VENV" = 1 ]; then
    # site.addsitedir, not a bare path: the base's own .pth files count too. The
    # venv's site-packages stays first, so its mpi4py wins over the base's.
    "$VENV/bin/python" - "$BASE_SITES" <<'EOF'
import os
import sys
import sysconfig

pth = os.path.join(sysconfig.get_paths()["purelib"], "_research_base_site.pth")
with open(pth, "w") as f:
    for site in sys.argv[1].split(os.pathsep):
        f.write(f"import site; site.addsitedir({site!r})\n")
EOF
  fi
  if [ "$JAX_FROM" = base ]; then
    INFO="$(venv_info)"
    if [ "$(sed -n 's/^jax_at=//p' <<< "$INFO")" != base ] || ! grep -q '^plugin=' <<< "$INFO"; then
      die "the new $VENV does not see the base Python's CUDA JAX ($BASE_JAX; its packages: $BASE_SITES): report this with $PYTHON -c 'import sys; print(sys.path)'"
    fi
  fi
fi
PIP=("$VENV/bin/python" -m pip)
if [ "$OFFLINE" = 1 ]; then
  # Nothing to upgrade from: the venv's, the base Python's or the folder's
  # setuptools (64 and newer build editable installs; a Python 3.11 venv comes
  # with 65.5) and wheel.
  "${PIP[@]}" install -q "setuptools>=64" wheel \
    || die "offline: setuptools>=64 and wheel are in neither PIP_FIND_LINKS (${PIP_FIND_LINKS:-unset}) nor the base Python: add their wheels there"
else
  "${PIP[@]}" install -q --upgrade pip wheel setuptools
fi
# JAX, and mpi4jax's build requirements (it is built without isolation, below).
case "$JAX_FROM" in
  base) "${PIP[@]}" install -q "numpy$NUMPY_RANGE" nanobind cython ;;
  pip) "${PIP[@]}" install -q "jax[cuda$CUDA_MAJOR]$JAX_RANGE" "jaxlib$JAX_RANGE" "numpy$NUMPY_RANGE" nanobind cython ;;
  cpu) "${PIP[@]}" install -q "jax$JAX_RANGE" "jaxlib$JAX_RANGE" "numpy$NUMPY_RANGE" nanobind cython ;;
esac

# --- MPI: mpi4py in the venv, and the same MPI for mpi4jax ----------------------------
mpi4py_at() { venv_info | sed -n 's/^mpi4py_at=//p'; }
if [ "$SITE_MPI" = 1 ]; then
  # An mpi4py that loads another MPI library than MPICC's, or the base Python's,
  # is built again.
  BUILT_WITH="$("$VENV/bin/python" -c "import mpi4py.MPI as M; print(M.Get_library_version().splitlines()[0].strip())" 2>/dev/null || echo none)"
  AT="$(mpi4py_at)"
  if [ "$BUILT_WITH" != "$SITE_LIBRARY" ] || [ "$AT" != venv ]; then
    # From source, against the site MPI; --no-cache-dir: pip's wheel cache would
    # hand back a build made earlier against another MPI.
    echo "[install] building mpi4py with $MPICC (the one there loads: $BUILT_WITH; from: $AT)"
    if [ "$AT" = venv ]; then AGAIN=--force-reinstall; else AGAIN=--ignore-installed; fi
    MPICC="$MPICC" MPICXX="$MPICXX" "${PIP[@]}" install -q --no-cache-dir "$AGAIN" \
      --no-deps --no-binary mpi4py "mpi4py$MPI4PY_RANGE"
  fi
  # mpi4jax's build takes MPI4JAX_BUILD_MPICC, else the first mpicc on PATH
  # (not MPICC): both are pointed at ours, so a module or conda environment
  # left loaded cannot give mpi4jax another MPI than mpi4py's.
  SHIM="$(mktemp -d)"
  trap 'rm -rf "$SHIM"' EXIT
  ln -s "$MPICC" "$SHIM/mpicc"
  ln -s "$MPICXX" "$SHIM/mpicxx"
  export MPICC MPICXX PATH="$SHIM:$PATH"
  # What the native ring (research/comm/dense/ring.py) compiles with, at run time too:
  # mpi4py does not record the wrappers it was built with.
  printf '{"mpicc": "%s", "mpicxx": "%s", "library": "%s"}\n' \
    "$MPICC" "$MPICXX" "$SITE_LIBRARY" > "$VENV/research-mpi.json"
  MPI4JAX_LIBRARY="$SITE_LIBRARY"
else
  # MPI (the mpich wheel brings mpiexec, mpicc and mpicxx).
  "${PIP[@]}" install -q "mpich$MPICH_RANGE" "mpi4py$MPI4PY_RANGE"
  AT="$(mpi4py_at)"
  if [ "$AT" != venv ]; then
    # The base Python's mpi4py (a GPU image's, built against its own MPI) would
    # be the one imported: the wheel goes into the venv, whose site-packages come
    # first, and loads the mpich wheel's libmpi from VENV/lib (mpi4py/_mpiabi.py).
    say "installing the mpi4py wheel into $VENV: the one imported now is the base Python's"
    "${PIP[@]}" install -q --ignore-installed --no-deps "mpi4py$MPI4PY_RANGE"
  fi
  [ -x "$MPI4JAX_CC" ] || die "$MPI4JAX_CC is missing: the mpich wheel did not install its compiler wrappers"
  MPI4JAX_LIBRARY="$(mpi_library_of "$MPI4JAX_CC")" \
    || die "$MPI4JAX_CC cannot build an MPI program (its output is above): a C compiler (cc) is needed"
  # mpicxx and mpiexec of the same MPI come first too.
  export PATH="$VENV_ABS/bin:$PATH"
fi
# Before mpi4jax is built: the MPI that mpi4py loads at run time must be the one
# MPI4JAX_BUILD_MPICC compiles against (2026-11-28 on a GPU image: mpi4jax built
# against the image's Open MPI, mpi4py running MPICH: "MPI ABI incompatibility").
MPI4PY_SAYS="$("$VENV/bin/python" - <<'EOF'
import os

import mpi4py
import mpi4py.MPI as M

libs = sorted({ln.split()[-1] for ln in open("/proc/self/maps") if "libmpi" in ln.split()[-1]})
print(M.Get_library_version().splitlines()[0].strip("\x00 \t"))
print(f"{os.path.dirname(mpi4py.__file__)}, from {' '.join(libs) or 'a library linked in'}")
EOF
)" || die "mpi4py does not import in $VENV (its error is above)"
MPI4PY_LIBRARY="$(head -1 <<< "$MPI4PY_SAYS")"
MPI4PY_WHERE="$(sed -n 2p <<< "$MPI4PY_SAYS")"
if [ "$MPI4PY_LIBRARY" != "$MPI4JAX_LIBRARY" ]; then
  die "mpi4py ($MPI4PY_WHERE) loads '$MPI4PY_LIBRARY', but $MPI4JAX_CC builds against '$MPI4JAX_LIBRARY': mpi4jax built with it would refuse to import ('MPI ABI incompatibility'). Remove $VENV and run this again; on a cluster, --site-mpi with MPICC naming the MPI both should use"
fi
say "MPI: mpi4py ($MPI4PY_WHERE) loads $MPI4PY_LIBRARY; mpi4jax is built with $MPI4JAX_CC, the same"

# Importing mpi4jax fails when it was built against another MPI than mpi4py's
# ("Please rebuild mpi4jax with the same MPI library"); the CUDA build also needs
# its CUDA bridge: built again then.
REBUILD=""
MPI4JAX_AT="$(venv_info | sed -n 's/^mpi4jax_at=//p')"
if [ "$MPI4JAX_AT" = none ]; then
  REBUILD="not installed"
elif [ "$MPI4JAX_AT" = base ]; then
  REBUILD="the one there is the base Python's"
elif ! "$VENV/bin/python" -c "import mpi4jax" 2>/dev/null; then
  REBUILD="it does not import"
elif [ "$BUILD" = cuda ] && ! "$VENV/bin/python" -c "import sys, mpi4jax; sys.exit(not mpi4jax.has_cuda_support())" 2>/dev/null; then
  REBUILD="it has no CUDA support"
fi
if [ -n "$REBUILD" ]; then
  [ -n "$CUDA_TOOLKIT" ] && export CUDA_PATH="$CUDA_TOOLKIT"
  # mpi4jax's build runs MPI4JAX_BUILD_MPICC with the build's own flags first,
  # and an MPI wrapper adds its -L after them: where one of those folders holds
  # another MPI's libmpi.so, -lmpi links that one. It does on a Debian or Ubuntu
  # Python, whose LIBDIR /usr/lib/x86_64-linux-gnu holds Debian's Open MPI where
  # it is installed (a GPU image, 2026-11-28: mpi4jax then called Open MPI's
  # library with MPICH's handles, "MPI ABI incompatibility"). So the build gets a
  # wrapper that names the MPI's own library folders before anything else.
  MPI_LIBDIRS="$( { "$MPI4JAX_CC" -show 2>/dev/null || "$MPI4JAX_CC" --showme 2>/dev/null || true; } \
    | tr ' ' '\n' | sed -n 's/^-L//p' | tr '\n' ' ')"
  MPI4JAX_WRAPPER="$VENV_ABS/bin/research-mpi4jax-mpicc"
  {
    echo '#!/usr/bin/env bash'
    echo "# mpi4jax's build compiler (scripts/install.sh): $MPI4JAX_CC, its library folders first"
    printf 'exec %q' "$MPI4JAX_CC"
    for d in $MPI_LIBDIRS; do printf ' -L%q' "$d"; done
    echo ' "$@"'
  } > "$MPI4JAX_WRAPPER"
  chmod +x "$MPI4JAX_WRAPPER"
  export MPI4JAX_BUILD_MPICC="$MPI4JAX_WRAPPER"
  echo "[install] building mpi4jax from source (about a minute; $REBUILD; MPI4JAX_BUILD_MPICC=$MPI4JAX_CC with -L ${MPI_LIBDIRS:-(none found)}first, CUDA_PATH=${CUDA_PATH:-unset})"
  # --no-cache-dir: a cached build may be against the other MPI.
  "${PIP[@]}" install -q --no-cache-dir --no-build-isolation --force-reinstall --no-deps \
    --no-binary mpi4jax "mpi4jax$MPI4JAX_RANGE"
fi

# Which libmpi each of mpi4jax's extensions loads: said when the end check fails.
mpi4jax_libraries() {
  local dir so
  dir="$("$VENV/bin/python" -c "import importlib.util as u; s = u.find_spec('mpi4jax'); print(s.submodule_search_locations[0] if s else '')" 2>/dev/null)" || return 0
  [ -n "$dir" ] || return 0
  while IFS= read -r so; do
    echo "[install] $(basename "$so"): $(ldd "$so" 2>&1 | grep -i 'libmpi' | tr -s ' \t' ' ' | tr '\n' ';')" >&2
  done < <(find "$dir" -name '*.so')
  echo "[install] LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-unset} LD_PRELOAD=${LD_PRELOAD:-unset}" >&2
}

# --- The project ------------------------------------------------------------------------
# data: scikit-learn, whose wheel holds the digits dataset (`--dataset digits`)
# that tests and `experiments.eager_sgd --dataset digits` use; dev: the test
# tools. Offline it is built without isolation, which would fetch setuptools.
if [ "$SITE_MPI" = 1 ]; then EXTRAS="data"; else EXTRAS="mpich,data"; fi
if [ "$OFFLINE" = 0 ]; then
  "${PIP[@]}" install -q -e ".[$EXTRAS,dev]"
else
  "${PIP[@]}" install -q --no-build-isolation -e ".[$EXTRAS]" \
    || die "offline: the project's dependencies above are in neither PIP_FIND_LINKS (${PIP_FIND_LINKS:-unset}) nor the base Python: add their wheels there (scripts/gpu_wheels.sh)"
  # Each tool of the dev extra that is at hand; those that are not are named.
  MISSING=()
  while IFS= read -r req; do
    "${PIP[@]}" install -q "$req" >/dev/null 2>&1 || MISSING+=("$req")
  done < <("$VENV/bin/python" -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['dev']))")
  if [ "${#MISSING[@]}" -gt 0 ]; then
    say "offline: left out of the dev extra, in neither PIP_FIND_LINKS nor the base Python: ${MISSING[*]}"
  fi
fi
# The end check: every import, the MPI mpi4py loads; on the CUDA build also JAX's
# backend and devices and mpi4jax's CUDA support, or it fails here.
"$VENV/bin/python" - "$BUILD" <<'EOF' || { rc=$?; mpi4jax_libraries; exit "$rc"; }
import sys

import flax  # noqa: F401
import google_crc32c  # noqa: F401
import jax
import mpi4jax
import mpi4py.MPI as M
import optax  # noqa: F401
import orbax.checkpoint  # noqa: F401

said = (
    f"jax {jax.__version__} | mpi4jax {mpi4jax.__version__} | "
    f"{M.Get_library_version().splitlines()[0].strip()}"
)
if sys.argv[1] == "cuda":
    import os

    backend, devices = jax.default_backend(), jax.devices()
    cuda = mpi4jax.has_cuda_support()
    said += f" | backend {backend}: {', '.join(str(d) for d in devices)} | mpi4jax CUDA: {cuda}"
    if backend != "gpu":
        forced = os.environ.get("JAX_PLATFORMS")
        sys.exit(
            f"[install] FAILED: the CUDA build was chosen, but JAX runs on {backend} "
            f"({said}): {'JAX_PLATFORMS=' + forced + ' forces it; unset it' if forced else 'its CUDA plugin did not load: its warning is above (driver, CUDA libraries)'}"
        )
    if not cuda:
        sys.exit(
            f"[install] FAILED: the CUDA build was chosen, but mpi4jax has no CUDA support ({said}): "
            "it was built without a CUDA toolkit; set CUDA_PATH to one, "
            "remove mpi4jax (pip uninstall mpi4jax) and run this again"
        )
print("[install] ok:", said)
EOF
if [ "$SITE_MPI" = 1 ]; then
  # The native ring (research/comm/dense/ring.py) is built on first use with the
  # C++ wrapper of the MPI mpi4py was built with; built here once, to say which.
  "$VENV/bin/python" -c "from research.comm.dense import ring; lib = ring.build(); print('[install] native ring built with', ring.compiler(), '->', lib)" \
    || echo "[install] the native ring could not be built: runs use MPI's own allreduce (the reason is printed above)"
fi
