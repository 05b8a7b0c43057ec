"""zrecord's power-loss and fault simulation, and the store's crash and
corruption suites against a ReleaseSafe build (Zig's assertions checked).

The simulation (zig/testing/simulation.zig) runs seeded workloads on the
simulated disk of zig/testing/storage.zig: power lost at every I/O call,
and EIO, ENOSPC, short writes and failed syncs at every call of each kind.
LOADERX_SIM_SCALE multiplies the workloads (4 here, 80 in the soak run);
a failure prints the seed to replay with LOADERX_SIM_SEED.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "build_backend"))
from loaderx_build import library_flags  # noqa: E402


def run_simulation(tmp_path: Path, scale: int) -> dict:
    report = tmp_path / "simulation.json"
    env = {**os.environ, "LOADERX_SIM_SCALE": str(scale), "LOADERX_SIM_REPORT": str(report)}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ziglang",
            "build",
            "test",
            "-Doptimize=ReleaseSafe",
            *library_flags(),
            "--summary",
            "all",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3600,
        env=env,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    assert report.exists(), "the simulation did not run (or did not report its counts)"
    counts = json.loads(report.read_text())
    print(f"simulation at scale {scale}: {counts}")
    return counts


def test_power_loss_and_faults_at_every_call(tmp_path):
    """At least 5,000 simulated power losses and 5,000 injected faults, each
    followed by the checks of zig/testing/simulation.zig, all pass."""
    counts = run_simulation(tmp_path, 4)
    assert counts["power_losses"] >= 5000
    assert counts["faults"] >= 5000


@pytest.mark.soak
def test_power_loss_and_faults_soak(tmp_path):
    """The soak size: at least 200,000 power losses and 200,000 faults."""
    counts = run_simulation(tmp_path, int(os.environ.get("LOADERX_SIM_SOAK_SCALE", "80")))
    assert counts["power_losses"] >= 200_000
    assert counts["faults"] >= 200_000


def test_crash_and_corruption_suites_pass_on_a_release_safe_build(tmp_path):
    """The SIGKILL and damaged-store suites, again, against the library built
    with -Doptimize=ReleaseSafe: any assertion the hostile inputs trip in the
    core aborts the worker and fails them."""
    prefix = tmp_path / "safe"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "ziglang",
            "build",
            "-Doptimize=ReleaseSafe",
            *library_flags(),
            "--prefix",
            str(prefix),
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=900,
    )
    library = prefix / "lib" / "libloaderx.so"
    env = {**os.environ, "LOADERX_LIBRARY": str(library)}
    probe = subprocess.run(
        [sys.executable, "-c", "from loaderx import _native; print(_native._LIBRARY)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip() == str(library)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(ROOT / "tests" / "test_crash.py"),
            str(ROOT / "tests" / "test_corruption.py"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    assert " passed" in result.stdout
