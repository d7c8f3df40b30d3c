#!/usr/bin/env -S /usr/bin/python3
"""make_seeds.py: writes the seed corpus of the fuzz harnesses (tests/fuzz/corpus/NAME/*), small
valid and near-valid inputs each harness starts from. Run it again after changing an input format;
the files are committed so that `make fuzz` needs no Python."""
import json
import os
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "ref"))
import ckptlib as K  # noqa: E402
import layer_spec  # noqa: E402

# the config fuzz_safetensors.c loads layers 1 (CSA) and 3 (MTP) of (4 x 4 FP8 blocks, as here)
FUZZ_CFG = {"hidden_size": 16, "num_attention_heads": 2, "head_dim": 8, "qk_rope_head_dim": 4, "q_lora_rank": 8,
            "o_groups": 1, "o_lora_rank": 4, "sliding_window": 4, "index_n_heads": 1, "index_head_dim": 8,
            "index_topk": 2, "compress_ratios": [0, 4, 128, 0], "num_hidden_layers": 3,
            "rope_theta": 10000.0, "compress_rope_theta": 160000.0, "rms_norm_eps": 1e-6,
            "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                             "beta_fast": 32, "beta_slow": 1},
            "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                    "weight_block_size": [4, 4]}}


def out(name, fname, data):
    d = os.path.join(HERE, "corpus", name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, fname), "wb") as fh:
        fh.write(data if isinstance(data, bytes) else data.encode())


def st_bytes(entries):
    path = os.path.join(HERE, ".seed.tmp")
    K.write_raw(path, entries)
    data = open(path, "rb").read()
    os.remove(path)
    return data


def layer_entries(layer, prefix, f32_scales=False):
    rng = np.random.default_rng(layer)
    lc = layer_spec.layer_config_from_dict(FUZZ_CFG, layer)
    entries = []
    for short, shape in layer_spec.weight_shapes(lc).items():
        w = (rng.standard_normal(shape) * 0.3).astype(np.float32)
        name = prefix + short
        if short in K.RELEASED_FP8:
            codes, scales = K.quantize_fp8(w, (4, 4))
            entries.append((name, "F8_E4M3", shape, codes.tobytes()))
            if f32_scales:
                entries.append((name + "_scale_inv", "F32", scales.shape,
                                K.e8m0_decode(scales).astype(np.float32).tobytes()))
            else:
                entries.append((name[:-len("weight")] + "scale", "F8_E8M0", scales.shape, scales.tobytes()))
        elif "norm" in short and "weight" in short:
            entries.append((name, "BF16", shape, K.bf16_bits(w + 1)[0].tobytes()))
        else:
            entries.append((name, "F32", shape, w.tobytes()))
    return entries


def main():
    # safetensors reader + weight loader
    out("safetensors", "csa_layer_fp8", st_bytes(layer_entries(1, "layers.1.")))
    out("safetensors", "mtp_model_prefix_f32_scales", st_bytes(layer_entries(3, "model.mtp.0.", f32_scales=True)))
    out("safetensors", "mixed_dtypes", st_bytes([
        ("i8", "I8", [2, 3], bytes(range(6))), ("f4", "F4", [4], bytes(2)), ("e", "F8_E8M0", [2], bytes([0, 255])),
        ("q", "F8_E4M3", [2], bytes([0x7e, 0x7f])), ("b", "BF16", [2], struct.pack("<2H", 0x3f80, 0x7fc0)),
        ("h", "F16", [1], struct.pack("<H", 0x7c00)), ("l", "I64", [1], struct.pack("<q", 1 << 40)),
        ("d", "F64", [1], struct.pack("<d", 1e300)), ("u", "U16", [1], bytes(2)), ("z", "F32", [0, 3], b"")]))
    full = st_bytes(layer_entries(1, "layers.1."))
    out("safetensors", "truncated", full[: len(full) // 2])
    out("safetensors", "empty_header", struct.pack("<Q", 2) + b"{}")
    # config.json
    out("config", "released_like.json", json.dumps(FUZZ_CFG))
    out("config", "modelargs.json", json.dumps({
        "dim": 16, "n_heads": 2, "head_dim": 8, "rope_head_dim": 4, "q_lora_rank": 8, "o_groups": 1, "o_lora_rank": 4,
        "window_size": 4, "index_n_heads": 1, "index_head_dim": 8, "index_topk": 2, "compress_ratios": [0, 4, 128, 0],
        "n_layers": 3, "original_seq_len": 65536, "rope_factor": 16, "beta_fast": 32, "beta_slow": 1,
        "compress_rope_theta": 160000, "norm_eps": 1e-6, "dtype": "fp8", "scale_fmt": "ue8m0"}))
    out("config", "mixed_naming.json", json.dumps(dict(FUZZ_CFG, dim=16, window_size=4, rope_factor=16)))
    out("config", "no_yarn.json", json.dumps(dict(FUZZ_CFG, rope_scaling=None, quantization_config=None)))
    out("config", "big_numbers.json", '{"hidden_size": 1e300, "compress_ratios": [4, -1e308, 2147483648]}')
    # model.safetensors.index.json
    wm = {f"layers.1.{s}": f"model-0000{i % 3 + 1}-of-00003.safetensors"
          for i, s in enumerate(layer_spec.weight_shapes(layer_spec.layer_config_from_dict(FUZZ_CFG, 1)))}
    out("index", "sharded.json", json.dumps({"metadata": {"total_size": 1234}, "weight_map": wm}))
    out("index", "model_prefix.json", json.dumps({"weight_map": {"model." + k: "sub/" + v for k, v in wm.items()}}))
    out("index", "escaping.json", json.dumps({"weight_map": {"layers.1.attn.wq_a.weight": "../x.safetensors",
                                                             "b": "/abs.safetensors", "c": ""}}))
    out("index", "self.json", json.dumps({"weight_map": {"layers.1.attn.wq_a.weight": "model.safetensors.index.json"}}))
    out("index", "duplicate.json", '{"weight_map": {"a": "x.safetensors", "a": "y.safetensors"}}')
    # the link tree fuzz_index.c plants: every way out of the directory, and the ways that stay in
    for i, route in enumerate(("out.safetensors", "up/outside.safetensors", "abs/outside.safetensors",
                               "root/etc/passwd", "self/up/outside.safetensors", "loop/x.safetensors",
                               "e.safetensors", "r.safetensors", "up/r/e.safetensors")):
        out("index", f"link_out_{i}.json", json.dumps({"weight_map": {"outside_marker": route,
                                                                      "refs_marker": route}}))
    out("index", "link_inside.json", json.dumps({"weight_map": {
        "inside_marker": "self/sub/x.safetensors", "blob_marker": "s.safetensors", "b": "sub/x.safetensors",
        "c": "up/r/s.safetensors"}}))
    # packing: n_docs, flags, size, rank, layer, T (int16), int16 cu_seqlens then seqlens_real
    def packing(n_docs, flags, size, rank, layer, T, cu, real=()):
        return struct.pack("<BBBbBh", n_docs, flags, size - 1, rank, layer, T) + struct.pack(f"<{len(cu) + len(real)}h",
                                                                                             *cu, *real)
    out("packing", "one_doc", packing(1, 1, 2, 0, 1, 64, [0, 64]))
    out("packing", "docs_padded", packing(3, 3, 2, 1, 1, 96, [0, 40, 64, 96], [37, 24, 30]))
    out("packing", "zigzag", packing(2, 1 | 8, 2, 1, 2, 512, [0, 256, 512]))
    out("packing", "batched", packing(2, 1 | 4, 4, 3, 0, 128, [0, 64, 128]))
    out("packing", "no_cu", packing(0, 0, 3, 2, 1, 96, []))


if __name__ == "__main__":
    main()
