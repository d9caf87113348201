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

Every record of a batch is laid out as one row of a 2-D byte array in which each varint gets
a fixed slot as wide as the largest value of its column needs (bytes looked up in a cached
table of the varints of 0..2**k-1), with a validity mask for the unused slot bytes; one
``np.compress`` over the batch then drops those bytes and leaves the records concatenated.
The TFRecord framing bytes are slots of the same rows, filled in once the records' positions
are known.
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
    """Number of bytes of the protobuf varint of each non-negative value (< 2**63)."""
    n = np.ones(values.shape, dtype=np.int32)
    top = int(values.max()) if values.size else 0
    for shift in range(7, 64, 7):
        if top < (1 << shift):
            break
        n += values >= (1 << shift)
    return n


# Feature kinds.
INT64 = "int64"
FLOAT = "float"

_FEATURE_TAG = {INT64: 0x1A, FLOAT: 0x12}  # Feature.int64_list = 3, Feature.float_list = 2


_TABLE_CACHE = {}


def _varint_table(size: int):
    """Varint bytes (size, K), validity (size, K) and lengths (size,) of 0..size-1."""
    cached = _TABLE_CACHE.get(size)
    if cached is None:
        values = np.arange(size, dtype=np.uint64)
        lengths = _varint_len(values)
        width = int(lengths[-1])
        k = np.arange(width, dtype=np.uint64)[None, :]
        raw = (values[:, None] >> (7 * k)) & 0x7F
        cont = k < (lengths[:, None] - 1).astype(np.uint64)
        table = (raw | np.where(cont, 0x80, 0).astype(np.uint64)).astype(np.uint8)
        valid = k < lengths[:, None].astype(np.uint64)
        cached = (table, valid, lengths.astype(np.int64))
        _TABLE_CACHE[size] = cached
    return cached


def _varint_slots(values: np.ndarray):
    """Varints of an (n, w) block laid out in fixed K-byte slots.

    Returns (bytes (n, w*K) uint8, valid (n, w*K) bool or None where every byte is, bytes
    per row (n,) int64).
    """
    n, w = values.shape
    max_value = int(values.max()) if values.size else 0
    if max_value < 128:  # one byte each, the value itself (masks, segment ids, labels)
        return (values.astype(np.uint8), None, np.full(n, w, dtype=np.int64))
    if max_value < (1 << 21):
        size = 1 << max(1, max_value.bit_length())
        table, valid, lengths = _varint_table(size)
        idx = values.astype(np.intp, copy=False)
        k = table.shape[1]
        # np.take on axis 0 is several times faster than fancy indexing for row gathers.
        return (np.take(table, idx, axis=0).reshape(n, w * k),
                np.take(valid, idx, axis=0).reshape(n, w * k),
                np.take(lengths, idx).sum(axis=1))
    v = values.astype(np.uint64, copy=False)
    nb = _varint_len(v)
    width = int(nb.max())
    out = np.empty((n, w, width), dtype=np.uint8)
    for k in range(width):
        out[:, :, k] = (((v >> (7 * k)) & 0x7F)
                        | np.where(nb > k + 1, 0x80, 0).astype(np.uint64)).astype(np.uint8)
    valid = np.arange(width)[None, None, :] < nb[:, :, None]
    return out.reshape(n, w * width), valid.reshape(n, w * width), nb.sum(axis=1, dtype=np.int64)


class _Layout:
    """Records of a batch as rows of byte slots, some of which are unused (varint padding).

    Blocks are appended left to right; ``emit`` drops the unused slots with one boolean
    compaction, which leaves the records concatenated in row order.
    """

    def __init__(self, n: int):
        self.n = n
        self.blocks = []  # (bytes (n, c) or (c,), valid (n, c) or None)

    def const(self, values) -> None:
        self.blocks.append((np.asarray(values, dtype=np.uint8), None))

    def raw(self, values: np.ndarray) -> None:
        self.blocks.append((values.astype(np.uint8, copy=False), None))

    def varint(self, values: np.ndarray) -> None:
        values = np.asarray(values)
        if values.ndim == 1:
            values = values[:, None]
        data, valid, _ = _varint_slots(values)
        self.blocks.append((data, None if valid is None or valid.all() else valid))

    def emit(self):
        """Returns (buffer, record starts, record lengths)."""
        n = self.n
        width = sum(b.shape[-1] for b, _ in self.blocks)
        data = np.empty((n, width), dtype=np.uint8)
        valid = None
        col = 0
        for b, v in self.blocks:
            c = b.shape[-1]
            data[:, col:col + c] = b
            if v is not None:
                if valid is None:
                    valid = np.ones((n, width), dtype=bool)
                valid[:, col:col + c] = v
            col += c
        if valid is None:
            lengths = np.full(n, width, dtype=np.int64)
            buf = data.reshape(-1)
        else:
            lengths = np.count_nonzero(valid, axis=1).astype(np.int64)
            # np.compress is ~3x faster than boolean indexing here.
            buf = np.compress(valid.reshape(-1), data.reshape(-1))
        starts = np.zeros(n, dtype=np.int64)
        if n:
            np.cumsum(lengths[:-1], out=starts[1:])
        return buf, starts, lengths


def _example_layout(features: Mapping[str, np.ndarray], kinds: Mapping[str, str],
                   prefix_bytes: int = 0, suffix_bytes: int = 0) -> _Layout:
    names = sorted(features)
    if not names:
        raise ValueError("no features")
    n = int(np.asarray(features[names[0]]).shape[0])
    body = []
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
            payload, payload_valid, payload_len = _varint_slots(arr)
        elif kind == FLOAT:
            payload = np.ascontiguousarray(arr, dtype="<f4").view(np.uint8).reshape(n, -1)
            payload_valid = None
            payload_len = np.full(n, payload.shape[1], dtype=np.int64)
        else:
            raise ValueError(f"feature {name}: unknown kind {kind!r}")
        if payload_valid is not None and payload_valid.all():
            payload_valid = None
        list_len = 1 + _varint_len(payload_len) + payload_len
        feat_len = 1 + _varint_len(list_len) + list_len
        entry_len = 2 + len(key) + 1 + _varint_len(feat_len) + feat_len
        entry_lens.append(entry_len)
        body.append((key, kind, feat_len, list_len, payload_len, payload, payload_valid))
    features_len = sum((1 + _varint_len(e) + e) for e in entry_lens)

    layout = _Layout(n)
    if prefix_bytes:
        layout.const(np.zeros(prefix_bytes, dtype=np.uint8))
    layout.const([0x0A])                                   # Example.features
    layout.varint(features_len)
    for (key, kind, feat_len, list_len, payload_len, payload, payload_valid), entry_len in zip(
            body, entry_lens):
        layout.const([0x0A])                               # Features.feature map entry
        layout.varint(entry_len)
        layout.const([0x0A, len(key), *key, 0x12])         # entry.key, entry.value tag
        layout.varint(feat_len)
        layout.const([_FEATURE_TAG[kind]])                 # Feature.{int64,float}_list
        layout.varint(list_len)
        layout.const([0x0A])                               # packed `value` field
        layout.varint(payload_len)
        layout.blocks.append((payload, payload_valid))
    if suffix_bytes:
        layout.const(np.zeros(suffix_bytes, dtype=np.uint8))
    return layout


def encode_examples(features: Mapping[str, np.ndarray],
                    kinds: Mapping[str, str]) -> Tuple[np.ndarray, np.ndarray]:
    """Serialises a batch of ``tf.train.Example`` records.

    ``features[name]`` is an ``(n, width)`` array (row i belongs to record i); ``kinds[name]`` is
    ``INT64`` (non-negative integers) or ``FLOAT`` (stored as float32).  Returns the
    concatenated serialised records as one uint8 array and the length of each record.  The
    bytes equal ``tf.train.Example(...).SerializeToString(deterministic=True)``.
    """
    data, _, lengths = _example_layout(features, kinds).emit()
    return data, lengths


def encode_tfrecords(features: Mapping[str, np.ndarray],
                     kinds: Mapping[str, str]) -> np.ndarray:
    """Like ``encode_examples`` but returns the records already in TFRecord framing."""
    buf, starts, lengths = _example_layout(features, kinds, prefix_bytes=12,
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
