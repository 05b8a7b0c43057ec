"""PEP 517 backend: compile the Zig core, then let setuptools package it.

Every build (wheel, sdist-free `pip install .`, and editable
`pip install -e .`) first runs `python -m ziglang build` and copies the
library into `src/loaderx/`, where the package loads it from. The Zig
compiler comes from the pinned `ziglang` wheel in `[build-system] requires`;
libzstd and liblz4 are the system's `libzstd.so.1` and `liblz4.so.1`.

The library is built for a portable CPU and glibc floor, never for the build
machine: on x86-64 once for the baseline (`libloaderx.so`) and once per
faster level (`libloaderx-x86_64_v3.so`, `-x86_64_v4.so`), which
`loaderx/_native.py` picks from at import; glibc symbols are those of
GLIBC_FLOOR. The wheel is therefore tagged `py3-none-manylinux_2_17_<arch>`:
the library does not use the Python C API, so one wheel serves every Python.
LOADERX_ARCH=aarch64 (with LOADERX_ZSTD and LOADERX_LZ4 pointing at an
aarch64 libzstd.so.1 and liblz4.so.1) cross-compiles.
"""

import base64
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from setuptools import build_meta as _setuptools

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "loaderx"
# The oldest glibc whose symbols the library may use: Zig links against its
# own stubs of this version, so a newer symbol fails the build, not the user.
GLIBC_FLOOR = "2.17"
# Each build: (name `_native.py` knows it by, Zig CPU model). The first is the
# portable baseline and is the only one on other architectures.
X86_64_BUILDS = (("baseline", "x86_64"), ("x86_64_v3", "x86_64_v3"), ("x86_64_v4", "x86_64_v4"))
OTHER_BUILDS = (("baseline", "baseline"),)


def library_search(arch: str) -> tuple:
    """Where a system library for `arch` may be: its multiarch directories, then
    (native builds) the generic ones."""
    multiarch = (f"/usr/lib/{arch}-linux-gnu", f"/lib/{arch}-linux-gnu")
    if arch != platform.machine().lower():
        return multiarch
    return multiarch + ("/usr/lib64", "/lib64", "/usr/lib", "/lib", "/usr/local/lib")


# The system libraries the core links by path: (file, environment override,
# what to install). liblz4 comes with systemd, so it is wherever libzstd is.
SYSTEM_LIBRARIES = {
    "zstd": (
        "libzstd.so.1",
        "LOADERX_ZSTD",
        "Debian/Ubuntu: apt-get install libzstd1; Fedora: dnf install libzstd",
    ),
    "lz4": (
        "liblz4.so.1",
        "LOADERX_LZ4",
        "Debian/Ubuntu: apt-get install liblz4-1; Fedora: dnf install lz4-libs",
    ),
}


def find_library(name: str, arch: str = "") -> str:
    """Return the path of system library `name` ("zstd" or "lz4") for `arch`
    (default: the target's) or fail with what to install."""
    file_name, variable, install = SYSTEM_LIBRARIES[name]
    override = os.environ.get(variable)
    if override:
        return override
    arch = arch or target_arch()
    search = library_search(arch)
    for directory in search:
        candidate = Path(directory) / file_name
        if candidate.exists():
            return str(candidate)
    raise RuntimeError(
        f"loaderx needs the system {name} library ({file_name}) for {arch} and found none in "
        f"{', '.join(search)}. Install it ({install}) or set {variable} to its path."
    )


def find_zstd(arch: str = "") -> str:
    """The system libzstd.so.1 for `arch` (see find_library)."""
    return find_library("zstd", arch)


def find_lz4(arch: str = "") -> str:
    """The system liblz4.so.1 for `arch` (see find_library)."""
    return find_library("lz4", arch)


def library_flags(arch: str = "") -> list:
    """The `zig build` options that name the system libraries for `arch`."""
    return [f"-D{name}={find_library(name, arch)}" for name in SYSTEM_LIBRARIES]


def target_arch() -> str:
    """The architecture to build for: LOADERX_ARCH, else this machine's."""
    arch = os.environ.get("LOADERX_ARCH") or platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(arch, arch)


def library_name(variant: str) -> str:
    """The file name of one build; `_native.library_path` mirrors it."""
    return "libloaderx.so" if variant == "baseline" else f"libloaderx-{variant}.so"


def build_native() -> None:
    """Compile zig/ into src/loaderx/libloaderx*.so (ReleaseFast, stripped), one per CPU level."""
    arch = target_arch()
    builds = X86_64_BUILDS if arch == "x86_64" else OTHER_BUILDS
    for stale in PACKAGE.glob("libloaderx*.so"):
        if stale.name not in {library_name(variant) for variant, _ in builds}:
            stale.unlink()
    for variant, cpu in builds:
        prefix = ROOT / "zig-out" / variant
        command = [
            sys.executable,
            "-m",
            "ziglang",
            "build",
            f"-Dtarget={arch}-linux-gnu.{GLIBC_FLOOR}",
            f"-Dcpu={cpu}",
            "-Dstrip=true",
            *library_flags(arch),
            "--prefix",
            str(prefix),
        ]
        subprocess.run(command, cwd=ROOT, check=True)
        # Replace the library by rename, never in place: a running process that
        # mapped the old file must keep reading the old bytes.
        staging = PACKAGE / f".{library_name(variant)}.new"
        shutil.copy2(prefix / "lib" / "libloaderx.so", staging)
        os.replace(staging, PACKAGE / library_name(variant))


def retag_wheel(wheel_directory: str, name: str, tag: str) -> str:
    """Rewrite the setuptools wheel `name` as a platform wheel with `tag`; return the new name.

    setuptools only knows pure wheels (our library is package data, not an
    extension module), so its WHEEL file says purelib and py3-none-any.
    """
    source = Path(wheel_directory) / name
    distribution, version = name.split("-")[:2]
    target = source.with_name(f"{distribution}-{version}-{tag}.whl")
    wheel_info = f"{distribution}-{version}.dist-info/WHEEL"
    record = f"{distribution}-{version}.dist-info/RECORD"
    with zipfile.ZipFile(source) as old:
        wheel_text = old.read(wheel_info).decode()
        kept = [
            line
            for line in wheel_text.splitlines()
            if line and not line.startswith(("Root-Is-Purelib:", "Tag:"))
        ]
        wheel_bytes = ("\n".join(kept + ["Root-Is-Purelib: false", f"Tag: {tag}"]) + "\n").encode()
        digest = (
            base64.urlsafe_b64encode(hashlib.sha256(wheel_bytes).digest()).rstrip(b"=").decode()
        )
        record_lines = [
            f"{wheel_info},sha256={digest},{len(wheel_bytes)}"
            if line.startswith(wheel_info + ",")
            else line
            for line in old.read(record).decode().splitlines()
        ]
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as new:
            for item in old.infolist():
                if item.filename == wheel_info:
                    new.writestr(item, wheel_bytes)
                elif item.filename == record:
                    new.writestr(item, "\n".join(record_lines) + "\n")
                else:
                    new.writestr(item, old.read(item))
    source.unlink()
    return target.name


def emit_ffi() -> None:
    """Write src/loaderx/_ffi.py: the C declarations of `_abi.h` parsed now,
    by cffi's out-of-line ABI mode, so that import does not parse C (80 ms
    here). It records a hash of the header it came from; `_native.py` parses
    the header itself when they differ or cffi cannot load the module."""
    import cffi

    header = (PACKAGE / "_abi.h").read_bytes()
    builder = cffi.FFI()
    builder.cdef(header.decode())
    builder.set_source("loaderx._ffi", None)
    staging = PACKAGE / "._ffi.py.new"
    builder.emit_python_code(str(staging))
    with open(staging, "a", encoding="ascii") as module:
        module.write(f"\nABI_SHA256 = {hashlib.sha256(header).hexdigest()!r}\n")
    os.replace(staging, PACKAGE / "_ffi.py")


def build_all() -> None:
    """Everything the package loads that a build makes."""
    build_native()
    emit_ffi()


if __name__ == "__main__":
    build_all()


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    build_all()
    # setuptools reuses build/lib: a library left there by an older build
    # (another architecture, a dropped CPU level) would ride along.
    shutil.rmtree(ROOT / "build", ignore_errors=True)
    name = _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)
    tag = f"py3-none-manylinux_{GLIBC_FLOOR.replace('.', '_')}_{target_arch()}"
    return retag_wheel(wheel_directory, name, tag)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    build_all()
    return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)


get_requires_for_build_wheel = _setuptools.get_requires_for_build_wheel
get_requires_for_build_editable = _setuptools.get_requires_for_build_editable
get_requires_for_build_sdist = _setuptools.get_requires_for_build_sdist
prepare_metadata_for_build_wheel = _setuptools.prepare_metadata_for_build_wheel
prepare_metadata_for_build_editable = _setuptools.prepare_metadata_for_build_editable
build_sdist = _setuptools.build_sdist
