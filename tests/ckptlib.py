"""ckptlib.py: checkpoints in the layout of DeepSeek's released V4 files, written by hand for the
tests (torch 1.13 has no float8 and no `safetensors` package is installed), and FP8 decoded by bits
in numpy, independently of the C library.

* write_raw(path, entries): a safetensors file from (name, dtype string, shape, payload) entries;
  the payload is bytes, or an int (that many bytes left as a hole: sparse, no disk, reads as 0).
  Any dtype string is written as given (I8, F8_E4M3, or a malformed one for error tests).
* e4m3_decode / e8m0_decode: the byte formats of SPEC 2, from the bits (sign, exponent, mantissa),
  never by casting the byte as a number.
* quantize_fp8(w, block): E4M3 codes and E8M0 scale bytes of a float matrix, one power-of-two scale
  per block (the last block row/column partial). The tests never trust it: the reference always
  uses e4m3_decode(codes) * e8m0_decode(scale), whatever the quantizer chose.
* Sharded(...): spreads named entries over several shards and writes model.safetensors.index.json.
"""
import json
import os
import struct

import numpy as np

# dtypes of one layer's attention tensors in DeepSeek's released files (the rest are BF16)
RELEASED_FP8 = ("attn.wq_a.weight", "attn.wq_b.weight", "attn.wkv.weight", "attn.wo_a.weight", "attn.wo_b.weight",
                "attn.indexer.wq_b.weight")           # F8_E4M3 with an F8_E8M0 scale
RELEASED_F32 = ("attn.attn_sink", "attn.compressor.ape", "attn.indexer.compressor.ape")
HEADER_ALIGN = 8
E4M3_NAN = (0x7F, 0xFF)
E8M0_NAN = 0xFF
E8M0_BIAS = 127
E4M3_MAX = 448.0
BF16_DTYPE = "BF16"


def write_raw(path, entries, metadata=None):
    """entries: list of (name, dtype, shape, payload); payload bytes or an int (a hole of that size)."""
    header, offset = {}, 0
    for name, dtype, shape, payload in entries:
        n = payload if isinstance(payload, int) else len(payload)
        header[name] = {"dtype": dtype, "shape": [int(s) for s in shape], "data_offsets": [offset, offset + n]}
        offset += n
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((-(8 + len(text))) % HEADER_ALIGN)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(text)))
        fh.write(text)
        start = fh.tell()
        for _, _, _, payload in entries:
            if isinstance(payload, int):
                fh.seek(payload, os.SEEK_CUR)
            else:
                fh.write(payload)
        fh.truncate(start + offset)


def e4m3_decode(codes):
    """float64 values of E4M3 bytes: e == 0: m * 2^-9; else (8 + m) * 2^(e - 10); 0x7f/0xff NaN."""
    c = np.asarray(codes, dtype=np.uint8).astype(np.int64)
    sign = np.where(c >> 7, -1.0, 1.0)
    e, m = (c >> 3) & 15, c & 7
    mag = np.where(e == 0, m * 2.0 ** -9, (8 + m) * np.exp2((e - 10).astype(np.float64)))
    out = sign * mag
    out[(e == 15) & (m == 7)] = np.nan
    return out


def e8m0_decode(b):
    """float64 values of E8M0 bytes: 2^(b - 127); 255 is NaN."""
    b = np.asarray(b, dtype=np.uint8).astype(np.float64)
    out = np.exp2(b - E8M0_BIAS)
    out[b == E8M0_NAN] = np.nan
    return out


def _e4m3_table():
    """The 127 non-negative finite E4M3 values (codes 0..0x7e), ascending."""
    return e4m3_decode(np.arange(0x7F, dtype=np.uint8))


def quantize_fp8(w, block):
    """(codes uint8 [rows, cols], scale bytes uint8 [ceil(rows/b0), ceil(cols/b1)]) for float w."""
    w = np.asarray(w, dtype=np.float64)
    rows, cols = w.shape
    b0, b1 = block
    sr, sc = -(-rows // b0), -(-cols // b1)
    scales = np.zeros((sr, sc), dtype=np.uint8)
    codes = np.zeros((rows, cols), dtype=np.uint8)
    table = _e4m3_table()
    for i in range(sr):
        for j in range(sc):
            blk = w[i * b0:(i + 1) * b0, j * b1:(j + 1) * b1]
            amax = float(np.abs(blk).max())
            exp = int(np.ceil(np.log2(amax / E4M3_MAX))) if amax > 0 else 0
            exp = min(max(exp, -E8M0_BIAS), E8M0_BIAS)
            scales[i, j] = exp + E8M0_BIAS
            q = np.abs(blk) / 2.0 ** exp
            idx = np.abs(q[..., None] - table).argmin(axis=-1).astype(np.uint8)
            codes[i * b0:(i + 1) * b0, j * b1:(j + 1) * b1] = idx | np.where(blk < 0, 0x80, 0).astype(np.uint8)
    return codes, scales


def dequantize(codes, scales, block):
    """W[n][k] = e4m3(codes[n][k]) * e8m0(scales[n // b0][k // b1]) as float32 (exact)."""
    b0, b1 = block
    s = e8m0_decode(scales) if scales.dtype == np.uint8 else scales.astype(np.float64)
    full = np.repeat(np.repeat(s, b0, axis=0), b1, axis=1)[: codes.shape[0], : codes.shape[1]]
    return (e4m3_decode(codes) * full).astype(np.float32)


def bf16_bits(values):
    """float32 -> BF16 bit patterns (round to nearest even) and the float32 values they hold."""
    f = np.ascontiguousarray(values, dtype=np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    b = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return b, (b.astype(np.uint32) << 16).view(np.float32)


class Sharded:
    """Named entries spread over shards; save() writes them and the index into a directory."""

    def __init__(self):
        self.shards = {}     # file name -> list of entries

    def add(self, shard, name, dtype, shape, payload):
        self.shards.setdefault(shard, []).append((name, dtype, shape, payload))

    def save(self, directory, index_name="model.safetensors.index.json", weight_map_extra=None):
        os.makedirs(directory, exist_ok=True)
        weight_map, total = {}, 0
        for shard, entries in self.shards.items():
            write_raw(os.path.join(directory, shard), entries, metadata={"format": "pt"})
            for name, _, _, payload in entries:
                weight_map[name] = shard
                total += payload if isinstance(payload, int) else len(payload)
        weight_map.update(weight_map_extra or {})
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        path = os.path.join(directory, index_name)
        with open(path, "w") as fh:
            json.dump(index, fh, indent=1)
        return path
