"""What scripts/install.sh pins and what scripts/gpu_wheels.sh brings: the
version ranges as pyproject.toml states them, the wheels the GPU image lacks,
and the install scripts under shellcheck (where it is installed)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib

import pytest

from tests.harness import ROOT

INSTALL = ROOT / "scripts" / "install.sh"
WHEELS = ROOT / "scripts" / "gpu_wheels.sh"


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_install_ranges_are_pyprojects():
    project = _pyproject()
    pins = {}
    for spec in project["dependencies"] + project["optional-dependencies"]["mpich"]:
        m = re.match(r"([A-Za-z0-9_.-]+)(.*)", spec)
        pins[m.group(1).lower()] = m.group(2)
    text = INSTALL.read_text()
    ranges = dict(re.findall(r'^([A-Z0-9]+)_RANGE="([^"]+)"$', text, flags=re.M))
    assert ranges == {
        "JAX": pins["jax"],
        "NUMPY": pins["numpy"],
        "MPI4PY": pins["mpi4py"],
        "MPICH": pins["mpich"],
        "MPI4JAX": pins["mpi4jax"],
    }
    assert pins["jaxlib"] == pins["jax"]
    # The versions tested: 0.10.2 here (Python 3.11), 0.11.2 on the GPU image.
    assert pins["jax"] == ">=0.10,<0.12"


def test_gpu_wheels_lists_what_the_gpu_image_lacks():
    proc = subprocess.run(
        ["bash", str(WHEELS), "--list"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    listed = {}
    for line in proc.stdout.splitlines():
        kind, spec = line.split(" ", 1)
        listed[re.match(r"[A-Za-z0-9_.-]+", spec).group(0).lower()] = kind
    assert listed == {
        "mpich": "wheel",
        "mpi4py": "wheel",  # the image's is built against its own MPI
        "google-crc32c": "wheel",
        "tensorboardx": "wheel",
        "orbax-checkpoint": "wheel",  # its version there is not recorded
        "mpi4jax": "sdist",
        "grain": "wheel",  # --dataset imagenet's (opencv and pillow are there)
        "array-record": "wheel",
        "simplejpeg": "wheel",
        "ruff": "skip",
        "xprof": "skip",
    }


@pytest.mark.skipif(
    shutil.which("shellcheck") is None, reason="shellcheck is not installed"
)
def test_scripts_pass_shellcheck():
    proc = subprocess.run(
        [
            "shellcheck",
            str(INSTALL),
            str(WHEELS),
            str(ROOT / "scripts" / "gpu_check.sh"),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout
