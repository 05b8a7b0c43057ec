"""Loads the bundled native library and turns its status codes into exceptions.

The cdef is read from ``_abi.h`` (the one declaration of the C ABI); the
library reports its ABI version and a stale build is refused at import.

On x86-64 the package carries one build of the library per instruction-set
level: ``libloaderx.so`` for the x86-64 baseline (runs on any x86-64 CPU) and
``libloaderx-x86_64_v3.so`` (AVX2) / ``libloaderx-x86_64_v4.so`` (AVX-512).
Zig has no per-function target attributes, so the choice is made once, here:
the highest level whose instructions the CPU and kernel report in
/proc/cpuinfo. ``LOADERX_CPU=baseline`` (or a level name) overrides the pick.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import platform
from pathlib import Path
from typing import Any

# Imported here although only a missing or stale `_ffi` needs it: it costs about 2 ms of
# loaderx's ~300 ms import.
import cffi

from ._errors import StoreFullError, StoreOSError, StoreReadOnlyError, ZrecordError, class_for_errno

ABI_VERSION = 7

_HERE = Path(__file__).resolve().parent
_REBUILD = (
    "Rebuild it from the source checkout with `pip install -e .` "
    "(or `python build_backend/loaderx_build.py`)."
)
BASELINE = "baseline"

# The /proc/cpuinfo flags each x86-64 level needs (its psABI definition, with
# the kernel's names: `abm` is LZCNT), best level first.
_X86_64_V2 = {"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"}
_X86_64_V3 = _X86_64_V2 | {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}
_X86_64_V4 = _X86_64_V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
CPU_LEVELS = {"x86_64_v4": _X86_64_V4, "x86_64_v3": _X86_64_V3}


def library_path(variant: str) -> Path:
    """The file of one build of the library: the baseline is `libloaderx.so`."""
    if variant == BASELINE:
        return _HERE / "libloaderx.so"
    return _HERE / f"libloaderx-{variant}.so"


def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags as the kernel reports them (empty if unknown)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def pick_variant(flags: frozenset[str], requested: str | None) -> str:
    """The build to load: `requested` (LOADERX_CPU) if set, else the best
    bundled one the CPU runs."""
    if requested:
        missing = sorted(CPU_LEVELS.get(requested, set()) - flags)
        if missing:
            raise ImportError(
                f"LOADERX_CPU={requested} asks for instructions this CPU does not report "
                f"({', '.join(missing)}): loading it would crash with SIGILL. "
                f"Unset LOADERX_CPU or set LOADERX_CPU={BASELINE}."
            )
        if not library_path(requested).exists():
            bundled = [BASELINE] + [name for name in CPU_LEVELS if library_path(name).exists()]
            raise ImportError(
                f"LOADERX_CPU={requested}: this install has no {library_path(requested).name}; "
                f"it has builds for {', '.join(bundled)}."
            )
        return requested
    if platform.machine().lower() in ("x86_64", "amd64"):
        for name, needed in CPU_LEVELS.items():
            if needed <= flags and library_path(name).exists():
                return name
    return BASELINE


VARIANT = pick_variant(cpu_flags(), os.environ.get("LOADERX_CPU"))
# LOADERX_LIBRARY loads another build of the same source (the tests run the
# crash and corruption suites against a ReleaseSafe build this way).
_LIBRARY = Path(os.environ.get("LOADERX_LIBRARY") or library_path(VARIANT))


def _load_ffi() -> Any:
    """The C declarations of ``_abi.h``: pre-parsed by the build into
    ``_ffi.py`` (cffi's out-of-line ABI mode; parsing them here costs 80 ms
    of import), or parsed now when that module is missing, stale (built
    from another header) or of a cffi this one cannot load."""
    header = (_HERE / "_abi.h").read_bytes()
    try:
        built = importlib.import_module(f"{__package__}._ffi")
        if hashlib.sha256(header).hexdigest() == built.ABI_SHA256:
            return built.ffi
    except Exception:  # noqa: BLE001 - any failure means: parse the header instead
        pass
    parsed = cffi.FFI()
    parsed.cdef(header.decode())
    return parsed


ffi = _load_ffi()

if not _LIBRARY.exists():
    raise ImportError(f"loaderx's native library is missing: {_LIBRARY} does not exist. {_REBUILD}")
try:
    # RTLD_NODELETE: the native worker threads outlive the interpreter's
    # teardown, so the library must stay mapped until the process exits.
    lib = ffi.dlopen(str(_LIBRARY), ffi.RTLD_NOW | ffi.RTLD_NODELETE)
except OSError as exc:
    raise ImportError(
        f"loaderx could not load its native library {_LIBRARY}: {exc}. {_REBUILD}"
    ) from exc
if lib.lx_version() != ABI_VERSION:
    raise ImportError(
        f"loaderx's native library {_LIBRARY} has ABI version {lib.lx_version()}, "
        f"but this Python package needs version {ABI_VERSION}: the build is stale. {_REBUILD}"
    )


class InvalidArgumentError(ZrecordError, ValueError):
    """A call got an argument it cannot take (a bad offset, size, codec...)."""


class IndexOutOfRangeError(ZrecordError, IndexError):
    """An index outside ``0..len-1`` (or a negative one)."""


class StoreLockedError(ZrecordError):
    """Another process (or another open handle) is writing to this store."""


class CorruptStoreError(ZrecordError):
    """The store's files are damaged, truncated or not a store of this format."""


class ChecksumError(CorruptStoreError):
    """A record's bytes do not match its checksum."""


class NoDictionaryError(ZrecordError):
    """Codec ``zstd_dict`` was asked for but the store has no trained dictionary."""


# The status codes of zig/status.zig, in order.
CODES = {
    1: ("invalid_argument", InvalidArgumentError),
    2: ("index_out_of_range", IndexOutOfRangeError),
    3: ("io", ZrecordError),
    4: ("corrupt", CorruptStoreError),
    5: ("checksum_mismatch", ChecksumError),
    6: ("locked", StoreLockedError),
    7: ("read_only", StoreReadOnlyError),
    8: ("no_space", StoreFullError),
    9: ("out_of_memory", ZrecordError),
    10: ("not_a_store", CorruptStoreError),
    11: ("unsupported_version", CorruptStoreError),
    12: ("codec", ZrecordError),
    13: ("no_dictionary", NoDictionaryError),
    14: ("too_large", InvalidArgumentError),
    15: ("dictionary_exists", ZrecordError),
    16: ("buffer_too_small", InvalidArgumentError),
    17: ("not_found", ZrecordError),
}
#: The code of each status name: how the rest of loaderx names a code.
STATUS = {name: code for code, (name, _) in CODES.items()}
# Each error class carries the first code the table gives it when raised
# without one (StoreLockedError("...") has code 6); ZrecordError stands for
# several unrelated codes and keeps 0, StoreOSError is an io failure.
for _code, (_name, _class) in CODES.items():
    if _class is not ZrecordError and "status" not in vars(_class):
        _class.status = _code
StoreOSError.status = STATUS["io"]


def last_message() -> str:
    """The native message of this thread's last failure."""
    buffer = ffi.new("char[1024]")
    lib.lx_error_message(buffer, len(buffer))
    text: bytes = ffi.string(buffer)
    return text.decode("utf-8", "replace")


# The codes an OS error maps to (zig/status.zig `fromOs`): with an errno,
# they raise the OSError class the errno names.
_OS_CODES = frozenset(
    STATUS[name] for name in ("io", "read_only", "no_space", "out_of_memory", "not_found")
)


def error_for(status: int, message: str, errno: int = 0) -> ZrecordError:
    """The exception of a native status code (and errno, 0 for none)."""
    cls = CODES.get(status, ("unknown", ZrecordError))[1]
    if errno and status in _OS_CODES:
        return (class_for_errno(errno) or StoreOSError)(message, status, errno)
    return cls(message, status)


def check(status: int, context: str = "") -> None:
    """Raise the exception for a non-zero status code, with the native message."""
    if status == 0:
        return
    message = last_message() or CODES.get(status, ("unknown", ZrecordError))[0]
    if context:
        message = f"{context}: {message}"
    raise error_for(status, message, int(lib.lx_error_errno()))


def _limits() -> dict[str, int]:
    out = ffi.new("lx_limits_t *")
    lib.lx_limits(out)
    return {
        name: int(getattr(out, name))
        for name in (
            "record_bytes_max",
            "record_count_max",
            "dict_bytes_min",
            "dict_bytes_max",
            "sampler_length_max",
            "sampler_groups_max",
        )
    }


# The core's limits (zig/format.zig, zig/sampler.zig): one definition.
LIMITS = _limits()
