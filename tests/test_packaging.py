"""Distribution: the CPU-level pick, portable libraries, wheel and sdist round trips.

Tests marked ``slow`` (several minutes: fresh venvs, full builds, emulation)
are skipped unless LOADERX_SLOW=1 is set; CI sets it:
``LOADERX_SLOW=1 python -m pytest -m slow tests/test_packaging.py``.
"""

import base64
import csv
import hashlib
import importlib.metadata
import os
import platform
import shutil
import struct
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from loaderx import _native

ROOT = Path(__file__).resolve().parent.parent
SMOKE = Path(__file__).resolve().parent / "native_smoke.py"
GLIBC_FLOOR = (2, 17)
ON_X86_64 = platform.machine().lower() in ("x86_64", "amd64")


def slow(test):
    """Mark a test slow: it runs only with LOADERX_SLOW=1."""
    skip = pytest.mark.skipif(
        os.environ.get("LOADERX_SLOW") != "1", reason="slow test: set LOADERX_SLOW=1 to run"
    )
    return pytest.mark.slow(skip(test))


# -- reading ELF files (no binutils needed) ---------------------------------------


def elf_sections(data: bytes) -> list:
    """(name, type, offset, size, link, info) of each section of a 64-bit little-endian ELF file."""
    assert data[:6] == b"\x7fELF\x02\x01", "not a 64-bit little-endian ELF file"
    (section_offset,) = struct.unpack_from("<Q", data, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    headers = [
        struct.unpack_from("<IIQQQQIIQQ", data, section_offset + i * entry_size)
        for i in range(count)
    ]
    names_offset = headers[names_index][4]
    return [
        (c_string(data, names_offset + name), kind, offset, size, link, info)
        for name, kind, _, _, offset, size, link, info, _, _ in headers
    ]


def c_string(data: bytes, start: int) -> str:
    return data[start : data.index(b"\0", start)].decode()


def glibc_versions(path: Path) -> set:
    """The GLIBC_x.y symbol versions the library needs (its .gnu.version_r entries)."""
    data = path.read_bytes()
    sections = elf_sections(data)
    _, _, offset, _, link, count = next(
        section for section in sections if section[0] == ".gnu.version_r"
    )
    strings_offset = sections[link][2]
    versions = set()
    for _ in range(count):
        _, aux_count, _, aux, following = struct.unpack_from("<HHIII", data, offset)
        position = offset + aux
        for _ in range(aux_count):
            _, _, _, name, aux_next = struct.unpack_from("<IHHII", data, position)
            text = c_string(data, strings_offset + name)
            if text.startswith("GLIBC_"):
                versions.add(tuple(int(part) for part in text[6:].split(".")))
            position += aux_next
        offset += following
    return versions


def bundled_libraries(directory: Path) -> list:
    return sorted(directory.glob("libloaderx*.so"))


def assert_portable(library: Path) -> None:
    """Stripped, and no glibc symbol newer than the floor the wheel's tag promises."""
    sections = {section[0] for section in elf_sections(library.read_bytes())}
    assert ".symtab" not in sections and ".debug_info" not in sections, (
        f"{library.name} is not stripped"
    )
    newest = max(glibc_versions(library))
    assert newest <= GLIBC_FLOOR, f"{library.name} needs GLIBC_{'.'.join(map(str, newest))}"


# -- the pick at import -------------------------------------------------------------


V3_FLAGS = frozenset(_native.CPU_LEVELS["x86_64_v3"])
V4_FLAGS = frozenset(_native.CPU_LEVELS["x86_64_v4"])


@pytest.mark.skipif(not ON_X86_64, reason="CPU levels exist on x86-64 only")
def test_pick_takes_the_best_level_the_cpu_reports():
    """AVX-512 flags pick v4, AVX2 flags v3, an older CPU (or no /proc/cpuinfo) the baseline."""
    assert _native.pick_variant(V4_FLAGS | {"sse2"}, None) == "x86_64_v4"
    assert _native.pick_variant(V3_FLAGS | {"avx512f"}, None) == "x86_64_v3"
    assert _native.pick_variant(V3_FLAGS - {"fma"}, None) == _native.BASELINE
    assert _native.pick_variant(frozenset(), None) == _native.BASELINE


def test_override_forces_a_build_and_refuses_what_the_cpu_lacks():
    """LOADERX_CPU picks a build; a level whose instructions are missing, or a build not bundled, is
    refused."""
    assert _native.pick_variant(V4_FLAGS, "baseline") == _native.BASELINE
    with pytest.raises(ImportError, match=r"LOADERX_CPU=x86_64_v4 asks for instructions.*avx512f"):
        _native.pick_variant(V3_FLAGS, "x86_64_v4")
    with pytest.raises(
        ImportError, match=r"no libloaderx-pentium4\.so; it has builds for baseline"
    ):
        _native.pick_variant(V4_FLAGS, "pentium4")


@pytest.mark.skipif(not ON_X86_64, reason="CPU levels exist on x86-64 only")
def test_install_carries_every_level_and_loaded_the_best():
    """The build made all three libraries, all portable, and import loaded the best this CPU
    runs."""
    libraries = bundled_libraries(_native.library_path(_native.BASELINE).parent)
    assert [library.name for library in libraries] == [
        "libloaderx-x86_64_v3.so",
        "libloaderx-x86_64_v4.so",
        "libloaderx.so",
    ]
    for library in libraries:
        assert_portable(library)
    if "LOADERX_CPU" not in os.environ:
        assert _native.pick_variant(_native.cpu_flags(), None) == _native.VARIANT


def smoke(
    variant: str, *prefix: str, env_python: str = sys.executable
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*prefix, env_python, str(SMOKE)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "LOADERX_CPU": variant},
    )


def runnable_variants() -> list:
    flags = _native.cpu_flags()
    return [_native.BASELINE] + [
        name for name, needed in _native.CPU_LEVELS.items() if needed <= flags
    ]


def test_every_level_this_cpu_runs_gives_the_same_results():
    """Each bundled build passes the smoke script and prints the same digest of sampler and loader
    output."""
    digests = set()
    for variant in runnable_variants():
        result = smoke(variant)
        assert result.returncode == 0, f"{variant}: {result.stderr}"
        assert result.stdout.split()[:3] == ["smoke", "ok", variant]
        digests.add(result.stdout.split()[3])
    assert len(digests) == 1, digests


# -- an emulated CPU without AVX ----------------------------------------------------


@pytest.mark.skipif(not ON_X86_64, reason="the emulated-CPU test is for x86-64")
@pytest.mark.skipif(
    shutil.which("qemu-x86_64") is None,
    reason="qemu-x86_64 is not installed (Debian/Ubuntu: apt-get install qemu-user)",
)
@slow
def test_baseline_runs_on_a_cpu_without_avx():
    """Under qemu emulating a Nehalem (SSE4.2, no AVX), the baseline build passes the smoke script.

    qemu-user shows the host's /proc/cpuinfo, so the pick is forced with
    LOADERX_CPU. The v3 build must die there with SIGILL: that proves the
    emulated CPU really lacks AVX2, so the baseline's pass means something.
    """
    emulated = ("qemu-x86_64", "-cpu", "Nehalem")
    # The smoke script needs NumPy: a NumPy wheel built for newer CPUs dies
    # on the emulated one before loaderx loads, which says nothing of loaderx.
    numpy_only = subprocess.run(
        [*emulated, sys.executable, "-c", "import numpy"], capture_output=True, timeout=600
    )
    if numpy_only.returncode in (-4, 128 + 4):
        version = importlib.metadata.version("numpy")
        pytest.skip(
            f"NumPy {version} here dies with SIGILL on an emulated Nehalem before loaderx loads: "
            "the baseline build cannot be checked with this NumPy"
        )
    native = smoke(_native.BASELINE)
    result = smoke(_native.BASELINE, *emulated)
    assert result.returncode == 0, result.stderr
    assert result.stdout == native.stdout
    if "avx2" in _native.cpu_flags():
        control = smoke("x86_64_v3", *emulated)
        assert control.returncode == -4 or control.returncode == 128 + 4, (
            control.returncode,
            control.stderr,
        )


# -- sdist and wheel round trips -----------------------------------------------------


SDIST_NEEDS = (
    "LICENSE",
    "README.md",
    "pyproject.toml",
    "build.zig",
    "build_backend/loaderx_build.py",
    "zig/root.zig",
    "examples/quickstart.py",
    "tests/conftest.py",
    "src/loaderx/_abi.h",
    "src/loaderx/py.typed",
    "mkdocs.yml",
    "docs/index.md",
)


@pytest.fixture(scope="module")
def artefacts(tmp_path_factory) -> dict:
    """`python -m build`: the sdist from this checkout, then the wheel from that sdist."""
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return {"sdist": next(out.glob("loaderx-*.tar.gz")), "wheel": next(out.glob("loaderx-*.whl"))}


def wheel_tag() -> str:
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(
        platform.machine().lower(), platform.machine().lower()
    )
    return f"py3-none-manylinux_{GLIBC_FLOOR[0]}_{GLIBC_FLOOR[1]}_{arch}"


@slow
def test_sdist_holds_what_a_build_needs_and_no_binaries(artefacts):
    """The sdist has the backend, Zig sources, examples, tests and LICENSE, and no prebuilt
    library."""
    with tarfile.open(artefacts["sdist"]) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    missing = [name for name in SDIST_NEEDS if name not in names]
    assert not missing, missing
    assert not [name for name in names if name.endswith(".so")]


@slow
def test_wheel_is_a_portable_platform_wheel(artefacts, tmp_path):
    """Tagged py3-none-manylinux_2_17_<arch>, not purelib, RECORD hashes right, libraries stripped
    and portable."""
    wheel = artefacts["wheel"]
    assert wheel.name == f"loaderx-{_version()}-{wheel_tag()}.whl"
    with zipfile.ZipFile(wheel) as archive:
        info = next(name for name in archive.namelist() if name.endswith(".dist-info/WHEEL"))
        lines = archive.read(info).decode().splitlines()
        assert "Root-Is-Purelib: false" in lines and f"Tag: {wheel_tag()}" in lines
        record = next(name for name in archive.namelist() if name.endswith(".dist-info/RECORD"))
        for name, digest, size in csv.reader(archive.read(record).decode().splitlines()):
            if name != record:
                data = archive.read(name)
                expected = (
                    base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                )
                assert (digest, int(size)) == (f"sha256={expected}", len(data)), name
        assert any(name.endswith(".dist-info/licenses/LICENSE") for name in archive.namelist())
        assert "loaderx/py.typed" in archive.namelist()  # PEP 561: the package is typed
        archive.extractall(tmp_path)
    libraries = bundled_libraries(tmp_path / "loaderx")
    assert len(libraries) == (3 if ON_X86_64 else 1)
    for library in libraries:
        assert_portable(library)


def _version() -> str:
    from loaderx import __version__

    return __version__


@slow
@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_artefact_installs_in_a_fresh_venv_and_runs_the_quick_start(artefacts, kind, tmp_path):
    """pip install of the built wheel / the sdist (which builds) in a new venv, then
    examples/quickstart.py."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    install = subprocess.run(
        [python, "-m", "pip", "install", str(artefacts[kind])],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert install.returncode == 0, install.stdout[-4000:] + install.stderr[-4000:]
    where = subprocess.run(
        [python, "-c", "import loaderx; print(loaderx.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert where.stdout.startswith(str(venv)), where.stdout + where.stderr
    result = subprocess.run(
        [python, str(ROOT / "examples" / "quickstart.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert "data batch: (256, 32, 32, 3) uint8" in result.stdout
