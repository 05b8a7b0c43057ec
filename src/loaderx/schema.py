"""The schema of a loaderx store: what its records are, and the file that says so.

A loaderx store is a zrecord directory plus ``schema.msgpack``, the only
loaderx-level metadata. The schema is a small map::

    {"format": "loaderx", "version": 1, "kind": "dense" | "ragged",
     "dtype": "<f4", "item_shape": [2, 4], "codec": "zstd"}

``dtype`` is ``np.dtype.str`` (for structured dtypes, ``np.dtype.descr``).
A dense record is exactly one item of ``item_shape``; a ragged record is any
number of rows, each of ``item_shape``. Invariant: a `Schema` is always
valid (checked on construction), and `read_schema` returns one only for a
file whose every field checks. This module is the bottom of the dataset
layers: it imports nothing of loaderx above ``zrecord``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, NoReturn, Union

import msgpack
import numpy as np

from ._envelope import FORMAT, NEWER, EnvelopeError, check_header
from ._fs import read_at_most, write_file_atomic
from .zrecord import CODECS

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "KINDS",
    "SCHEMA_FILE",
    "Schema",
    "StrPath",
    "open_schema",
    "read_schema",
    "schema_path",
    "write_schema",
]

#: A file system path, as the public functions take it.
StrPath = Union[str, "os.PathLike[str]"]

SCHEMA_FILE = "schema.msgpack"
FORMAT_NAME = "loaderx"
FORMAT_VERSION = 1
KINDS = ("dense", "ragged")
_SCHEMA_BYTES_MAX = 1 << 20


@dataclass(frozen=True)
class Schema:
    """What the records of a store are: kind, dtype, item shape and codec."""

    kind: str
    dtype: np.dtype[Any]
    item_shape: tuple[int, ...]
    codec: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"schema kind must be one of {KINDS}, got {self.kind!r}")
        dtype = np.dtype(self.dtype)
        if dtype.hasobject:
            raise TypeError(
                f"dtype {dtype} holds Python objects, which a store cannot hold: convert to a "
                "numeric, string or bytes dtype"
            )
        object.__setattr__(self, "dtype", dtype)
        shape = tuple(self.item_shape)
        if not all(
            isinstance(size, (int, np.integer)) and not isinstance(size, bool) and size >= 0
            for size in shape
        ):
            raise ValueError(
                f"item_shape must be a tuple of non-negative ints, got {self.item_shape!r}"
            )
        object.__setattr__(self, "item_shape", tuple(int(size) for size in shape))
        if self.codec not in CODECS:
            raise ValueError(f"unknown codec {self.codec!r}: use one of {sorted(CODECS)}")

    @property
    def item_bytes(self) -> int:
        """Bytes of one item (a dense record, or one row of a ragged record)."""
        return int(self.dtype.itemsize * math.prod(self.item_shape))

    def to_dict(self) -> dict[str, Any]:
        dtype = self.dtype.str if self.dtype.fields is None else _descr_to_lists(self.dtype.descr)
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "kind": self.kind,
            "dtype": dtype,
            "item_shape": list(self.item_shape),
            "codec": self.codec,
        }

    @classmethod
    def from_dict(cls, data: object, where: str = "schema") -> Schema:
        """The schema of a map `to_dict` wrote (a schema file's, or the one a
        manifest embeds), its format and version checked as every metadata
        file's are (loaderx._envelope)."""
        if not isinstance(data, dict):
            raise ValueError(
                f"{where} is not a loaderx schema (expected a map, got {type(data).__name__})"
            )
        try:
            check_header(data, FORMAT_NAME, FORMAT_VERSION)
        except EnvelopeError as exc:
            raise ValueError(_refusal(where, exc)) from None
        missing = [key for key in ("kind", "dtype", "item_shape", "codec") if key not in data]
        if missing:
            raise ValueError(f"{where} lacks {', '.join(missing)}")
        try:
            raw = data["dtype"]
            dtype = np.dtype(raw) if isinstance(raw, str) else np.dtype(_lists_to_descr(raw))
            if not isinstance(data["item_shape"], (list, tuple)):
                raise ValueError(f"item_shape is {data['item_shape']!r}, not a list")
            return cls(data["kind"], dtype, tuple(data["item_shape"]), data["codec"])
        # numpy's dtype parser raises SyntaxError for some damaged strings.
        except (TypeError, ValueError, SyntaxError) as exc:
            raise ValueError(f"{where} is invalid: {exc}") from exc

    def describe(self) -> str:
        return f"{self.kind} {self.dtype} items of shape {self.item_shape}, codec {self.codec!r}"


def _refusal(where: str, exc: EnvelopeError) -> str:
    """What a schema's refused format or version means, and what to do."""
    if exc.reason == FORMAT:
        return f"{where} is not a loaderx schema (format is {exc.found!r})"
    if exc.reason == NEWER:
        return (
            f"{where} has version {exc.found}, newer than this loaderx understands "
            f"({FORMAT_VERSION}): upgrade loaderx"
        )
    if isinstance(exc.found, int) and not isinstance(exc.found, bool):
        return f"{where} has an invalid version {exc.found}"
    return f"{where} has no valid version ({exc.found!r})"


def _descr_to_lists(descr: list[Any]) -> list[Any]:
    return [
        [name, _descr_to_lists(kind) if isinstance(kind, list) else kind, *map(list, rest)]
        for name, kind, *rest in descr
    ]


def _lists_to_descr(lists: object) -> list[tuple[Any, ...]]:
    if not isinstance(lists, (list, tuple)):
        raise ValueError(f"dtype {lists!r} is neither a dtype string nor a field list")
    fields: list[tuple[Any, ...]] = []
    for field in lists:
        name, kind, *rest = field
        kind = _lists_to_descr(kind) if isinstance(kind, (list, tuple)) else kind
        fields.append((name, kind, *(tuple(shape) for shape in rest)))
    return fields


def schema_path(path: StrPath) -> str:
    return os.path.join(os.fspath(path), SCHEMA_FILE)


def read_schema(path: StrPath) -> Schema | None:
    """The schema of the store at ``path``, or None when it has no schema file."""
    file = schema_path(path)
    try:
        payload = read_at_most(file, _SCHEMA_BYTES_MAX + 1)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if len(payload) > _SCHEMA_BYTES_MAX:
        raise ValueError(f"{file} is over {_SCHEMA_BYTES_MAX} bytes: not a loaderx schema")
    return parse_schema(payload, path)


def parse_schema(payload: bytes, path: StrPath) -> Schema:
    """The schema whose file in the store at ``path`` holds ``payload``
    (parsed once per payload); ValueError when it is not one."""
    schema = _PARSED.get(payload)
    if schema is None:
        file = schema_path(path)
        try:
            data = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises several unrelated types for bad bytes
            raise ValueError(f"{file} is damaged or not a loaderx schema: {exc}") from exc
        schema = Schema.from_dict(data, where=file)
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        _PARSED[payload] = schema
    return schema


# Schemas parsed, by their file's bytes (a Schema is immutable): opening the
# arrays of a store, most of them of one schema, parses each kind once (the
# parse was a fifth of a lazy load on cold caches).
_PARSED: dict[bytes, Schema] = {}
_PARSED_MAX = 256


def write_schema(path: StrPath, schema: Schema) -> None:
    """Writes ``schema.msgpack`` atomically and durably."""
    write_file_atomic(
        schema_path(os.fspath(path)), msgpack.packb(schema.to_dict(), use_bin_type=True)
    )


def open_schema(path: StrPath, kind: str, schema: Schema | None = None) -> Schema:
    """The schema of an existing store of ``kind`` (``schema``, when the
    caller read it already); a clear error otherwise."""
    path = os.fspath(path)
    # The schema first: the usual open needs no other look-up.
    if schema is None:
        schema = read_schema(path)
    if schema is None:
        _refuse_schemaless(path)
    if schema.kind != kind:
        other = "RaggedDataset" if schema.kind == "ragged" else "DenseDataset"
        raise ValueError(f"'{path}' is a {schema.kind} store: open it with {other}")
    return schema


def _refuse_schemaless(path: str) -> NoReturn:
    """Says why ``path`` has no schema: a file, nothing, or a foreign directory."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise NotADirectoryError(
            f"'{path}' is a file, not a loaderx store (a store is a directory written by "
            "loaderx.from_numpy or loaderx.from_iterator): give the store's directory"
        )
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"no loaderx store at '{path}': write one with loaderx.from_numpy or "
            "loaderx.from_iterator"
        )
    raise FileNotFoundError(
        f"'{path}' is not a loaderx store (it has no {SCHEMA_FILE}): write one with "
        "loaderx.from_numpy or loaderx.from_iterator, or open a bare record store with "
        "loaderx.Zrecord"
    )
