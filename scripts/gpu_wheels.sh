#!/usr/bin/env bash
# The wheels a lent GPU machine lacks, fetched here (it has no network): whatever
# `pip install -e .[mpich,dev,data]` needs that its image does not hold, for
# Python 3.12 on manylinux x86_64, plus the mpi4jax sdist, into .whl/ (ignored by
# git). There, with .whl carried along (at most 64 MiB with the working tree):
#
#   PIP_NO_INDEX=1 PIP_FIND_LINKS=$PWD/.whl bash scripts/install.sh
#
#   bash scripts/gpu_wheels.sh          fetch, check their needs, print the size
#   bash scripts/gpu_wheels.sh --list   what it would fetch and skip; fetches nothing
#   WHEELS=DIR (default .whl), GPU_PYTHON=3.12 (another version, e.g. 3.11, to
#   rehearse an offline install here)
#
# Always fetched, image or not: mpich and mpi4py (the venv's own mpi4py must load
# the mpich wheel's MPI, not the image's), and orbax-checkpoint (its version there
# was not recorded; pip takes the image's where it is in range). Skipped for size:
# xprof (32 MB and about 30 MB of its needs) and ruff (11 MB), the dev extra's
# profile viewer and linter: the offline install names them as left out.
set -euo pipefail
cd "$(dirname "$0")/.."
LIST=0
case "${1:-}" in
  "") ;;
  --list) LIST=1 ;;
  *) echo "usage: bash scripts/gpu_wheels.sh [--list]" >&2; exit 2 ;;
esac
WHEELS="${WHEELS:-.whl}"
GPU_PYTHON="${GPU_PYTHON:-3.12}"
# Python 3.11+ (tomllib) with pip; the project's venv also prepares mpi4jax's
# sdist metadata (it imports mpi4py and nanobind when they are there).
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi

# The image's Python packages (lent machines nvidia-h100-x1 and nvidia-h200, image
# 'cuda', read 2026-11-17; versions seen there: jax, jaxlib, jax-cuda13-plugin
# 0.11.2, flax 0.12.10, optax 0.2.8, numpy 2.5.2, Python 3.12.3).
IMAGE="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio
attrs botorch build certifi charset-normalizer chex click cloudpickle cmake colorama
contourpy coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler
cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub
humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt
jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning
lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch
mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13
nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13
nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum
opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip
pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11
py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark
pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml
regex requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy
seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore
threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq
torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer
typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray
xxhash yarl zipp"
ALWAYS="mpich mpi4py orbax-checkpoint"
SKIP="xprof ruff"

# One line per requirement: "wheel SPEC", "sdist SPEC" or "skip SPEC".
PLAN="$(IMAGE="$IMAGE" ALWAYS="$ALWAYS" SKIP="$SKIP" "$PY" - <<'EOF'
import os
import tomllib

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

image = set(os.environ["IMAGE"].split())
always, skip = set(os.environ["ALWAYS"].split()), set(os.environ["SKIP"].split())
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
for spec in project["dependencies"] + extras["mpich"] + extras["data"] + extras["dev"]:
    name = canonicalize_name(Requirement(spec).name)
    if name in skip:
        print("skip", spec)
    elif name == "mpi4jax":
        print("sdist", spec)
    elif name in always or name not in image:
        print("wheel", spec)
EOF
)"
if [ "$LIST" = 1 ]; then
  echo "$PLAN"
  exit 0
fi

mkdir -p "$WHEELS"
PLATFORMS=()
for p in manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 \
  manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
  PLATFORMS+=(--platform "${p}_x86_64")
done
# One version of each name: older downloads of the names fetched go first.
NAMES="$(awk '$1 != "skip" {print $2}' <<< "$PLAN")" "$PY" - "$WHEELS" <<'EOF'
import os
import sys

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

names = {canonicalize_name(Requirement(s).name) for s in os.environ["NAMES"].split()}
for f in os.listdir(sys.argv[1]):
    if canonicalize_name(f.split("-")[0]) in names:
        os.remove(os.path.join(sys.argv[1], f))
EOF
while read -r kind spec; do
  case "$kind" in
    wheel)
      echo "[gpu_wheels] $spec"
      "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$GPU_PYTHON" \
        --implementation cp "${PLATFORMS[@]}" -d "$WHEELS" "$spec" ;;
    sdist)
      # Its metadata is prepared here without isolation (with isolation pip
      # resolves mpi4jax's build requirements, jax among them, for nothing).
      echo "[gpu_wheels] $spec (source: built there against the mpich wheel, with CUDA)"
      "$PY" -m pip download -q --no-deps --no-binary=:all: --no-build-isolation -d "$WHEELS" "$spec" ;;
    skip) echo "[gpu_wheels] skipped: $spec (size; the dev extra's, left out offline)" ;;
  esac
done <<< "$PLAN"

# What the fetched wheels need must be in the image or among them, and each name
# there once: two versions stop an install.
IMAGE="$IMAGE" GPU_PYTHON="$GPU_PYTHON" "$PY" - "$WHEELS" <<'EOF'
import collections
import os
import sys
import zipfile

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

folder, py = sys.argv[1], os.environ["GPU_PYTHON"]
target = {
    "python_version": py, "python_full_version": py + ".0", "sys_platform": "linux",
    "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
    "implementation_name": "cpython", "platform_python_implementation": "CPython",
    "extra": "",
}
files = sorted(os.listdir(folder))
have = collections.defaultdict(list)
for f in files:
    have[canonicalize_name(f.split("-")[0])].append(f)
twice = {n: fs for n, fs in have.items() if len(fs) > 1}
known = set(os.environ["IMAGE"].split()) | set(have)
missing = []
for f in files:
    if not f.endswith(".whl"):
        continue
    with zipfile.ZipFile(os.path.join(folder, f)) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        for line in z.read(meta).decode().splitlines():
            if line.startswith("Requires-Dist:"):
                r = Requirement(line.split(":", 1)[1].strip())
                if (r.marker is None or r.marker.evaluate(target)) and canonicalize_name(
                    r.name
                ) not in known:
                    missing.append(f"{f} needs {r}")
if twice:
    sys.exit(f"[gpu_wheels] two versions of one name in {folder}: {twice}; remove all but one")
if missing:
    sys.exit(
        "[gpu_wheels] needed there and in neither the image nor "
        f"{folder}: " + "; ".join(missing) + " (add them to this script)"
    )
total = sum(os.path.getsize(os.path.join(folder, f)) for f in files)
for f in files:
    print(f"[gpu_wheels] {os.path.getsize(os.path.join(folder, f)) / 2**20:6.2f} MiB  {f}")
print(
    f"[gpu_wheels] {folder}: {len(files)} files, {total / 2**20:.1f} MiB "
    "(the device tool carries at most 64 MiB with the working tree); their needs are "
    "in the image"
)
EOF
