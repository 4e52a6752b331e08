"""The two device calls, benchmarks/gpu_build.sh then benchmarks/gpu_check.sh: their dry
runs pass on a CPU machine one after the other (the second finding the first's install), and
the carry check finds what a bare GPU machine would lack.

The carry folder is a fake one made here: tiny wheels that hold only their METADATA
(the dependencies of the real gsplat 1.5.3, plyfile and viser 1.1.1, cut down), and the
demo scene standing in for the test capture.
"""

import base64
import hashlib
import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import cv2
import pytest

from turbogs.kernels import raster_cpu

REPO = Path(__file__).resolve().parents[1]
BUILD = REPO / "benchmarks" / "gpu_build.sh"
CHECK = REPO / "benchmarks" / "gpu_check.sh"

# name, version, Requires-Dist lines. Markers that do not hold on the GPU machine
# (extras, old Pythons, Windows) must not count as needs.
FAKE_WHEELS = [
    ("gsplat", "1.5.3", ["ninja", "numpy", "jaxtyping", "rich>=12", "torch",
                         'typing_extensions; python_version < "3.8"', 'black[jupyter]==22.3.0; extra == "dev"']),
    ("plyfile", "1.1.5", ["numpy>=2.0"]),
    ("viser", "1.1.1", ["imageio<3.0.0,>=2.0.0", "websockets<17.0.0,>=13.1", "rich<15.0.0,>=13.3.3", "tqdm",
                        "typing-extensions>=4.0.0", "gdown>=4.6.6; extra == 'dev'",
                        "pywin32; sys_platform == 'win32'"]),
    ("imageio", "2.38.2", ["numpy", "pillow>=8.3.2"]),
    ("pillow", "12.0.0", []),
    ("websockets", "16.0", []),
]


def make_wheel(folder: Path, name: str, version: str, requires, tag: str = "py3-none-any") -> Path:
    """A valid wheel with no code: METADATA, WHEEL and RECORD."""
    dist_info = f"{name}-{version}.dist-info"
    files = {
        f"{dist_info}/METADATA": "Metadata-Version: 2.1\nName: {}\nVersion: {}\n{}".format(
            name, version, "".join(f"Requires-Dist: {r}\n" for r in requires)),
        f"{dist_info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = "\n".join(record) + "\n"
    path = folder / f"{name}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as z:
        for member, text in files.items():
            z.writestr(member, text)
    return path


@pytest.fixture
def fake_carry(tmp_path):
    carry = tmp_path / "carry"
    (carry / "wheels").mkdir(parents=True)
    for name, version, requires in FAKE_WHEELS:
        make_wheel(carry / "wheels", name, version, requires)
    scene = carry / "test_colmap"
    shutil.copytree(REPO / "scenes" / "demo", scene)
    # A tenth of the SfM points: the dry run's training and step-cost phases stay quick.
    points = scene / "sparse" / "0" / "points3D.txt"
    lines = points.read_text().splitlines()
    header = [line for line in lines if line.startswith("#")]
    body = [line for line in lines if not line.startswith("#")]
    points.write_text("\n".join(header + body[:300]) + "\n")
    return carry


def run_script(*args, carry: Path, tmp_path: Path, script: Path = BUILD, out: str = "out", timeout: int = 600, **env):
    """Run a prepared GPU script here. The timeout guards against a hang, not for speed: a dry run
    trains a few steps, about two minutes on one core, and twice that beside another test."""
    environment = {**os.environ, "CARRY_DIR": str(carry), "OUT": str(tmp_path / out),
                   "GPU_DIR": str(tmp_path / "gpu"), "OMP_NUM_THREADS": "1", **env}
    return subprocess.run(["bash", str(script), *args], cwd=REPO, env=environment, capture_output=True, text=True,
                          timeout=timeout)


def check_carry(carry: Path, tmp_path: Path):
    result = run_script("--check-carry", carry=carry, tmp_path=tmp_path, timeout=60)
    return result.returncode, result.stdout + result.stderr


def test_complete_carry_passes_the_check(fake_carry, tmp_path):
    code, output = check_carry(fake_carry, tmp_path)
    assert code == 0, output
    assert "MISSING" not in output and "BAD" not in output


def test_a_missing_dependency_is_named(fake_carry, tmp_path):
    (fake_carry / "wheels" / "pillow-12.0.0-py3-none-any.whl").unlink()
    code, output = check_carry(fake_carry, tmp_path)
    assert code == 1
    assert "MISSING  pillow>=8.3.2  (needed by imageio 2.38.2; not carried)" in output
    listed = run_script("--list-missing", carry=fake_carry, tmp_path=tmp_path, timeout=60).stdout.split()
    assert listed == ["pillow>=8.3.2"]  # what prepare_carry.sh would download next


def test_a_wrong_version_or_platform_is_caught(fake_carry, tmp_path):
    (fake_carry / "wheels" / "gsplat-1.5.3-py3-none-any.whl").unlink()
    make_wheel(fake_carry / "wheels", "gsplat", "1.5.2", ["torch"])
    (fake_carry / "wheels" / "websockets-16.0-py3-none-any.whl").unlink()
    make_wheel(fake_carry / "wheels", "websockets", "16.0", [], tag="cp312-cp312-win_amd64")
    code, output = check_carry(fake_carry, tmp_path)
    assert code == 1
    assert "MISSING  gsplat==1.5.3  (needed by the project; carried 1.5.2 does not match)" in output
    assert "BAD      websockets-16.0-cp312-cp312-win_amd64.whl" in output


def dry_run(script: Path, log_name: str, passing, carry: Path, tmp_path: Path, out: str, **env) -> str:
    """Run `script --dry-run`; check it exits 0 and that each of `passing` phases passed. Returns its log."""
    result = run_script("--dry-run", carry=carry, tmp_path=tmp_path, script=script, out=out, **env)
    log_path = tmp_path / out / log_name
    log = log_path.read_text() if log_path.is_file() else ""
    assert result.returncode == 0, result.stdout[-3000:] + log[-3000:]
    summary = result.stdout[result.stdout.index("=== summary"):]
    for phase in passing:
        assert f"PASS  {phase} (" in summary, summary
    return log + summary


@pytest.mark.slow
def test_dry_runs_pass_on_cpu(fake_carry, tmp_path):
    log = dry_run(BUILD, "build.log", ("environment", "carry", "install", "cuda tests"), fake_carry, tmp_path, "build")
    build_out = tmp_path / "build"
    summary = log
    assert "SKIP  builds" in summary
    assert "dry run: CUDA builds skipped" in log and "removes its build folder" in log
    versions = (build_out / "versions.txt").read_text()
    assert "torch" in versions and "g++" in versions and "Python" in versions
    # Only the two CUDA test files were collected (and skipped: no GPU here).
    pytest_log = (build_out / "pytest_cuda.log").read_text()
    assert "skipped" in pytest_log and "test_render_cuda.py" in pytest_log and "test_turbo_cuda.py" in pytest_log
    assert "tests/test_viewer" not in pytest_log and "tests/test_bench" not in pytest_log
    # The editable install went into the git-ignored GPU folder, where call 2 finds it.
    assert (tmp_path / "gpu" / "site" / "sitecustomize.py").is_file()
    assert list((tmp_path / "gpu" / "site").glob("__editable__*turbogs*.pth"))

    log = dry_run(CHECK, "check.log", ("ready", "bench", "step cost", "outputs"), fake_carry, tmp_path, "check",
                  DRY_RUN_STEPS="4", DRY_RUN_RESOLUTION="1")
    out = tmp_path / "check"
    assert "call 1's install and builds found" in log

    bench = json.loads((out / "bench" / "bench.json").read_text())
    native = raster_cpu.load(log=lambda message: None)  # on the CPU: our C++ compositing where it builds
    assert bench["device"] == "cpu" and bench["backend"] == ("cpu-native" if native else "torch")
    assert bench["mode"] == {"steps": 4} and bench["image_size"] == [128, 96]
    assert set(bench["presets"]) == {"turbo", "3dgs"}  # 3dgs@7000 kept to the dry run's steps
    assert all(entry["steps"] == 4 for entry in bench["presets"].values())
    assert cv2.imread(str(out / "bench" / "psnr_vs_time.png")) is not None
    assert json.loads((out / "bench" / "step_cost.json").read_text())["device"] == "cpu"
    profile = (out / "bench" / "profile.txt").read_text()
    assert "self_cpu_time_total" in profile and "== one whole training step (turbo," in profile
    # Only the few files the device tool brings back, from each call.
    for folder in (build_out, out):
        files = [p for p in folder.rglob("*") if p.is_file()]
        assert len(files) <= 8 and all(len(p.relative_to(folder).parts) <= 2 for p in files)


@pytest.mark.slow
def test_check_builds_first_on_a_machine_call_1_did_not_prepare(fake_carry, tmp_path):
    """A fresh machine for call 2 (the warm one was given back): it installs before the bench."""
    log = dry_run(CHECK, "check.log", ("ready", "bench"), fake_carry, tmp_path, "check",
                  DRY_RUN_STEPS="2", DRY_RUN_RESOLUTION="1")
    assert "installing and building now" in log
    assert (tmp_path / "gpu" / "site" / "sitecustomize.py").is_file()
