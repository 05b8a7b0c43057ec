"""The one envelope of the small metadata files: every check can fail."""

import msgpack
import pytest

from loaderx import _envelope as envelope


def test_round_trip() -> None:
    sealed = envelope.seal("loaderx-test", 2, {"rows": 3, "name": "a"})
    assert envelope.unseal(sealed, "loaderx-test", 2) == (2, {"rows": 3, "name": "a"})
    assert envelope.is_sealed(envelope.unpack_map(sealed))


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"\xc1", envelope.UNREADABLE),
        (msgpack.packb([1, 2]), envelope.UNREADABLE),
        (envelope.seal("other", 1, {}), envelope.FORMAT),
        (msgpack.packb({"format": "loaderx-test", "version": 0}), envelope.VERSION),
        (msgpack.packb({"format": "loaderx-test", "version": True}), envelope.VERSION),
        (envelope.seal("loaderx-test", 3, {}), envelope.NEWER),
    ],
)
def test_each_check_refuses(payload: bytes, reason: str) -> None:
    with pytest.raises(envelope.EnvelopeError) as caught:
        envelope.unseal(payload, "loaderx-test", 2)
    assert caught.value.reason == reason


def test_a_flipped_body_byte_fails_the_checksum() -> None:
    data = envelope.unpack_map(envelope.seal("loaderx-test", 1, {"rows": 12345}))
    body = bytearray(data["body"])
    body[-1] ^= 1
    data["body"] = bytes(body)
    with pytest.raises(envelope.EnvelopeError) as caught:
        envelope.unseal(msgpack.packb(data, use_bin_type=True), "loaderx-test", 1)
    assert caught.value.reason == envelope.CHECKSUM


def test_a_body_that_is_not_a_map() -> None:
    import zlib

    body = msgpack.packb([1])
    payload = msgpack.packb({"format": "f", "version": 1, "body": body, "crc32": zlib.crc32(body)})
    with pytest.raises(envelope.EnvelopeError) as caught:
        envelope.unseal(payload, "f", 1)
    assert caught.value.reason == envelope.BODY
