"""Vectorised ``tf.train.Example`` serialisation and TFRecord writing, without TensorFlow.

Importing TensorFlow costs ~4 s and building one protobuf message per record is the usual
bottleneck of pre-training data generation, so this module writes the wire format itself,
for a whole batch of records at once, with numpy:

* ``tf.train.Example``: ``Example{features=1: Features}``, ``Features{feature=1: map<string,
  Feature>}`` (each map entry is a message ``{key=1: string, value=2: Feature}``),
  ``Feature{bytes_list=1 | float_list=2 | int64_list=3}``, ``Int64List{value=1 packed varint}``,
  ``FloatList{value=1 packed fixed32}``.  Map entries are emitted in sorted key order, which is
  exactly what ``Example.SerializeToString(deterministic=True)`` produces.
* TFRecord framing: ``uint64 length``, ``uint32 masked_crc32c(length)``, ``data``,
  ``uint32 masked_crc32c(data)`` (little endian), masked as ``((crc >> 15) | (crc << 17)) +
  0xa282ead8``.

CRC32C comes from the optional ``google-crc32c`` package (C code) when it is installed, and
otherwise from a numpy implementation that runs the table-driven CRC over all records of a
batch in parallel (one vector step per byte column), which is nearly as fast.

Every record of a batch is described as a row of "items": an unsigned value emitted either as a
protobuf varint or as one raw byte.  Tags, key characters and length prefixes are varint items
(values < 128 are their own varint byte), floats are four raw-byte items each.  All rows have
the same number of items, so the whole batch is one 2-D array; byte widths vary per item and the
bytes are compacted with a boolean mask.
"""
from __future__ import annotations

import os
from typing import Mapping, Sequence, Tuple

import numpy as np

try:  # optional C implementation; the numpy one below is the fallback
    import google_crc32c as _google_crc32c
    if getattr(_google_crc32c, "implementation", "c") != "c":
        _google_crc32c = None
except ImportError:  # pragma: no cover - depends on the environment
    _google_crc32c = None

_CRC_MASK_DELTA = 0xA282EAD8
_CRC32C_POLY_REVERSED = 0x82F63B78


def _make_crc_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(_CRC32C_POLY_REVERSED), table >> 1)
    return table.astype(np.uint32)


_CRC_TABLE = _make_crc_table()


def crc32c_many_numpy(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """CRC32C of ``buf[starts[i]:starts[i]+lengths[i]]`` for every i, all records in parallel."""
    buf = np.asarray(buf, dtype=np.uint8)
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(starts)
    crc = np.full(n, 0xFFFFFFFF, dtype=np.uint32)
    if n == 0:
        return crc
    # Process records in decreasing length order so the active set is always a prefix.
    order = np.argsort(-lengths, kind="stable")
    s = starts[order]
    ln = lengths[order]
    c = crc.copy()
    max_len = int(ln[0])
    # active[k] = number of records longer than k
    counts = np.searchsorted(-ln, -np.arange(max_len), side="left")
    table = _CRC_TABLE
    for k in range(max_len):
        m = int(counts[k])
        cm = c[:m]
        byte = buf[s[:m] + k]
        c[:m] = table[(cm ^ byte) & 0xFF] ^ (cm >> 8)
    c ^= np.uint32(0xFFFFFFFF)
    crc[order] = c
    return crc


def crc32c_many(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """CRC32C of many slices of one uint8 buffer (C implementation when available)."""
    if _google_crc32c is None:
        return crc32c_many_numpy(buf, starts, lengths)
    # The C extension takes only objects without a buffer-release hook (bytes), so slice a
    # bytes copy; a ~600-byte memcpy per record is negligible next to the CRC call.
    raw = np.ascontiguousarray(buf, dtype=np.uint8).tobytes()
    value = _google_crc32c.value
    return np.fromiter((value(raw[s:s + n]) for s, n in zip(starts.tolist(), lengths.tolist())),
                       dtype=np.uint32, count=len(starts))


def masked_crc(crc: np.ndarray) -> np.ndarray:
    crc = np.asarray(crc, dtype=np.uint32)
    return (((crc >> 15) | (crc << 17)) + np.uint32(_CRC_MASK_DELTA)).astype(np.uint32)


def _varint_len(values: np.ndarray) -> np.ndarray:
    """Number of bytes of the protobuf varint of each (non-negative, < 2**35) value."""
    n = np.ones(values.shape, dtype=np.int32)
    for shift in (7, 14, 21, 28):
        n += values >= (1 << shift)
    return n


# Feature kinds.
INT64 = "int64"
FLOAT = "float"

_FEATURE_TAG = {INT64: 0x1A, FLOAT: 0x12}  # Feature.int64_list = 3, Feature.float_list = 2


class _Items:
    """Rows of items being laid out; each block is (n, w) and is either single-byte or varint."""

    def __init__(self, n: int):
        self.n = n
        self.blocks = []  # (values (n, w) array, is_varint)

    def raw(self, values) -> None:
        """Single-byte items (raw bytes, or varints known to be < 128)."""
        values = np.asarray(values)
        if values.ndim == 1:
            values = np.broadcast_to(values[None, :], (self.n, len(values)))
        self.blocks.append((values, False))

    def varint(self, values) -> None:
        values = np.asarray(values)
        if values.ndim == 1:
            values = values[:, None]
        if values.size and int(values.max()) < 128:
            self.blocks.append((values, False))
        else:
            self.blocks.append((values, True))

    def emit(self, extra: int = 0):
        """Lays the items out: returns (buffer, record_starts, record_lengths).

        Varint bytes are written highest byte first for all items, then lower bytes, so the
        junk high bytes of short varints are always overwritten by the bytes of the items that
        follow (the position of byte k of item j is written last by item j itself).
        """
        n = self.n
        nb_parts, b0_parts = [], []
        multi = []  # (column offset, values, nb) of varint blocks
        col = 0
        for values, is_varint in self.blocks:
            w = values.shape[1]
            if is_varint:
                v = values.astype(np.uint64, copy=False)
                nb = _varint_len(v)
                b0 = ((v & 0x7F) | np.where(nb > 1, 0x80, 0).astype(np.uint64)).astype(np.uint8)
                multi.append((col, v, nb))
                nb_parts.append(nb)
            else:
                b0 = values.astype(np.uint8, copy=False)
                nb_parts.append(np.ones((n, w), dtype=np.int32))
            b0_parts.append(np.broadcast_to(b0, (n, w)))
            col += w
        nb_all = np.concatenate(nb_parts, axis=1)
        b0_all = np.concatenate(b0_parts, axis=1)
        lengths = nb_all.sum(axis=1, dtype=np.int64)
        flat_nb = nb_all.reshape(-1)
        dest = np.cumsum(flat_nb, dtype=np.int64)
        total = int(dest[-1]) if len(dest) else 0
        dest -= flat_nb
        dest2d = dest.reshape(n, -1)
        out = np.empty(total + 8 + extra, dtype=np.uint8)
        max_nb = max((int(nb.max()) for _, _, nb in multi), default=1)
        for k in range(max_nb - 1, 0, -1):
            for c, v, nb in multi:
                w = v.shape[1]
                byte = ((v >> (7 * k)) & 0x7F) | np.where(nb > k + 1, 0x80, 0).astype(np.uint64)
                out[dest2d[:, c:c + w] + k] = byte.astype(np.uint8)
        out[dest] = b0_all.reshape(-1)
        starts = dest2d[:, 0].copy() if n else np.zeros(0, dtype=np.int64)
        return out[:total], starts, lengths


def _example_items(features: Mapping[str, np.ndarray], kinds: Mapping[str, str],
                   prefix_bytes: int = 0, suffix_bytes: int = 0) -> _Items:
    names = sorted(features)
    if not names:
        raise ValueError("no features")
    n = int(np.asarray(features[names[0]]).shape[0])
    body = []  # (header pieces, payload block, payload is varint)
    entry_lens = []
    for name in names:
        kind = kinds[name]
        arr = np.asarray(features[name])
        if arr.ndim != 2 or arr.shape[0] != n:
            raise ValueError(f"feature {name}: expected shape ({n}, width), got {arr.shape}")
        key = name.encode("utf-8")
        if len(key) >= 128 or any(b >= 128 for b in key):
            raise ValueError(f"feature name {name!r}: only short ASCII names are supported")
        if kind == INT64:
            if arr.size and arr.min() < 0:
                raise ValueError(f"feature {name}: negative int64 values are not supported")
            payload = arr.astype(np.uint64, copy=False)
            payload_len = _varint_len(payload).sum(axis=1, dtype=np.int64)
            payload_varint = True
        elif kind == FLOAT:
            payload = np.ascontiguousarray(arr, dtype="<f4").view(np.uint8).reshape(n, -1)
            payload_len = np.full(n, payload.shape[1], dtype=np.int64)
            payload_varint = False
        else:
            raise ValueError(f"feature {name}: unknown kind {kind!r}")
        list_len = 1 + _varint_len(payload_len) + payload_len
        feat_len = 1 + _varint_len(list_len) + list_len
        entry_len = 2 + len(key) + 1 + _varint_len(feat_len) + feat_len
        entry_lens.append(entry_len)
        body.append((key, kind, feat_len, list_len, payload_len, payload, payload_varint))
    features_len = sum((1 + _varint_len(e) + e) for e in entry_lens)

    items = _Items(n)
    if prefix_bytes:
        items.raw(np.zeros(prefix_bytes, dtype=np.uint8))
    items.raw(np.array([0x0A], dtype=np.uint8))          # Example.features
    items.varint(features_len)
    for (key, kind, feat_len, list_len, payload_len, payload, payload_varint), entry_len in zip(
            body, entry_lens):
        items.raw(np.array([0x0A], dtype=np.uint8))      # Features.feature map entry
        items.varint(entry_len)
        items.raw(np.array([0x0A, len(key), *key], dtype=np.uint8))  # entry.key
        items.raw(np.array([0x12], dtype=np.uint8))      # entry.value: Feature
        items.varint(feat_len)
        items.raw(np.array([_FEATURE_TAG[kind]], dtype=np.uint8))  # Feature.*_list
        items.varint(list_len)
        items.raw(np.array([0x0A], dtype=np.uint8))      # packed `value` field
        items.varint(payload_len)
        if payload_varint:
            items.varint(payload)
        else:
            items.raw(payload)
    if suffix_bytes:
        items.raw(np.zeros(suffix_bytes, dtype=np.uint8))
    return items


def encode_examples(features: Mapping[str, np.ndarray],
                    kinds: Mapping[str, str]) -> Tuple[np.ndarray, np.ndarray]:
    """Serialises a batch of ``tf.train.Example`` records.

    ``features[name]`` is an ``(n, width)`` array (row i belongs to record i); ``kinds[name]`` is
    ``INT64`` (non-negative integers) or ``FLOAT`` (stored as float32).  Returns the
    concatenated serialised records as one uint8 array and the length of each record.  The
    bytes equal ``tf.train.Example(...).SerializeToString(deterministic=True)``.
    """
    data, _, lengths = _example_items(features, kinds).emit()
    return data, lengths


def encode_tfrecords(features: Mapping[str, np.ndarray],
                     kinds: Mapping[str, str]) -> np.ndarray:
    """Like ``encode_examples`` but returns the records already in TFRecord framing."""
    buf, starts, lengths = _example_items(features, kinds, prefix_bytes=12,
                                          suffix_bytes=4).emit()
    _fill_framing(buf, starts, lengths - 16)
    return buf


def _fill_framing(buf: np.ndarray, rec_starts: np.ndarray, data_lengths: np.ndarray) -> None:
    """Writes length, length CRC and data CRC around records laid out with 12+4 spare bytes."""
    n = len(data_lengths)
    if n == 0:
        return
    header = np.empty((n, 12), dtype=np.uint8)
    header[:, :8] = data_lengths.astype("<u8").view(np.uint8).reshape(n, 8)
    len_crc = masked_crc(crc32c_many_numpy(header[:, :8].reshape(-1),
                                           8 * np.arange(n, dtype=np.int64),
                                           np.full(n, 8, dtype=np.int64)))
    header[:, 8:] = len_crc.astype("<u4").view(np.uint8).reshape(n, 4)
    buf[rec_starts[:, None] + np.arange(12)] = header
    data_crc = masked_crc(crc32c_many(buf, rec_starts + 12, data_lengths))
    buf[(rec_starts + 12 + data_lengths)[:, None] + np.arange(4)] = \
        data_crc.astype("<u4").view(np.uint8).reshape(n, 4)


def frame_records(data: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """TFRecord framing of the records ``data`` (concatenated) with the given lengths."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    out = np.empty(int(lengths.sum()) + 16 * n, dtype=np.uint8)
    if n == 0:
        return out
    rec_starts = np.zeros(n, dtype=np.int64)
    np.cumsum(lengths[:-1] + 16, out=rec_starts[1:])
    shift = np.repeat(12 + 16 * np.arange(n, dtype=np.int64), lengths)
    out[np.arange(len(data), dtype=np.int64) + shift] = data
    _fill_framing(out, rec_starts, lengths)
    return out


def split_records(data: np.ndarray, lengths: np.ndarray) -> list:
    """The records of ``encode_examples`` output as a list of ``bytes`` (for tests/debugging)."""
    ends = np.cumsum(lengths)
    starts = ends - lengths
    raw = np.asarray(data, dtype=np.uint8).tobytes()
    return [raw[s:e] for s, e in zip(starts.tolist(), ends.tolist())]


class TFRecordFileWriter:
    """Writes framed TFRecord batches to ``<path>.tmp-<pid>`` and renames on ``commit``.

    A failure (``abort`` or leaving a ``with`` block by an exception) removes the temporary
    file, so no partial record file ever appears under the final name.  Opening raises
    ``OSError`` when the folder is missing or not writable.
    """

    def __init__(self, path: str):
        self.path = path
        self.tmp_path = f"{path}.tmp-{os.getpid()}"
        self._file = open(self.tmp_path, "wb")
        self.records = 0
        self.bytes = 0

    def write_framed(self, framed: np.ndarray, num_records: int) -> None:
        self._file.write(memoryview(np.ascontiguousarray(framed, dtype=np.uint8)))
        self.records += num_records
        self.bytes += int(framed.size)

    def write_tfrecords(self, framed: np.ndarray, num_records: int) -> None:
        """Writes the output of ``encode_tfrecords``."""
        self.write_framed(framed, num_records)

    def write_examples(self, data: np.ndarray, lengths: np.ndarray) -> None:
        if len(lengths):
            self.write_framed(frame_records(data, lengths), len(lengths))

    def commit(self) -> None:
        self._file.close()
        os.replace(self.tmp_path, self.path)

    def abort(self) -> None:
        try:
            self._file.close()
        finally:
            try:
                os.remove(self.tmp_path)
            except FileNotFoundError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.commit()
        else:
            self.abort()
        return False


def write_tfrecord_file(path: str, records: Sequence[bytes]) -> None:
    """Writes already serialised records (bytes) to a TFRecord file (small helper)."""
    lengths = np.array([len(r) for r in records], dtype=np.int64)
    data = np.frombuffer(b"".join(records), dtype=np.uint8)
    with TFRecordFileWriter(path) as w:
        w.write_examples(data, lengths)


def read_tfrecord_file(path: str, check_crc: bool = True) -> list:
    """Reads the records of a TFRecord file (pure Python/numpy; for tests and tools)."""
    with open(path, "rb") as f:
        raw = f.read()
    buf = np.frombuffer(raw, dtype=np.uint8)
    records = []
    pos = 0
    while pos < len(raw):
        if pos + 12 > len(raw):
            raise ValueError(f"{path}: truncated record header at byte {pos}")
        n = int.from_bytes(raw[pos:pos + 8], "little")
        if check_crc:
            crc = masked_crc(crc32c_many(buf, np.array([pos]), np.array([8])))[0]
            if int(crc) != int.from_bytes(raw[pos + 8:pos + 12], "little"):
                raise ValueError(f"{path}: bad length checksum at byte {pos}")
        start, end = pos + 12, pos + 12 + n
        if end + 4 > len(raw):
            raise ValueError(f"{path}: truncated record at byte {pos}")
        if check_crc:
            crc = masked_crc(crc32c_many(buf, np.array([start]), np.array([n])))[0]
            if int(crc) != int.from_bytes(raw[end:end + 4], "little"):
                raise ValueError(f"{path}: bad data checksum at byte {pos}")
        records.append(raw[start:end])
        pos = end + 4
    return records
