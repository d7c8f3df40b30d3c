#!/usr/bin/env -S /usr/bin/python3
"""time_checkpoint.py: how long loading one full-size V4-Flash layer from a released-layout
checkpoint takes (docs/checkpoints.md reports the figures).

Writes, under a temporary directory (deleted at the end), a checkpoint shaped like DeepSeek's
V4-Flash release: NUM_SHARDS shards and a model.safetensors.index.json with ~69,000 names. The
attention tensors of layers 2 (CSA), 3 (HCA) and 43 (the MTP layer, mtp.0.) are real data at full
size in the released dtypes (FP8 E4M3 projections with E8M0 128 x 128 scales, BF16, F32), spread
over several shards; every shard also holds a multi-GB I8 "experts" tensor and ~1,500 small
unrelated tensors. The big tensors are holes (sparse files): the shards are multi-GB on paper but
take no disk and no time to write. Then `dsv4cp weights --weights DIR` loads each layer (index,
shard headers, the layer's bytes, FP8 dequantisation, every value checked), warm (files in the page
cache) and cold (the shards' pages dropped with posix_fadvise(DONTNEED), this machine's disk).

  scripts/time_checkpoint.py [--build build] [--repeats 3]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
import ckptlib as K  # noqa: E402
import layer_spec  # noqa: E402

NUM_SHARDS = 46                  # as V4-Flash's release
EXPERT_HOLE_BYTES = 3 << 30      # a 3 GiB I8 tensor per shard (a hole)
SMALL_PER_SHARD = 1500           # 46 x 1500 = 69,000 names, like the release's 69,187
BLOCK = 128
FLASH = {"hidden_size": 4096, "num_attention_heads": 64, "head_dim": 512, "qk_rope_head_dim": 64, "q_lora_rank": 1024,
         "o_groups": 8, "o_lora_rank": 1024, "sliding_window": 128, "index_n_heads": 64, "index_head_dim": 128,
         "index_topk": 512, "num_hidden_layers": 43, "num_nextn_predict_layers": 1,
         "compress_ratios": [0, 0] + [4 if i % 2 == 0 else 128 for i in range(2, 43)] + [0],
         "rope_theta": 10000, "compress_rope_theta": 160000,
         "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536, "beta_fast": 32,
                          "beta_slow": 1},
         "rms_norm_eps": 1e-6,
         "quantization_config": {"fmt": "e4m3", "quant_method": "fp8", "scale_fmt": "ue8m0",
                                 "weight_block_size": [BLOCK, BLOCK]}}
LAYERS = {2: "layers.2.", 3: "layers.3.", 43: "mtp.0."}


def layer_tensors(rng, layer, prefix):
    """(name, dtype, shape, bytes) of the layer's attention tensors in the released dtypes."""
    lc = layer_spec.layer_config_from_dict(FLASH, layer)
    out = []
    for short, shape in layer_spec.weight_shapes(lc).items():
        name = prefix + short
        n = int(np.prod(shape))
        if short in K.RELEASED_FP8:
            r = rng.integers(0, 254, n, dtype=np.uint8)
            codes = r + (r >= 0x7F)                     # every finite E4M3 code, never 0x7f / 0xff
            scales = np.full((-(-shape[0] // BLOCK), -(-shape[1] // BLOCK)), 127 - 9, dtype=np.uint8)
            out.append((name, "F8_E4M3", shape, codes.astype(np.uint8).tobytes()))
            out.append((name[: -len("weight")] + "scale", "F8_E8M0", scales.shape, scales.tobytes()))
        elif short in K.RELEASED_F32:
            out.append((name, "F32", shape, rng.standard_normal(n).astype(np.float32).tobytes()))
        else:
            out.append((name, "BF16", shape, K.bf16_bits(rng.standard_normal(n).astype(np.float32))[0].tobytes()))
    return out


def build(directory, rng):
    shards = {k: [] for k in range(NUM_SHARDS)}
    placement = {2: (5, 6), 3: (17, 18), 43: (45, 0)}    # each layer over two shards, alternating
    for layer, prefix in LAYERS.items():
        for i, t in enumerate(layer_tensors(rng, layer, prefix)):
            shards[placement[layer][i % 2]].append(t)
    for k in range(NUM_SHARDS):
        shards[k].append((f"layers.{k}.ffn.experts.packed", "I8", [EXPERT_HOLE_BYTES], EXPERT_HOLE_BYTES))
        for j in range(SMALL_PER_SHARD):
            shards[k].append((f"layers.{k}.ffn.experts.{j}.w2.scale", "F8_E8M0", [16], bytes(16)))
    weight_map = {}
    for k, entries in shards.items():
        fname = f"model-{k + 1:05d}-of-{NUM_SHARDS:05d}.safetensors"
        K.write_raw(os.path.join(directory, fname), entries, metadata={"format": "pt"})
        weight_map.update({e[0]: fname for e in entries})
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, fh)
    with open(os.path.join(directory, "config.json"), "w") as fh:
        json.dump(FLASH, fh)
    return len(weight_map)


def drop_cache(directory, sync=False):
    """Evicts the checkpoint's pages from the page cache (clean pages only: sync first once)."""
    for f in os.listdir(directory):
        fd = os.open(os.path.join(directory, f), os.O_RDONLY)
        if sync:
            os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def load(build_dir, directory, layer):
    cmd = [os.path.join(build_dir, "dsv4cp"), "weights", "--config", os.path.join(directory, "config.json"),
           "--layer", str(layer), "--weights", directory]
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if p.returncode:
        raise SystemExit(p.stderr)
    m = re.search(r"(\d+) parameters, ([\d.]+) MB read: loaded and checked in ([\d.]+) s \(index and (\d+) shard "
                  r"headers? ([\d.]+) s, data ([\d.]+) s", p.stdout)
    return int(m[1]), float(m[2]), float(m[3]), int(m[4]), float(m[5]), float(m[6])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    directory = tempfile.mkdtemp(prefix="dsv4-flash-ckpt-")
    try:
        names = build(directory, np.random.default_rng(0))
        drop_cache(directory, sync=True)
        apparent = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory))
        used = sum(os.stat(os.path.join(directory, f)).st_blocks * 512 for f in os.listdir(directory))
        print(f"checkpoint: {NUM_SHARDS} shards, {names} names, {apparent / 1e9:.1f} GB apparent, "
              f"{used / 1e6:.0f} MB on disk")
        print(f"{'layer':>6} {'params':>12} {'MB read':>8} {'shards':>6} {'cache':>5} {'total s':>8} "
              f"{'index+hdr s':>11} {'data s':>7} {'MB/s':>6}")
        for layer in LAYERS:
            for cache in ("cold", "warm"):
                runs = []
                for _ in range(a.repeats):
                    if cache == "cold":
                        drop_cache(directory)
                    runs.append(load(a.build, directory, layer))
                runs.sort(key=lambda r: r[2])
                params, mb, total, shards, hdr, data = runs[len(runs) // 2]      # median by total time
                print(f"{layer:>6} {params:>12,} {mb:>8.1f} {shards:>6} {cache:>5} {total:>8.3f} {hdr:>11.3f} "
                      f"{data:>7.3f} {mb / total:>6.0f}")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
