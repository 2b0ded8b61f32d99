"""TFRecord's framing and the part of protobuf's wire format a ``tf.train.Example`` needs.

Records are framed as TFRecord frames them (uint64 length, its masked
CRC-32C, the data, the data's masked CRC-32C) and Examples are written and
parsed here, a few varints each, rather than through protobuf: a clip's
payload is then copied once when written and read as a view of the
memory-mapped file, never copied.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

from ..errors import FormatError

U64 = struct.Struct("<Q")
U32 = struct.Struct("<I")
_CRC_MASK = 0xA282EAD8
FRAMING = 16  # bytes of framing around a record's data: length, its CRC, the data's CRC

_crc32c: Callable[..., int] | None = None


def _crc32c_fn() -> Callable[..., int]:
    global _crc32c
    if _crc32c is None:
        # Imported on first use: the crc32c package's __init__ reads its own
        # version through importlib.metadata, a cost every process importing
        # convert.format (the job, each shard process, each loader) would pay
        # even when it never touches a TFRecord shard.
        import crc32c

        _crc32c = crc32c.crc32c
    return _crc32c


def _mask(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + _CRC_MASK) & 0xFFFFFFFF


def masked_crc(data: bytes | memoryview) -> int:
    """TFRecord's masked CRC-32C (Castagnoli) of ``data``."""
    return _mask(_crc32c_fn()(data))


def frame_record(*data: bytes | memoryview) -> list[bytes | memoryview]:
    """The pieces of one framed record: length, its masked CRC, data, the data's masked CRC.

    The record's data may come in pieces (an Example's fields, the clip's
    payload among them): they are checksummed one after the other and written
    as they are, never joined into one copy of the record.
    """
    crc32c, crc = _crc32c_fn(), 0
    for piece in data:
        crc = crc32c(piece, crc)
    length = U64.pack(sum(len(piece) for piece in data))
    return [length, U32.pack(masked_crc(length)), *data, U32.pack(_mask(crc))]


# -- protobuf wire format, just what tf.train.Example needs -------------------
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload_len: int) -> bytes:
    """Tag and length of a length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(payload_len)


def _bytes_feature(value: bytes | memoryview) -> list[bytes | memoryview]:
    # Feature{bytes_list = 1: BytesList{value = 1: bytes}}
    inner = _field(1, len(value))
    return [_field(1, len(inner) + len(value)), inner, value]


def _int64_feature(values: Sequence[int]) -> list[bytes]:
    # Feature{int64_list = 3: Int64List{value = 1: packed varints}}; negative ints as 10-byte two's complement
    packed = b"".join(_varint(int(v) & 0xFFFFFFFFFFFFFFFF) for v in values)
    inner = _field(1, len(packed)) + packed
    return [_field(3, len(inner)), inner]


def encode_example(features: dict[str, tuple[str, object]]) -> list[bytes | memoryview]:
    """A serialized Example as pieces to join; ``features``: name -> ("bytes", value) or ("int64", [ints]).

    Features are written sorted by name (an Example's map has no order; a
    fixed one makes the bytes of a record a function of its clip alone).
    """
    entries: list[bytes | memoryview] = []
    for name in sorted(features):
        kind, value = features[name]
        feat = _bytes_feature(value) if kind == "bytes" else _int64_feature(value)  # type: ignore[arg-type]
        feat_len = sum(len(p) for p in feat)
        key = name.encode()
        entry = [_field(1, len(key)), key, _field(2, feat_len), *feat]  # map entry {key = 1, value = 2}
        entries += [_field(1, sum(len(p) for p in entry)), *entry]  # Features.feature = 1
    features_len = sum(len(p) for p in entries)
    return [_field(1, features_len), *entries]  # Example.features = 1


def _read_varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise FormatError("truncated or malformed varint in an Example")
        byte = buf[pos]
        pos += 1
        n |= (byte & 0x7F) << shift
        if byte < 0x80:
            return n, pos
        shift += 7


def _delimited(buf: memoryview, pos: int, end: int, want: int) -> tuple[int, int, int]:
    """(field number, start, stop) of the length-delimited field at ``pos``; FormatError if it is another kind."""
    tag, pos = _read_varint(buf, pos, end)
    if tag & 7 != 2:
        raise FormatError(f"Example field {tag >> 3} has wire type {tag & 7}, expected length-delimited")
    length, pos = _read_varint(buf, pos, end)
    if pos + length > end:
        raise FormatError("Example field runs past the end of its record")
    if want and tag >> 3 != want:
        raise FormatError(f"Example has field {tag >> 3} where {want} was expected")
    return tag >> 3, pos, pos + length


def decode_example(buf: memoryview) -> dict[str, tuple[str, memoryview | list[int]]]:
    """Features of a serialized Example: bytes features as views of ``buf``, int64 lists as ints."""
    out: dict = {}
    _, pos, end = _delimited(buf, 0, len(buf), 1)
    if end != len(buf):
        raise FormatError("Example has data after its features")
    while pos < end:
        _, epos, eend = _delimited(buf, pos, end, 1)
        pos = eend
        key = value = None
        while epos < eend:
            num, a, b = _delimited(buf, epos, eend, 0)
            epos = b
            if num == 1:
                key = bytes(buf[a:b]).decode("utf-8", errors="replace")
            elif num == 2:
                value = (a, b)
        if key is None or value is None:
            raise FormatError("Example feature without a name or a value")
        kind, a, b = _delimited(buf, value[0], value[1], 0)
        if kind == 1:  # bytes_list
            if a == b:
                out[key] = ("bytes", buf[a:a])
            else:
                _, va, vb = _delimited(buf, a, b, 1)
                out[key] = ("bytes", buf[va:vb])
        elif kind == 3:  # int64_list, packed or not
            ints: list[int] = []
            p = a
            while p < b:
                tag, p = _read_varint(buf, p, b)
                if tag == (1 << 3 | 2):
                    length, p = _read_varint(buf, p, b)
                    stop = p + length
                    while p < stop:
                        v, p = _read_varint(buf, p, stop)
                        ints.append(v - (1 << 64) if v >= 1 << 63 else v)
                elif tag == (1 << 3):
                    v, p = _read_varint(buf, p, b)
                    ints.append(v - (1 << 64) if v >= 1 << 63 else v)
                else:
                    raise FormatError(f"int64 list has field tag {tag}")
            out[key] = ("int64", ints)
        else:
            out[key] = ("other", buf[a:b])
    return out


__all__ = ["FRAMING", "U32", "U64", "decode_example", "encode_example", "frame_record", "masked_crc"]
