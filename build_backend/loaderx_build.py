"""PEP 517 backend: compile the Zig core, then let setuptools package it.

Every build (wheel, sdist-free `pip install .`, and editable
`pip install -e .`) first runs `python -m ziglang build` and copies
`libloaderx.so` into `src/loaderx/`, where the package loads it from.
The Zig compiler comes from the pinned `ziglang` wheel in
`[build-system] requires`; libzstd is the system's `libzstd.so.1`.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import build_meta as _setuptools

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "loaderx"
ZSTD_SEARCH = (
    "/usr/lib/x86_64-linux-gnu",
    "/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/lib64",
    "/usr/lib",
    "/lib",
    "/usr/local/lib",
)


def find_zstd() -> str:
    """Return the path of the system libzstd.so.1 or fail with what to install."""
    override = os.environ.get("LOADERX_ZSTD")
    if override:
        return override
    for directory in ZSTD_SEARCH:
        candidate = Path(directory) / "libzstd.so.1"
        if candidate.exists():
            return str(candidate)
    raise RuntimeError(
        "loaderx needs the system zstd library (libzstd.so.1) and found none in "
        f"{', '.join(ZSTD_SEARCH)}. Install it (Debian/Ubuntu: apt-get install libzstd1; "
        "Fedora: dnf install libzstd) or set LOADERX_ZSTD to its path."
    )


def build_native() -> None:
    """Compile zig/ into src/loaderx/libloaderx.so (ReleaseFast)."""
    prefix = ROOT / "zig-out"
    command = [
        sys.executable, "-m", "ziglang", "build",
        f"-Dzstd={find_zstd()}",
        "--prefix", str(prefix),
    ]
    subprocess.run(command, cwd=ROOT, check=True)
    # Replace the library by rename, never in place: a running process that
    # mapped the old file must keep reading the old bytes.
    staging = PACKAGE / ".libloaderx.so.new"
    shutil.copy2(prefix / "lib" / "libloaderx.so", staging)
    os.replace(staging, PACKAGE / "libloaderx.so")


if __name__ == "__main__":
    build_native()


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    build_native()
    return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    build_native()
    return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)


get_requires_for_build_wheel = _setuptools.get_requires_for_build_wheel
get_requires_for_build_editable = _setuptools.get_requires_for_build_editable
get_requires_for_build_sdist = _setuptools.get_requires_for_build_sdist
prepare_metadata_for_build_wheel = _setuptools.prepare_metadata_for_build_wheel
prepare_metadata_for_build_editable = _setuptools.prepare_metadata_for_build_editable
build_sdist = _setuptools.build_sdist
