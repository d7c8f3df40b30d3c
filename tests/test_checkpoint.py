#!/usr/bin/env -S /usr/bin/python3
"""test_checkpoint.py: DeepSeek's released V4 checkpoint layout, loaded as it is (issue 9, SPEC 2).

Builds small checkpoints in the released layout by hand (tests/ckptlib.py: bytes written directly,
FP8 decoded by bits in numpy): several shards and a model.safetensors.index.json, one layer split
across shards (a scale in another shard than its weight), unrelated I8 / F8 / F4 / BF16 tensors,
FP8 E4M3 projections with E8M0 block scales and partial edge blocks, BF16 norms and compressor
weights, F32 sinks and ape, the MTP layer as mtp.0.attn.*; and a single-file variant with the
"model." prefix, F32 scales named weight_scale_inv, 128 x 128 blocks and DeepSeek's inference
config.json (ModelArgs names). Then:
  * dsv4cp run --weights DIR | index | file for the SWA, CSA, HCA and MTP layers at N = 1 and 2
    against tests/ref/ref.py run on the dequantised weights written as F32 (SPEC 8 tolerances);
    gradients must be named after the tensor read (grad.mtp.0.attn.*, grad.model.layers.1.attn.*);
  * dsv4cp weights: the required names without --weights; with --weights the shards opened;
    --export bit-exact against numpy on E4M3 subnormals, 448, E8M0 bytes 0, 127, 254;
  * bad checkpoints each give one clear line per rank: missing shard, tensor absent from its shard,
    scale of the wrong shape, no scale, E8M0 255, E4M3 NaN code, overflow, a shard path leaving the
    directory, an unsupported quantization_config, an unusable dtype, escaped names and dtypes."""
import argparse
import copy
import json
import os
import shutil
import sys

import numpy as np

import ckptlib as K
import testlib as T

sys.path.insert(0, T.REF)
import layer_spec  # noqa: E402

MTP_LAYER = 3
LAYERS = {0: "SWA", 1: "CSA", 2: "HCA", MTP_LAYER: "MTP"}
BLOCK = (16, 12)                 # rows x cols per scale: every FP8 weight has partial edge blocks
DOCS = ((384, 380), (128, 128))  # padded:real; HCA needs >= 128 real tokens per slot; T/2 = 2 x 128
NUM_SHARDS = 4

HF_CONFIG = {
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
    "hidden_size": 32, "num_attention_heads": 4, "head_dim": 16, "qk_rope_head_dim": 8, "q_lora_rank": 24,
    "o_groups": 2, "o_lora_rank": 12, "sliding_window": 8, "index_n_heads": 2, "index_head_dim": 16,
    "index_topk": 4, "compress_ratios": [0, 4, 128, 0], "num_hidden_layers": 3, "num_nextn_predict_layers": 1,
    "n_routed_experts": 4, "moe_intermediate_size": 16, "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536, "beta_fast": 32,
                     "beta_slow": 1},
    "rms_norm_eps": 1e-6,
    "quantization_config": {"fmt": "e4m3", "quant_method": "fp8", "scale_fmt": "ue8m0",
                            "weight_block_size": list(BLOCK)},
}
# the same model in DeepSeek's inference/config.json naming (ModelArgs); no quantization_config: 128 x 128
MODELARGS_CONFIG = {
    "vocab_size": 64, "dim": 32, "moe_inter_dim": 16, "n_layers": 3, "n_heads": 4, "n_routed_experts": 4,
    "q_lora_rank": 24, "head_dim": 16, "rope_head_dim": 8, "o_groups": 2, "o_lora_rank": 12, "window_size": 8,
    "original_seq_len": 65536, "rope_theta": 10000, "rope_factor": 16, "beta_fast": 32, "beta_slow": 1,
    "index_n_heads": 2, "index_head_dim": 16, "index_topk": 4, "dtype": "fp8", "scale_fmt": "ue8m0",
    "compress_rope_theta": 160000, "compress_ratios": [0, 4, 128, 0],
}


class Layout:
    """One checkpoint being built: entries (shard, name, dtype, shape, payload) and the dequantised
    float32 value of every attention tensor (what the reference must see)."""

    def __init__(self):
        self.entries = []
        self.values = {}     # full name -> float32 array

    def add(self, shard, name, dtype, shape, payload):
        self.entries.append([shard, name, dtype, list(shape), payload])

    def sharded(self):
        s = K.Sharded()
        for shard, name, dtype, shape, payload in self.entries:
            s.add(shard, name, dtype, shape, payload)
        return s

    def single(self, path):
        K.write_raw(path, [(n, d, s, p) for _, n, d, s, p in self.entries], metadata={"format": "pt"})


def random_weight(rng, short, shape):
    """Magnitudes as tests/ref/gen_case.py: linear N/sqrt(fan_in), norms 1 + 0.2 N, ape 0.5 N, sink N."""
    if short.endswith("attn_sink"):
        return rng.standard_normal(shape)
    if short.endswith(".ape"):
        return 0.5 * rng.standard_normal(shape)
    if "norm" in short:
        return 1.0 + 0.2 * rng.standard_normal(shape)
    return rng.standard_normal(shape) / np.sqrt(shape[1])


def add_layer(lay, rng, cfg, layer, prefix, shard_of, block, scale_kind="E8M0", scale_suffix="scale"):
    """Adds layer `layer`'s attention tensors under `prefix` in the released dtypes. shard_of(short,
    is_scale) picks the shard of each tensor."""
    lc = layer_spec.layer_config_from_dict(cfg, layer)
    for short, shape in layer_spec.weight_shapes(lc).items():
        w = random_weight(rng, short, shape).astype(np.float32)
        name = prefix + short
        if short in K.RELEASED_FP8:
            codes, scales = K.quantize_fp8(w, block)
            sname = name[: -len("weight")] + "scale" if scale_suffix == "scale" else name + "_scale_inv"
            lay.add(shard_of(short, False), name, "F8_E4M3", shape, codes.tobytes())
            if scale_kind == "E8M0":
                lay.add(shard_of(short, True), sname, "F8_E8M0", scales.shape, scales.tobytes())
                lay.values[name] = K.dequantize(codes, scales, block)
            else:   # F32 scales with the same power-of-two values
                f32 = K.e8m0_decode(scales).astype(np.float32)
                lay.add(shard_of(short, True), sname, "F32", scales.shape, f32.tobytes())
                lay.values[name] = K.dequantize(codes, f32, block)
        elif short in K.RELEASED_F32:
            lay.add(shard_of(short, False), name, "F32", shape, w.tobytes())
            lay.values[name] = w
        else:
            bits, held = K.bf16_bits(w)
            lay.add(shard_of(short, False), name, "BF16", shape, bits.tobytes())
            lay.values[name] = held


def add_unrelated(lay, rng, shard, prefix):
    """Tensors a layer never needs, in the dtypes the released shards mix (I8 packed experts, FP8
    with scales, F4, BF16 norms, F32 hyper-connection parameters)."""
    lay.add(shard, prefix + "attn_norm.weight", "BF16", [32], K.bf16_bits(np.ones(32))[0].tobytes())
    lay.add(shard, prefix + "ffn.experts.0.w1.weight", "I8", [16, 16], rng.integers(0, 256, 256, dtype=np.uint8).tobytes())
    lay.add(shard, prefix + "ffn.experts.0.w1.scale", "F8_E8M0", [16, 1], bytes([255] * 16))  # NaN: never read
    lay.add(shard, prefix + "ffn.shared_experts.w2.weight", "F8_E4M3", [32, 16], bytes([0x7F] * 512))
    lay.add(shard, prefix + "ffn.shared_experts.w2.scale", "F8_E8M0", [1, 1], bytes([127]))
    lay.add(shard, prefix + "ffn.experts.1.w3.weight", "F4", [4, 8], bytes(16))
    lay.add(shard, prefix + "hc_attn_fn", "F32", [24, 128], bytes(24 * 128 * 4))
    lay.add(shard, prefix + "ffn.gate.tid2eid", "I32", [64, 2], bytes(64 * 2 * 4))


def shard_name(k):
    return f"model-{k:05d}-of-{NUM_SHARDS:05d}.safetensors"


def build_sharded(rng):
    """Checkpoint A: four shards; layer 1 split over shards 2 and 3 (wq_b's scale apart from it)."""
    lay = Layout()
    lay.add(shard_name(1), "embed.weight", "BF16", [64, 32], K.bf16_bits(rng.standard_normal((64, 32)))[0].tobytes())
    for layer in (0, 1, 2):
        first = {0: 1, 1: 2, 2: 3}[layer]

        def shard_of(short, is_scale, layer=layer, first=first):
            if layer == 1:   # split: projections and the wq_b scale apart
                if short == "attn.wq_b.weight":
                    return shard_name(3 if is_scale else 2)
                return shard_name(2 if "indexer" in short or short.endswith("norm.weight") else 3)
            return shard_name(first)
        add_layer(lay, rng, HF_CONFIG, layer, f"layers.{layer}.", shard_of, BLOCK)
        add_unrelated(lay, rng, shard_name(first), f"layers.{layer}.")
    add_layer(lay, rng, HF_CONFIG, MTP_LAYER, "mtp.0.", lambda s, sc: shard_name(4), BLOCK)
    add_unrelated(lay, rng, shard_name(4), "mtp.0.")
    lay.add(shard_name(4), "mtp.0.e_proj.weight", "F8_E4M3", [32, 32], bytes(1024))
    lay.add(shard_name(4), "mtp.0.e_proj.scale", "F8_E8M0", [1, 1], bytes([127]))
    lay.add(shard_name(4), "head.weight", "BF16", [64, 32], bytes(64 * 32 * 2))
    return lay


def build_single(rng):
    """Checkpoint B: one file, "model." prefix, F32 scales named weight_scale_inv, 128 x 128 blocks."""
    lay = Layout()
    for layer, prefix in ((1, "model.layers.1."), (MTP_LAYER, "model.mtp.0.")):
        add_layer(lay, rng, HF_CONFIG, layer, prefix, lambda s, sc: "", (128, 128), scale_kind="F32",
                  scale_suffix="weight_scale_inv")
        add_unrelated(lay, rng, "", prefix)
    return lay


def write_inputs(d, rng):
    cu = np.concatenate([[0], np.cumsum([p for p, _ in DOCS])]).astype(np.int32)
    real = np.array([r for _, r in DOCS], dtype=np.int32)
    x = rng.standard_normal((int(cu[-1]), HF_CONFIG["hidden_size"])).astype(np.float32)
    T.st.write(os.path.join(d, "in.safetensors"), {"x": x, "cu_seqlens": cu, "seqlens_real": real})
    T.st.write(os.path.join(d, "grad.safetensors"), {"dout": rng.standard_normal(x.shape).astype(np.float32)})


def reference(work, name, lay, layer, prefix):
    """ref.py on the dequantised weights (F32, named layers.L. as ref.py reads them); gradient names
    renamed to the checkpoint's prefix. Returns the expected-output path."""
    d = os.path.join(work, "ref_" + name)
    os.makedirs(d, exist_ok=True)
    cfg = copy.deepcopy(HF_CONFIG)
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    short = {n[len(prefix):]: v for n, v in lay.values.items() if n.startswith(prefix)}
    T.st.write(os.path.join(d, "w.safetensors"), {f"layers.{layer}.{s}": v for s, v in short.items()})
    exp = os.path.join(d, "exp_raw.safetensors")
    rc, out, err = T.run([T.PYTHON, os.path.join(T.REF, "ref.py"), "--config", os.path.join(d, "config.json"),
                          "--layer", str(layer), "--weights", os.path.join(d, "w.safetensors"),
                          "--input", os.path.join(work, "in.safetensors"),
                          "--grad-output", os.path.join(work, "grad.safetensors"), "--output", exp], timeout=300)
    if rc != 0:
        raise RuntimeError(f"ref.py failed: {err.strip()[-300:]}")
    tensors, dtypes, meta = T.st.read_full(exp)
    renamed = {(("grad." + prefix + k[len(f"grad.layers.{layer}."):]) if k.startswith(f"grad.layers.{layer}.") else k): v
               for k, v in tensors.items()}
    path = os.path.join(d, "exp.safetensors")
    T.st.write(path, renamed, metadata=meta)
    return path


def run_layer(build, work, label, config, layer, weights, exp, nranks):
    out = os.path.join(work, f"got_{label}_n{nranks}.safetensors")
    if os.path.exists(out):
        os.remove(out)
    rc, o, e = T.cli(build, ["run", "--config", config, "--layer", str(layer), "--weights", weights,
                             "--input", os.path.join(work, "in.safetensors"),
                             "--grad-output", os.path.join(work, "grad.safetensors"), "--output", out],
                     nranks=nranks, timeout=300)
    if rc != 0:
        return T.check(False, f"checkpoint {label} N={nranks}", f"exit {rc}: {e.strip()[-300:]}")
    ok, line = T.compare_ref(out, exp, f"{label} N={nranks}")
    return T.check(ok, f"checkpoint {label} N={nranks} vs float64 reference on the dequantised weights", line)


def expect_error(build, name, args, needles, nranks=1):
    """One line per rank, all equal, starting 'dsv4cp: error:' and containing every needle."""
    rc, out, err = T.cli(build, args, nranks=nranks, timeout=120)
    lines = [l for l in err.splitlines() if l.strip()]
    ok = rc not in (0, -9) and 0 < rc < 128 and len(lines) == nranks and len(set(lines)) == 1 \
        and lines[0].startswith("dsv4cp: error:") and all(n in lines[0] for n in needles)
    return T.check(ok, f"checkpoint error: {name}", f"exit {rc}: {' | '.join(lines)[:400]}")


def test_runs(build, work, A, B, dir_a, index_a, file_b, cfg_a, cfg_b):
    for layer, kind in LAYERS.items():
        prefix = "mtp.0." if layer == MTP_LAYER else f"layers.{layer}."
        try:
            exp = reference(work, f"a{layer}", A, layer, prefix)
        except RuntimeError as e:
            T.check(False, f"checkpoint {kind} reference", str(e))
            continue
        for nranks in (1, 2):
            weights = dir_a if (layer + nranks) % 2 else index_a   # both forms for every layer
            run_layer(build, work, f"{kind} layer {layer} ({'dir' if weights == dir_a else 'index'})", cfg_a, layer,
                      weights, exp, nranks)
    for layer, prefix in ((1, "model.layers.1."), (MTP_LAYER, "model.mtp.0.")):
        try:
            exp = reference(work, f"b{layer}", B, layer, prefix)
        except RuntimeError as e:
            T.check(False, f"checkpoint single-file reference {layer}", str(e))
            continue
        for nranks in ((1, 2) if layer == 1 else (1,)):
            run_layer(build, work, f"{LAYERS[layer]} layer {layer} (one file, model. prefix, F32 weight_scale_inv, "
                      "ModelArgs config)", cfg_b, layer, file_b, exp, nranks)


def test_weights_command(build, work, dir_a, cfg_a):
    rc, o, e = T.cli(build, ["weights", "--config", cfg_a, "--layer", str(MTP_LAYER)])
    T.check(rc == 0 and "mtp.0.attn.wq_a.weight" in o and "[24, 32]" in o and "layers.3." not in o,
            "weights without --weights: the MTP layer's names and shapes", (o + e)[-300:])
    rc, o, e = T.cli(build, ["weights", "--config", cfg_a, "--layer", "1", "--weights", dir_a])
    T.check(rc == 0 and f"{NUM_SHARDS} shards, 2 opened" in o and "dequantised" in o and shard_name(3) in o
            and "layers.1.attn.indexer.wq_b.weight" in o and "loaded and checked" in o,
            "weights --weights DIR: layer 1's tensors from the 2 of 4 shards holding them", (o + e)[-400:])
    T.check(all(f"layers.1.attn.{t}" in o for t in ("wq_b.scale", "compressor.ape", "indexer.compressor.norm.weight")),
            "weights listing shows scales, F32 and BF16 tensors")


def test_exact_export(build, work, rng):
    """E4M3 codes of every finite value, E8M0 scale bytes 0, 1, 127, 254 (with |code| < 2 where the
    product would overflow): --export must equal numpy's decoding by bits, bit for bit."""
    d = os.path.join(work, "exact")
    lay = Layout()
    add_layer(lay, rng, HF_CONFIG, 0, "layers.0.", lambda s, sc: shard_name(1), BLOCK)
    name = "layers.0.attn.wq_a.weight"
    rows, cols = 24, 32
    finite = np.array([c for c in range(256) if c not in K.E4M3_NAN], dtype=np.uint8)
    codes = np.resize(finite, rows * cols).reshape(rows, cols)
    scales = np.array([[0, 127, 254], [1, 126, 133]], dtype=np.uint8)
    small = finite[(finite & 0x7F) < 0x40]                 # |value| < 2: times 2^127 stays finite
    codes[0:16, 24:32] = np.resize(small, 16 * 8).reshape(16, 8)
    for e in lay.entries:
        if e[1] == name:
            e[4] = codes.tobytes()
        if e[1] == "layers.0.attn.wq_a.scale":
            e[4] = scales.tobytes()
    lay.sharded().save(d)
    out = os.path.join(work, "export.safetensors")
    rc, o, e = T.cli(build, ["weights", "--config", os.path.join(work, "config_a.json"), "--layer", "0",
                             "--weights", d, "--export", out])
    got = T.load(out) if rc == 0 else {}
    want = K.dequantize(codes, scales, BLOCK)
    ok = name in got and got[name].dtype == np.float32 and np.array_equal(got[name].view(np.uint32), want.view(np.uint32))
    T.check(ok, "export: E4M3 all finite codes x E8M0 0/1/127/254 blocks, bit-exact (subnormals, 448, 2^127)",
            (e.strip()[-200:] if rc else ""))
    T.check(rc == 0 and set(got) == {n for _, n, _, _, _ in lay.entries if n.startswith("layers.0.attn.")
                                     and not n.endswith(".scale")},
            "export writes every tensor of the layer under its full name, no scales")
    tiny = want[0:16, 0:12]
    T.check(ok and float(np.abs(tiny[tiny != 0]).min()) == 2.0 ** -136, "export: 2^-9 x 2^-127 = 2^-136 kept (no flush to zero)")


def variant(work, A, name, change, extra_map=None, config=None):
    """A copy of checkpoint A changed by change(entries) (entries editable in place)."""
    lay = Layout()
    lay.entries = copy.deepcopy(A.entries)
    change(lay.entries)
    d = os.path.join(work, "bad_" + name)
    shutil.rmtree(d, ignore_errors=True)
    index = lay.sharded().save(d, weight_map_extra=extra_map)
    if config:
        json.dump(config, open(os.path.join(d, "config.json"), "w"))
    return d, index


def entry(entries, name):
    return next(e for e in entries if e[1] == name)


def test_errors(build, work, A, cfg_a):
    base = ["--layer", "1", "--seq", "64", "--output", os.path.join(work, "err_out.safetensors")]

    def run_args(weights, config=cfg_a):
        return ["run", "--config", config, "--weights", weights] + base

    d, _ = variant(work, A, "noshard", lambda es: None)
    os.remove(os.path.join(d, shard_name(3)))
    expect_error(build, "missing shard", run_args(d), [shard_name(3), "cannot be read", "No such file"])
    expect_error(build, "missing shard, 2 ranks", run_args(d), [shard_name(3)], nranks=2)

    def drop(n):
        return lambda es: es.remove(entry(es, n))
    d, idx = variant(work, A, "absent", drop("layers.1.attn.wkv.weight"),
                     extra_map={"layers.1.attn.wkv.weight": shard_name(3)})
    expect_error(build, "tensor listed in the index but absent from its shard", run_args(idx),
                 ["layers.1.attn.wkv.weight", "not in this shard", shard_name(3)])

    def bad_scale(es):
        e = entry(es, "layers.1.attn.wq_a.scale")
        e[3], e[4] = [1, 3], e[4][:3]
    d, _ = variant(work, A, "scaleshape", bad_scale)
    expect_error(build, "scale of the wrong shape", run_args(d), ["layers.1.attn.wq_a.scale", "[1, 3]", "[2, 3]"])
    d, _ = variant(work, A, "noscale", drop("layers.1.attn.wkv.scale"))
    expect_error(build, "FP8 weight without a scale", run_args(d), ["layers.1.attn.wkv.weight", "no scale"])

    def set_byte(n, i, v):
        def change(es):
            e = entry(es, n)
            b = bytearray(e[4])
            b[i] = v
            e[4] = bytes(b)
        return change
    d, _ = variant(work, A, "e8m0nan", set_byte("layers.1.attn.wq_b.scale", 1, 255))
    expect_error(build, "E8M0 byte 255 (NaN scale)", run_args(d), ["layers.1.attn.wq_b.scale", "NaN", "0xff"])
    d, _ = variant(work, A, "e4m3nan", set_byte("layers.1.attn.wkv.weight", 5, 0xFF))
    expect_error(build, "E4M3 NaN code", run_args(d), ["layers.1.attn.wkv.weight", "NaN code"])

    def overflow(es):
        set_byte("layers.1.attn.wkv.scale", 0, 254)(es)
        set_byte("layers.1.attn.wkv.weight", 0, 0x7E)(es)
    d, _ = variant(work, A, "overflow", overflow)
    expect_error(build, "448 x 2^127 overflows", run_args(d), ["layers.1.attn.wkv.weight", "infinite"])
    d, idx = variant(work, A, "escape", lambda es: None, extra_map={"layers.1.attn.wq_a.weight": "../outside.safetensors"})
    expect_error(build, "index shard path leaving its directory", run_args(idx),
                 ["../outside.safetensors", "outside the index's directory"])
    cfg = copy.deepcopy(HF_CONFIG)
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4}
    d, _ = variant(work, A, "awq", lambda es: None, config=cfg)
    expect_error(build, "unsupported quantization_config", run_args(d, os.path.join(d, "config.json")),
                 ["quantization_config.quant_method", "awq"])
    cfg["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    expect_error(build, "block size of the config disagrees with the scales", run_args(d, os.path.join(d, "config.json")),
                 ["scale", "128 x 128"])

    def retype(n, dtype):
        return lambda es: entry(es, n).__setitem__(2, dtype)
    d, _ = variant(work, A, "i8", retype("layers.1.attn.q_norm.weight", "I16"))
    expect_error(build, "needed tensor of an unusable dtype", run_args(d), ["layers.1.attn.q_norm.weight", "dtype I16"])
    d, _ = variant(work, A, "escdtype", retype("layers.1.attn.q_norm.weight", "F\n16\x1b[31m"))
    expect_error(build, "a dtype with a newline and an escape code is printed escaped, on one line", run_args(d),
                 ["layers.1.attn.q_norm.weight", "F\\x0a16\\x1b[31m"])
    d, idx = variant(work, A, "escname", lambda es: None,
                     extra_map={"layers.1.attn.wq_a.weight": "evil\nname\x1b[31m.safetensors"})
    expect_error(build, "a shard name with a newline and an escape code is printed escaped, on one line",
                 run_args(idx), ["evil\\x0aname\\x1b[31m.safetensors"], nranks=2)
    two = os.path.join(work, "bad_twofiles")
    shutil.rmtree(two, ignore_errors=True)
    os.makedirs(two)
    for k in (1, 2):
        K.write_raw(os.path.join(two, f"part{k}.safetensors"), [])
    expect_error(build, "directory with two files and no index", run_args(two), ["2 .safetensors files", "index"])


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--build", default="build")
    a = p.parse_args()
    work = os.path.join(T.golden_dir(a.build), "checkpoint")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    rng = np.random.default_rng(2024)
    A, B = build_sharded(rng), build_single(rng)
    dir_a = os.path.join(work, "flash_like")
    index_a = A.sharded().save(dir_a)
    file_b = os.path.join(work, "single.safetensors")
    B.single(file_b)
    cfg_a, cfg_b = os.path.join(work, "config_a.json"), os.path.join(work, "config_b.json")
    json.dump(HF_CONFIG, open(cfg_a, "w"), indent=1)
    json.dump(MODELARGS_CONFIG, open(cfg_b, "w"), indent=1)
    write_inputs(work, rng)
    test_runs(a.build, work, A, B, dir_a, index_a, file_b, cfg_a, cfg_b)
    test_weights_command(a.build, work, dir_a, cfg_a)
    test_exact_export(a.build, work, rng)
    test_errors(a.build, work, A, cfg_a)
    return T.finish()


if __name__ == "__main__":
    sys.exit(main())
