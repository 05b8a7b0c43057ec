"""Loads the bundled native library and turns its status codes into exceptions.

The cdef is read from ``_abi.h`` (the one declaration of the C ABI); the
library reports its ABI version and a stale build is refused at import.
"""

from __future__ import annotations

from pathlib import Path

import cffi

ABI_VERSION = 2

_HERE = Path(__file__).resolve().parent
_LIBRARY = _HERE / "libloaderx.so"
_REBUILD = (
    "Rebuild it from the source checkout with `pip install -e .` "
    "(or `python -m ziglang build` and copy zig-out/lib/libloaderx.so into src/loaderx/)."
)

ffi = cffi.FFI()
ffi.cdef((_HERE / "_abi.h").read_text())

if not _LIBRARY.exists():
    raise ImportError(f"loaderx's native library is missing: {_LIBRARY} does not exist. {_REBUILD}")
try:
    # RTLD_NODELETE: the native worker threads outlive the interpreter's
    # teardown, so the library must stay mapped until the process exits.
    lib = ffi.dlopen(str(_LIBRARY), ffi.RTLD_NOW | ffi.RTLD_NODELETE)
except OSError as exc:
    raise ImportError(f"loaderx could not load its native library {_LIBRARY}: {exc}. {_REBUILD}") from exc
if lib.lx_version() != ABI_VERSION:
    raise ImportError(
        f"loaderx's native library {_LIBRARY} has ABI version {lib.lx_version()}, "
        f"but this Python package needs version {ABI_VERSION}: the build is stale. {_REBUILD}"
    )


class ZrecordError(RuntimeError):
    """A zrecord store operation failed; ``code`` is the native status code."""

    def __init__(self, message: str, code: int = 0):
        super().__init__(message)
        self.code = code


class StoreLockedError(ZrecordError):
    """Another process (or another open handle) is writing to this store."""


class CorruptStoreError(ZrecordError):
    """The store's files are damaged, truncated or not a store of this format."""


class ChecksumError(CorruptStoreError):
    """A record's bytes do not match its checksum."""


class StoreReadOnlyError(ZrecordError):
    """The store's directory or files cannot be written."""


class StoreFullError(ZrecordError):
    """The disk (or quota) ran out while writing; the store keeps its committed data."""


class NoDictionaryError(ZrecordError):
    """Codec ``zstd_dict`` was asked for but the store has no trained dictionary."""


# The status codes of zig/status.zig, in order.
CODES = {
    1: ("invalid_argument", ZrecordError),
    2: ("index_out_of_range", ZrecordError),
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
    14: ("too_large", ZrecordError),
    15: ("dictionary_exists", ZrecordError),
    16: ("buffer_too_small", ZrecordError),
    17: ("not_found", ZrecordError),
}

def last_message() -> str:
    """The native message of this thread's last failure."""
    buffer = ffi.new("char[1024]")
    lib.lx_error_message(buffer, len(buffer))
    return ffi.string(buffer).decode("utf-8", "replace")


def check(status: int, context: str = "") -> None:
    """Raise the exception for a non-zero status code, with the native message."""
    if status == 0:
        return
    name, cls = CODES.get(status, ("unknown", ZrecordError))
    message = last_message() or name
    if context:
        message = f"{context}: {message}"
    raise cls(message, status)
