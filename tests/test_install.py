"""scripts/install.sh's choice of JAX build, and its plan, without a GPU.

``--dry-run`` prints the plan (venv, which JAX, which MPI builds mpi4jax, which
CUDA toolkit) and changes nothing. The GPU is a stand-in ``nvidia-smi`` on PATH
that prints what a real one prints (``-L``: a GPU line; plain: the driver's CUDA
version); a base Python "with a CUDA JAX" is a venv holding the distributions'
metadata (what the install reads: it never imports jax to decide); the CUDA
toolkit is a folder with the two headers the install reads. The one run that is
no dry run checks what failed on a GPU image once: a venv made from a base
Python that is itself a venv must see that venv's packages (the image's JAX).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INSTALL = ROOT / "scripts" / "install.sh"
WHEELS = ROOT / "scripts" / "gpu_wheels.sh"
H100 = "GPU 0: NVIDIA H100 80GB HBM3"
CLEARED = (
    "PIP_NO_INDEX",
    "PIP_FIND_LINKS",
    "INSTALL_DRY_RUN",
    "JAX_CUDA",
    "JAX_PLATFORMS",
    "MPICC",
    "CUDA_PATH",
    "VENV",
    "PYTHON",
)


def _dist(site: Path, name: str, version: str) -> None:
    """A distribution's metadata as pip leaves it in site-packages."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    )
    (info / "RECORD").write_text("")


def _venv(path: Path, **dists: str) -> Path:
    """A venv (no pip: fast) holding ``dists`` (name with _ for -: version)."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(path)], check=True
    )
    (site,) = path.glob("lib/python3.*/site-packages")
    for name, version in dists.items():
        _dist(site, name.replace("_", "-"), version)
    return path


def _site(venv: Path) -> Path:
    (site,) = venv.glob("lib/python3.*/site-packages")
    return site


@pytest.fixture
def toolkit(tmp_path):
    """A CUDA toolkit as the install sees one: its version from CUDART_VERSION."""

    def make(version: int = 13000) -> Path:
        root = tmp_path / f"cuda-{version}"
        (root / "include").mkdir(parents=True, exist_ok=True)
        (root / "include" / "cuda_runtime.h").write_text("")
        (root / "include" / "cuda_runtime_api.h").write_text(
            f"#define CUDART_VERSION  {version}\n"
        )
        return root

    return make


def _path_without_nvidia_smi(bin_dir: Path) -> str:
    keep = [
        d
        for d in os.environ["PATH"].split(os.pathsep)
        if d and not (Path(d) / "nvidia-smi").exists()
    ]
    return os.pathsep.join([str(bin_dir), *keep])


def install(
    tmp_path: Path,
    *args: str,
    gpu: str | None = None,
    driver_fails: bool = False,
    base: Path | None = None,
    cuda_path: Path | str | None = None,
    venv: Path | None = None,
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    """Run install.sh; ``gpu``: the driver's CUDA version of a stand-in
    nvidia-smi listing one H100 (None: no nvidia-smi on PATH)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    if gpu is not None or driver_fails:
        if driver_fails:
            body = (
                "echo 'NVIDIA-SMI has failed because it couldn't communicate with "
                "the NVIDIA driver.'; exit 9"
            )
        else:
            body = (
                f'if [ "$1" = -L ]; then echo "{H100} (UUID: GPU-0d4a)"; exit 0; fi\n'
                f'echo "| NVIDIA-SMI 580.159.04   Driver Version: 580.159.04   '
                f'CUDA Version: {gpu}     |"'
            )
        smi.write_text(f"#!/bin/sh\n{body}\n")
        smi.chmod(0o755)
    full = {k: v for k, v in os.environ.items() if k not in CLEARED}
    full["PATH"] = _path_without_nvidia_smi(bin_dir)
    full["VENV"] = str(venv or tmp_path / "venv")
    if base is not None:
        full["PYTHON"] = str(base / "bin" / "python")
    if cuda_path is not None:
        full["CUDA_PATH"] = str(cuda_path)
    full.update(env or {})
    return subprocess.run(
        ["bash", str(INSTALL), *args],
        cwd=tmp_path,
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
    )


def plan(proc: subprocess.CompletedProcess) -> dict[str, str]:
    """The dry run's lines by topic: "choice", "venv", "JAX", "mpi4py", ..."""
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == "[install] dry run: nothing changed", proc.stdout
    out = {"choice": lines[0]}
    for line in lines:
        m = re.match(r"\[install\] plan: (venv|JAX|mpi4py|mpi4jax|pip)\b", line)
        if m:
            out[m.group(1)] = line
    return out


def refused(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    for w in words:
        assert w in proc.stderr, proc.stderr


# --- which build, and why ------------------------------------------------------


def test_cpu_build_where_no_gpu_is_listed(tmp_path, toolkit):
    cuda = toolkit()
    p = plan(install(tmp_path, "--dry-run", cuda_path=cuda))
    assert p["choice"] == (
        "[install] JAX: the CPU build (no NVIDIA GPU: no nvidia-smi on PATH; "
        "--cuda for the CUDA build)"
    )
    assert p["JAX"] == "[install] plan: JAX: jax>=0.10,<0.12 and jaxlib from pip (CPU)"
    venv = tmp_path / "venv"
    assert p["venv"].endswith(f"(new): python3 -m venv {venv}")
    assert f"MPI4JAX_BUILD_MPICC={venv}/bin/mpicc," in p["mpi4jax"]
    assert p["mpi4jax"].endswith(f"CUDA_PATH={cuda} (CUDA 13.0)")
    assert "pip" not in p  # online
    assert not venv.exists()  # a dry run changes nothing


def test_cpu_build_where_nvidia_smi_finds_no_driver(tmp_path, toolkit):
    p = plan(install(tmp_path, "--dry-run", driver_fails=True, cuda_path=toolkit()))
    assert p["choice"] == (
        "[install] JAX: the CPU build (no NVIDIA GPU: nvidia-smi -L lists no GPU; "
        "--cuda for the CUDA build)"
    )


def test_cpu_build_when_asked_on_a_gpu_machine(tmp_path, toolkit):
    p = plan(install(tmp_path, "--dry-run", "--cpu", gpu="13.0", cuda_path=toolkit()))
    assert (
        p["choice"]
        == f"[install] JAX: the CPU build (--cpu, although nvidia-smi -L lists {H100})"
    )
    assert "(CPU)" in p["JAX"]


def test_the_gpu_images_cuda_jax_is_used_as_it_is(tmp_path, toolkit):
    """The lent GPU machine: python3 is itself a venv (/opt/torch/.venv) with jax,
    jaxlib and jax-cuda13-plugin 0.11.2; the driver runs CUDA 13.0."""
    base = _venv(
        tmp_path / "image",
        jax="0.11.2",
        jaxlib="0.11.2",
        jax_cuda13_plugin="0.11.2",
        mpi4py="4.1.2",
    )
    cuda = toolkit(13000)
    p = plan(install(tmp_path, "--dry-run", gpu="13.0", base=base, cuda_path=cuda))
    assert p["choice"] == (
        f"[install] JAX: the CUDA build (nvidia-smi -L lists {H100}; --cpu for the "
        "CPU build; the driver's CUDA: 13.0)"
    )
    venv = tmp_path / "venv"
    pyver = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert f"-m venv --system-site-packages {venv}, and " in p["venv"]
    assert (
        f"{venv}/lib/python{pyver}/site-packages/_research_base_site.pth adds "
        f"{_site(base)} (the base Python is itself a venv" in p["venv"]
    )
    assert p["JAX"] == (
        "[install] plan: JAX: the base Python's jax 0.11.2, jaxlib 0.11.2, "
        "jax-cuda13-plugin 0.11.2, not reinstalled"
    )
    assert f"wheel in {venv} (before any of the base Python's)" in p["mpi4py"]
    assert f"MPI4JAX_BUILD_MPICC={venv}/bin/mpicc," in p["mpi4jax"]
    assert p["mpi4jax"].endswith(f"CUDA_PATH={cuda} (CUDA 13.0)")
    assert not venv.exists()


def test_a_plain_base_python_needs_no_pth(tmp_path, toolkit):
    """A base Python that is no venv: --system-site-packages shows its packages."""
    site = tmp_path / "base" / "site-packages"
    for name in ("jax", "jaxlib", "jax-cuda12-plugin"):
        _dist(site, name, "0.10.2")
    python = tmp_path / "base" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(
        f'#!/bin/sh\nPYTHONPATH={site} exec {sys.base_prefix}/bin/python3 "$@"\n'
    )
    python.chmod(0o755)
    p = plan(
        install(
            tmp_path,
            "--dry-run",
            gpu="12.4",
            base=tmp_path / "base",
            cuda_path=toolkit(12040),
        )
    )
    assert p["venv"].endswith(f"-m venv --system-site-packages {tmp_path / 'venv'}")
    assert "jax-cuda12-plugin 0.10.2, not reinstalled" in p["JAX"]
    assert p["mpi4jax"].endswith("(CUDA 12.4)")


@pytest.mark.parametrize(
    "dists, driver, jax, why",
    [
        (
            {},
            "13.0",
            "cuda13",
            "the driver runs CUDA 13.0; not the base Python's: it has no jax",
        ),
        (
            {"jax": "0.11.2", "jaxlib": "0.11.2"},
            "12.4",
            "cuda12",
            "its jax 0.11.2 has no CUDA plugin (jax-cuda13-plugin or "
            "jax-cuda12-plugin)",
        ),
        (
            {"jax": "0.11.2", "jaxlib": "0.11.2", "jax_cuda13_plugin": "0.11.2"},
            "12.4",
            "cuda12",
            "its jax-cuda13-plugin needs a newer driver than this one (CUDA 12.4)",
        ),
        (
            {"jax": "0.12.0", "jaxlib": "0.12.0", "jax_cuda13_plugin": "0.12.0"},
            "13.0",
            "cuda13",
            "its jax 0.12.0 is outside the range >=0.10,<0.12",
        ),
        (
            {"jax": "0.11.2", "jaxlib": "0.11.2", "jax_cuda13_plugin": "0.11.1"},
            "13.0",
            "cuda13",
            "its jax-cuda13-plugin 0.11.1 is not its jaxlib's version (0.11.2)",
        ),
    ],
)
def test_cuda_jax_from_pip_where_the_base_has_none_to_use(
    tmp_path, toolkit, dists, driver, jax, why
):
    base = _venv(tmp_path / "base", **dists)
    p = plan(install(tmp_path, "--dry-run", gpu=driver, base=base, cuda_path=toolkit()))
    assert p["JAX"].startswith(
        f"[install] plan: JAX: jax[{jax}]>=0.10,<0.12 from pip ("
    )
    assert why in p["JAX"]
    assert "--system-site-packages" not in p["venv"]
    if jax == "cuda12":  # mpi4jax builds against the wheels' CUDA 12, not CUDA_PATH
        assert (
            "nvidia-cuda-nvcc-cu12" in p["mpi4jax"] and "CUDA_PATH=" not in p["mpi4jax"]
        )


def test_cuda_asked_where_the_driver_is_unknown(tmp_path, toolkit):
    base = _venv(tmp_path / "base")
    p = plan(install(tmp_path, "--dry-run", "--cuda", base=base, cuda_path=toolkit()))
    assert (
        p["choice"]
        == "[install] JAX: the CUDA build (--cuda; the driver's CUDA: unknown)"
    )
    assert "jax[cuda12]>=0.10,<0.12 from pip (the driver's CUDA is unknown" in p["JAX"]
    p = plan(
        install(
            tmp_path,
            "--dry-run",
            "--cuda",
            base=base,
            cuda_path=toolkit(),
            env={"JAX_CUDA": "13"},
        )
    )
    assert "jax[cuda13]>=0.10,<0.12 from pip (JAX_CUDA=13;" in p["JAX"]


def test_dry_run_from_the_environment_and_offline(tmp_path, toolkit):
    p = plan(
        install(
            tmp_path,
            cuda_path=toolkit(),
            env={
                "INSTALL_DRY_RUN": "1",
                "PIP_NO_INDEX": "1",
                "PIP_FIND_LINKS": "/w/.whl",
            },
        )
    )
    assert p["pip"] == (
        "[install] plan: pip offline (PIP_NO_INDEX): wheels from /w/.whl "
        "and the base Python"
    )


def test_site_mpi_plan_names_its_mpicc(tmp_path, toolkit):
    mpicc = Path(sys.prefix) / "bin" / "mpicc"  # the mpich wheel's, standing in
    if not mpicc.exists() or shutil.which("cc") is None:
        pytest.skip("needs the mpich wheel's mpicc and a C compiler")
    proc = install(
        tmp_path,
        "--dry-run",
        "--site-mpi",
        cuda_path=toolkit(),
        env={"MPICC": str(mpicc)},
    )
    p = plan(proc)
    assert (
        "[install] --site-mpi: building mpi4py, mpi4jax and the native ring with "
        f"{mpicc} (MPICC" in proc.stdout
    )
    assert (
        f"built with {mpicc} unless the one there loads MPICH Version:" in p["mpi4py"]
    )
    assert f"MPI4JAX_BUILD_MPICC={mpicc}," in p["mpi4jax"]


# --- refusals: one line, exit 2, nothing made ------------------------------------


def test_refusals(tmp_path, toolkit):
    refused(install(tmp_path, "--cuda", "--cpu"), "--cuda and --cpu exclude each other")
    refused(install(tmp_path, "--gpu"), "usage: bash scripts/install.sh")
    refused(
        install(tmp_path, "--dry-run", cuda_path=tmp_path),
        f"CUDA_PATH={tmp_path} holds no include/cuda_runtime.h",
    )
    base = _venv(
        tmp_path / "base", jax="0.11.2", jaxlib="0.11.2", jax_cuda12_plugin="0.11.2"
    )
    refused(
        install(tmp_path, "--dry-run", gpu="12.4", base=base, cuda_path=toolkit(13000)),
        "is CUDA 13.0, newer than the driver's CUDA 12.4",
    )
    bare = _venv(tmp_path / "bare")
    refused(
        install(tmp_path, "--dry-run", gpu="11.8", base=bare, cuda_path=toolkit()),
        "the driver runs CUDA 11.8; JAX's CUDA builds need 12 or newer",
    )
    refused(
        install(tmp_path, "--dry-run", "--cuda", base=bare, env={"JAX_CUDA": "11"}),
        "JAX_CUDA=11",
    )
    assert not (tmp_path / "venv").exists()


def test_an_existing_venv_that_does_not_fit_is_refused(tmp_path, toolkit):
    base = _venv(
        tmp_path / "image", jax="0.11.2", jaxlib="0.11.2", jax_cuda13_plugin="0.11.2"
    )
    own = _venv(tmp_path / "own", jax="0.10.2", jaxlib="0.10.2")
    refused(
        install(
            tmp_path, "--dry-run", gpu="13.0", base=base, cuda_path=toolkit(), venv=own
        ),
        f"{own} has its own jax, which would hide the base Python's CUDA JAX",
    )
    cuda = _venv(
        tmp_path / "cuda", jax="0.10.2", jaxlib="0.10.2", jax_cuda12_plugin="0.10.2"
    )
    refused(
        install(tmp_path, "--dry-run", "--cpu", cuda_path=toolkit(), venv=cuda),
        f"the CPU build was chosen but {cuda} sees jax-cuda12-plugin (venv)",
    )


# --- for real: the venv sees the base venv's packages --------------------------------


def test_a_venv_made_from_a_base_venv_sees_its_cuda_jax(tmp_path, toolkit):
    """Made from a venv's python, ``venv --system-site-packages`` shows the
    interpreter's own site-packages, not the venv's: the install adds a .pth.
    Offline with no wheels it stops at its first pip step, after the venv."""
    base = _venv(
        tmp_path / "image", jax="0.11.2", jaxlib="0.11.2", jax_cuda13_plugin="0.11.2"
    )
    empty = tmp_path / "wheels"
    empty.mkdir()
    proc = install(
        tmp_path,
        gpu="13.0",
        base=base,
        cuda_path=toolkit(),
        env={"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(empty)},
    )
    venv = tmp_path / "venv"
    assert f"[install] creating {venv} with Python" in proc.stdout, (
        proc.stdout + proc.stderr
    )
    assert proc.returncode != 0  # nothing to install from
    assert "does not see the base Python's CUDA JAX" not in proc.stderr
    (pth,) = _site(venv).glob("_research_base_site.pth")
    assert pth.read_text() == f"import site; site.addsitedir({str(_site(base))!r})\n"
    probe = (
        "import importlib.metadata as m, json, sys; print(json.dumps(["
        "m.version('jax-cuda13-plugin'), str(m.distribution('jax').locate_file('')), "
        "sys.path]))"
    )
    seen = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    plugin, jax_at, path = json.loads(seen)
    # The base's plugin, its jax where the base keeps it, after the venv's own.
    assert (plugin, jax_at) == ("0.11.2", str(_site(base)))
    assert path.index(str(_site(base))) > path.index(str(_site(venv)))
