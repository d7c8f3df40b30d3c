"""st.py: minimal safetensors reader/writer on numpy (no `safetensors` package on this machine).

Format: 8-byte little-endian header length N, N bytes of JSON
  {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ..., "__metadata__": {..}}
then the data area (offsets relative to its start). The header is padded with spaces so the data
area starts at a multiple of 8 bytes.

Dtypes: F64, F32, F16, BF16, I64, I32. BF16 is read exactly (uint16 << 16 viewed as float32) and
written from float32 with round-to-nearest-even. Everything is little-endian.

read_header / read_selected serve checkpoints (ref41.py): they read only the named tensors of a
file (seek + read: a shard may be large or sparse), and also hand back one-byte dtypes (F8_E4M3,
F8_E8M0, I8, U8) as raw uint8 codes for the caller to decode; tensors not asked for are never
decoded, whatever their dtype.
"""
import json
import struct

import numpy as np

HEADER_ALIGN = 8
METADATA_KEY = "__metadata__"

# safetensors dtype name -> numpy dtype of the stored bytes
_STORED = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
}
# numpy dtype of an array to write -> default safetensors dtype
_DEFAULT_NAME = {
    np.dtype("float64"): "F64",
    np.dtype("float32"): "F32",
    np.dtype("float16"): "F16",
    np.dtype("int64"): "I64",
    np.dtype("int32"): "I32",
}


def bf16_bits_to_f32(bits):
    """Exact widening of BF16 bit patterns (uint16 array) to float32."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(values):
    """float32 -> BF16 bit patterns with round-to-nearest-even (NaN stays a quiet NaN)."""
    f = np.ascontiguousarray(values, dtype=np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    out = rounded.astype(np.uint16)
    nan = np.isnan(f)
    out[nan] = ((bits[nan] >> 16) | 0x0040).astype(np.uint16)
    return out


def read_full(path):
    """Returns (tensors, dtypes, metadata): tensors are numpy arrays (BF16 widened to float32,
    other dtypes as stored), dtypes maps name -> safetensors dtype name, metadata is a dict."""
    with open(path, "rb") as fh:
        blob = fh.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: file too short for a safetensors header")
    (header_len,) = struct.unpack("<Q", blob[:8])
    if 8 + header_len > len(blob):
        raise ValueError(f"{path}: header length {header_len} exceeds the file size")
    header = json.loads(blob[8:8 + header_len].decode("utf-8"))
    data = memoryview(blob)[8 + header_len:]
    metadata = header.pop(METADATA_KEY, {}) or {}
    tensors, dtypes = {}, {}
    for name, info in header.items():
        dt = info["dtype"]
        if dt not in _STORED:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {dt}")
        shape = [int(s) for s in info["shape"]]
        begin, end = (int(v) for v in info["data_offsets"])
        numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if not (0 <= begin <= end <= len(data)) or end - begin != numel * _STORED[dt].itemsize:
            raise ValueError(f"{path}: tensor {name}: bad data_offsets {begin},{end} for {dt}{shape}")
        arr = np.frombuffer(data[begin:end], dtype=_STORED[dt]).reshape(shape).copy()
        tensors[name] = bf16_bits_to_f32(arr) if dt == "BF16" else arr
        dtypes[name] = dt
    return tensors, dtypes, metadata


_RAW_BYTES = ("F8_E4M3", "F8_E8M0", "I8", "U8", "BOOL")   # read_selected: raw one-byte codes


def read_header(path):
    """Returns ({name: {"dtype", "shape", "data_offsets"}}, metadata, byte offset of the data area)."""
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise ValueError(f"{path}: file too short for a safetensors header")
        (header_len,) = struct.unpack("<Q", head)
        text = fh.read(header_len)
        if len(text) != header_len:
            raise ValueError(f"{path}: header length {header_len} exceeds the file size")
    header = json.loads(text.decode("utf-8"))
    metadata = header.pop(METADATA_KEY, {}) or {}
    return header, metadata, 8 + header_len


def read_selected(path, names):
    """Returns {name: (dtype name, numpy array)} for the listed names present in the file: float and
    integer dtypes as read_full gives them, one-byte dtypes as uint8 codes. Absent names are left out."""
    header, _, data_start = read_header(path)
    out = {}
    with open(path, "rb") as fh:
        for name in names:
            if name not in header:
                continue
            info = header[name]
            dt = info["dtype"]
            stored = _STORED.get(dt, np.dtype("u1") if dt in _RAW_BYTES else None)
            if stored is None:
                raise ValueError(f"{path}: tensor {name}: unsupported dtype {dt}")
            shape = [int(s) for s in info["shape"]]
            begin, end = (int(v) for v in info["data_offsets"])
            numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
            if not 0 <= begin <= end or end - begin != numel * stored.itemsize:
                raise ValueError(f"{path}: tensor {name}: bad data_offsets {begin},{end} for {dt}{shape}")
            fh.seek(data_start + begin)
            blob = fh.read(end - begin)
            if len(blob) != end - begin:
                raise ValueError(f"{path}: tensor {name}: data runs past the end of the file")
            arr = np.frombuffer(blob, dtype=stored).reshape(shape).copy()
            out[name] = (dt, bf16_bits_to_f32(arr) if dt == "BF16" else arr)
    return out


def read(path):
    """Returns {name: numpy array} (see read_full)."""
    return read_full(path)[0]


def write(path, tensors, dtypes=None, metadata=None):
    """Writes {name: array} in insertion order. dtypes optionally maps name -> "BF16"/"F16"/"F32"/...
    to convert a float array on write (BF16 rounds from float32 with round-to-nearest-even);
    otherwise the array's own dtype decides. metadata: {str: str}."""
    dtypes = dtypes or {}
    header, chunks, offset = {}, [], 0
    for name, arr in tensors.items():
        arr = np.asarray(arr)
        dt = dtypes.get(name) or _DEFAULT_NAME.get(arr.dtype)
        if dt is None:
            raise ValueError(f"tensor {name}: cannot store numpy dtype {arr.dtype}")
        if dt == "BF16":
            raw = f32_to_bf16_bits(arr.astype(np.float32))
        else:
            raw = np.ascontiguousarray(arr.astype(_STORED[dt]))
        payload = raw.tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(payload)]}
        chunks.append(payload)
        offset += len(payload)
    if metadata:
        header[METADATA_KEY] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((-(8 + len(text))) % HEADER_ALIGN)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(text)))
        fh.write(text)
        for payload in chunks:
            fh.write(payload)
