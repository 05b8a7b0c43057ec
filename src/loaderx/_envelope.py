"""The envelope of loaderx's small metadata files.

Every small metadata file (a dataset's schema, a shard manifest, an Arrow
column listing, an ArrayStore's marker and commit record) is one msgpack map::

    {"format": NAME, "version": N, "body": BYTES, "crc32": CRC32(BYTES)}

where ``BYTES`` is the msgpack of the file's own content. Invariant: `unseal`
returns a content only when all four fields check, so a caller never sees a
torn, foreign or newer file as data. The errors say which check failed
(`EnvelopeError.reason`); each caller turns that into its own message, which
names its file and what to do about it.
"""

from __future__ import annotations

import zlib
from typing import Any

import msgpack

# The reasons an envelope is refused, for callers that word each one.
UNREADABLE = "unreadable"  # not msgpack, or not a map
FORMAT = "format"  # another format name, or none
VERSION = "version"  # no version, or one below 1
NEWER = "newer"  # a version newer than this loaderx reads
CHECKSUM = "checksum"  # the body fails its CRC32
BODY = "body"  # the body passes its checksum but does not decode to a map
REASONS = (UNREADABLE, FORMAT, VERSION, NEWER, CHECKSUM, BODY)


class EnvelopeError(ValueError):
    """An envelope that failed one check; ``reason`` is one of `REASONS`,
    ``found`` what the file held there (a format name, a version)."""

    def __init__(self, reason: str, detail: str, found: object = None) -> None:
        assert reason in REASONS, reason
        super().__init__(detail)
        self.reason = reason
        self.found = found


def seal(format_name: str, version: int, content: dict[str, Any]) -> bytes:
    """The bytes of a metadata file holding ``content``."""
    assert isinstance(version, int) and version >= 1, version
    body = msgpack.packb(content, use_bin_type=True)
    sealed: bytes = msgpack.packb(
        {"format": format_name, "version": version, "body": body, "crc32": zlib.crc32(body)},
        use_bin_type=True,
    )
    return sealed


def unpack_map(payload: bytes) -> dict[str, Any]:
    """``payload`` decoded as a msgpack map, or EnvelopeError(UNREADABLE)."""
    try:
        data = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad bytes
        raise EnvelopeError(UNREADABLE, f"not msgpack ({exc})") from exc
    if not isinstance(data, dict):
        raise EnvelopeError(UNREADABLE, f"a msgpack {type(data).__name__}, not a map")
    return data


def check_header(data: dict[str, Any], format_name: str, version_max: int) -> int:
    """The version of a decoded map whose ``format`` and ``version`` fields
    say it is ``format_name`` at a version this loaderx reads."""
    found = data.get("format")
    if found != format_name:
        raise EnvelopeError(FORMAT, f"format {found!r}, not {format_name!r}", found)
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise EnvelopeError(VERSION, f"invalid version {version!r}", version)
    if version > version_max:
        raise EnvelopeError(NEWER, f"version {version}, newer than {version_max}", version)
    return version


def checked_body(data: dict[str, Any]) -> bytes:
    """The body of a decoded envelope whose CRC32 checks (its header is the
    caller's to check first, with `check_header`)."""
    body, crc = data.get("body"), data.get("crc32")
    if not isinstance(body, bytes) or not isinstance(crc, int) or zlib.crc32(body) != crc:
        raise EnvelopeError(CHECKSUM, "the body fails its CRC32")
    return body


def unseal(payload: bytes, format_name: str, version_max: int) -> tuple[int, dict[str, Any]]:
    """The version and content of a file `seal` wrote, every field checked."""
    data = unpack_map(payload)
    version = check_header(data, format_name, version_max)
    body = checked_body(data)
    try:
        content = unpack_map(body)
    except EnvelopeError as exc:
        raise EnvelopeError(BODY, f"the body passes its checksum but is {exc}") from exc
    return version, content


def is_sealed(data: dict[str, Any]) -> bool:
    """Whether a decoded map is an envelope (rather than a file of the
    unsealed layout that older loaderx versions wrote)."""
    return "body" in data and "crc32" in data
