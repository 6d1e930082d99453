"""TFRecord framing, the container of TensorBoard's event files, read for the tests that check what shardtrain writes:
each record is a little-endian uint64 length, the masked CRC-32C of those 8 bytes, the payload, and the masked
CRC-32C of the payload (CRC-32C: reflected polynomial 0x82F63B78, initial and final xor 0xFFFFFFFF; masked: rotated
right by 15 bits and 0xA282EAD8 added)."""
import struct

_TABLE = []
for _n in range(256):
    _c = _n
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _TABLE.append(_c)


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data):
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283  # the published check value


def records(data):
    """(offset, payload, problem) of each record of `data`, in order: problem is None, or what is wrong with the record
    at that offset (a torn header or record, a bad length or payload CRC), after which nothing more is read."""
    at = 0
    while at < len(data):
        if at + 12 > len(data):
            yield at, b"", "a torn record header"
            return
        (n,) = struct.unpack_from("<Q", data, at)
        if struct.unpack_from("<I", data, at + 8)[0] != masked_crc32c(data[at:at + 8]):
            yield at, b"", "a bad length CRC"
            return
        if at + 16 + n > len(data):
            yield at, b"", "a torn record"
            return
        body = data[at + 12:at + 12 + n]
        if struct.unpack_from("<I", data, at + 12 + n)[0] != masked_crc32c(body):
            yield at, body, "a bad data CRC"
            return
        yield at, body, None
        at += 16 + n


def f32(x):
    """x as the float32 an event's simple_value holds."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def expected_scalars(line):
    """{tag: value} that a metrics.jsonl train or eval line gives TensorBoard, by the rule docs/training.md states:
    every number but the step, objects one level down ("train/loss", "eval/val_loss/<source>"), unrounded."""
    out = {}
    for key, v in line.items():
        if key == "step":
            continue
        for name, w in (v.items() if isinstance(v, dict) else [(None, v)]):
            if isinstance(w, (int, float)) and not isinstance(w, bool):
                out[f"{line['kind']}/{key}" + (f"/{name}" if name else "")] = w
    return out
