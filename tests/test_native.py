"""The Zig core's own unit tests, and the ABI checks between Zig and _abi.h."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from loaderx import _native

ROOT = Path(__file__).resolve().parent.parent


def test_zig_unit_tests_pass():
    """`zig build test` (every inline test in zig/) passes in Debug with safety checks on."""
    sys.path.insert(0, str(ROOT / "build_backend"))
    from loaderx_build import library_flags

    # The power-loss simulation runs in tests/test_simulation.py (ReleaseSafe).
    env = {**os.environ, "LOADERX_SIM_SCALE": "0"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ziglang",
            "build",
            "test",
            "-Doptimize=Debug",
            *library_flags(),
            "--summary",
            "all",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tests passed" in result.stdout + result.stderr


def test_library_reports_the_abi_version_python_expects():
    """A stale library would be refused at import; this one matches."""
    assert _native.lib.lx_version() == _native.ABI_VERSION


def test_import_uses_the_declarations_the_build_parsed():
    """The build writes `_ffi.py` from `_abi.h` (cffi's out-of-line mode), so
    import parses no C; the module records which header it came from."""
    import importlib

    built = importlib.import_module("loaderx._ffi")
    assert _native.ffi is built.ffi


@pytest.mark.parametrize("broken", ["missing", "stale"])
def test_a_missing_or_stale_prebuilt_ffi_falls_back_to_parsing_the_header(monkeypatch, broken):
    import types

    def import_module(name):
        if broken == "missing":
            raise ImportError(name)
        return types.SimpleNamespace(ABI_SHA256="0" * 64, ffi=None)

    monkeypatch.setattr(_native.importlib, "import_module", import_module)
    parsed = _native._load_ffi()
    assert parsed is not _native.ffi
    library = parsed.dlopen(str(_native._LIBRARY))
    assert library.lx_version() == _native.ABI_VERSION


def test_struct_sizes_agree_between_zig_and_cdef():
    """The cdef's structs have the sizes the library was compiled with."""
    assert _native.lib.lx_store_info_bytes() == _native.ffi.sizeof("lx_store_info")
    assert _native.lib.lx_sampler_blocks_bytes() == _native.ffi.sizeof("lx_sampler_blocks")


def test_status_codes_match_the_zig_enum():
    """Every status code of zig/status.zig has an exception class, and no other."""
    source = (ROOT / "zig" / "status.zig").read_text()
    enum = source.split("pub const Code = enum(c_int) {")[1].split("};")[0]
    codes = {}
    for line in enum.strip().splitlines():
        name, value = line.strip().rstrip(",").split(" = ")
        codes[int(value)] = name
    del codes[0]
    assert {code: name for code, (name, _cls) in _native.CODES.items()} == codes


def test_only_the_io_seam_touches_the_file_system():
    """No Zig file but io.zig (and the simulator under zig/testing/) calls
    std.fs, std.posix or std.os: every file-system call goes through the seam
    the power-loss simulation attacks."""
    import re

    forbidden = re.compile(r"\bstd\.(fs|posix|os)\b|@import\(\"std\"\)\.(fs|posix|os)\b")
    offenders = []
    for path in sorted((ROOT / "zig").glob("*.zig")):
        if path.name == "io.zig":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("//", 1)[0]
            if forbidden.search(code):
                offenders.append(f"{path.name}:{number}: {line.strip()}")
    assert not offenders, "file-system calls outside zig/io.zig:\n" + "\n".join(offenders)
    # The check can fail: the seam itself is caught by it.
    assert any(
        forbidden.search(line.split("//", 1)[0])
        for line in (ROOT / "zig" / "io.zig").read_text().splitlines()
    )


def test_limits_come_from_the_core():
    """The limits Python enforces are the ones zig/format.zig and
    zig/sampler.zig define (read through lx_limits, not written twice)."""
    from loaderx import converter, sampler, zrecord

    assert _native.ffi.sizeof("lx_limits_t") == 48  # zig/root.zig asserts the same
    format_source = (ROOT / "zig" / "format.zig").read_text()
    assert "pub const record_bytes_max: u64 = 1 << 48;" in format_source
    assert zrecord.MAX_RECORD_LEN == _native.LIMITS["record_bytes_max"] == 1 << 48
    assert converter.DICT_BYTES_MIN == _native.LIMITS["dict_bytes_min"] == 256
    assert converter.DICT_BYTES_MAX == _native.LIMITS["dict_bytes_max"] == 16 << 20
    assert sampler.LENGTH_MAX == _native.LIMITS["sampler_length_max"] == 1 << 63
    assert sampler.GROUPS_MAX == _native.LIMITS["sampler_groups_max"] == 1 << 20


def test_the_same_mistake_raises_the_same_class_in_either_layer(tmp_path):
    """An index out of range is a ZrecordError and an IndexError whether
    Python (a negative index) or the core (past the end) notices it; a bad
    argument is a ZrecordError and a ValueError either way."""
    from loaderx.zrecord import IndexOutOfRangeError, InvalidArgumentError, Zrecord, ZrecordError

    with Zrecord(tmp_path / "s", codec="raw") as store:
        store.append(b"abcd", [0, 2])
        buffer = bytearray(2)
        for bad in ([-1], [5]):  # Python sees the first, the core the second
            try:
                store.gather(bad, buffer, [0])
            except IndexOutOfRangeError as exc:
                assert isinstance(exc, ZrecordError) and isinstance(exc, IndexError)
            else:
                raise AssertionError(f"gather({bad}) did not raise")
        mistakes = [
            lambda: store.append(b"abcd", [3, 1]),  # Python: offsets decrease
            lambda: store.train_dict(b"x" * 1000, [1000], 8),  # the core: dictionary size
        ]
        for mistake in mistakes:
            try:
                mistake()
            except InvalidArgumentError as exc:
                assert isinstance(exc, ZrecordError) and isinstance(exc, ValueError)
            else:
                raise AssertionError("no error raised")
