"""ckptlib41.py: a hand-made checkpoint in the layout of DeepSeek's released V4.1 files (SPEC 10
"Weights", shared/notes/v41.md "Released checkpoint"), for the tests of the loader and of a layer
range run on released weights.

What it writes (write_released):
  * config.json in the released nesting: the text keys under `text_config` (model_type
    deepseek_v41_text, plus MoE / Engram / mHC keys the attention ignores), `quantization_config`
    at the top with weight_block_size [32, 32], a `vision_config`;
  * model.safetensors.index.json and several shards; bare names `layers.{L}.attn.*`;
  * per layer, only what its role reads (layer_spec41): wq_a, wq_b, wkv, wo_a, wo_b and
    indexer.wq_b as F8_E4M3 with F8_E8M0 scales of 32 x 32 blocks (partial edge blocks where a
    dimension is not a multiple of 32: every tiny41 projection has some); q_norm, kv_norm,
    compressor.*, indexer.wk, indexer.k_norm, indexer.weights_proj as BF16; attn_sink as F32;
  * tensors the attention never reads, in the dtypes the release mixes: I8 packed FP4 experts with
    per-32 E8M0 scales (one scale byte is 255 = NaN: reading it would be an error), Engram tables
    (F8_E4M3 rows with per-row E8M0 scales, in the last shard, away from their layers), vision
    tensors, hyper-connection parameters (F32), a DSpark stage (mtp.0.*), embed / head;
  * one layer split over two shards (wq_b's scale in another shard than wq_b).
The dequantised value of every attention tensor (float64, exact: E4M3 * 2^k) is returned, so a
test can write them as F64 and run tests/ref/ref41.py on them (Released.write_dequantized).

Byte formats and the FP8 quantiser come from tests/ckptlib.py (imported, not duplicated).
"""
import json
import os
import sys

import numpy as np

sys.dont_write_bytecode = True   # before the imports below: no __pycache__ in tests/
import ckptlib as K  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "ref"))
import gen_case41  # noqa: E402
import layer_spec41 as spec  # noqa: E402
import st  # noqa: E402

RELEASED_BLOCK = (32, 32)      # V4.1's FP8 weight_block_size (V4: 128 x 128)
N_SHARDS = 4
ENGRAM_LAYERS = (1,)           # where the unrelated Engram table is named (it sits in the last shard)
EXPERT_GROUP = 32              # FP4 experts: one E8M0 scale per 32 values


def shard_name(k, n=N_SHARDS):
    return f"model-{k:05d}-of-{n:05d}.safetensors"


def released_config(text_config, block=RELEASED_BLOCK):
    """The released nesting around flat V4.1 text keys."""
    text = {"model_type": "deepseek_v41_text", **text_config,
            "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
            "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6,
            "engram_layer_ids": list(ENGRAM_LAYERS), "engram_num_embeddings": [48], "engram_head_dim": 32,
            "num_nextn_predict_layers": 1, "vocab_size": 64}
    return {"architectures": ["DeepseekV41ForConditionalGeneration"], "model_type": "deepseek_v41",
            "text_config": text,
            "vision_config": {"model_type": "deepseek_v41_vision", "hidden_size": 16, "num_hidden_layers": 1},
            "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                    "activation_scheme": "dynamic", "weight_block_size": list(block)},
            "torch_dtype": "bfloat16"}


class Released:
    """A checkpoint being built: entries per shard and the dequantised attention tensors."""

    def __init__(self, config):
        self.config = config
        self.sharded = K.Sharded()
        self.values = {}           # full name -> float64 array (what the reference must see)
        self.directory = None

    def add(self, shard, name, dtype, shape, payload):
        self.sharded.add(shard, name, dtype, list(shape), payload)

    def add_weight(self, shard_of, name, short, w, block):
        """One attention tensor in its released dtype; shard_of(is_scale) picks the shard."""
        if short in spec.FP8_WEIGHTS:
            codes, scales = K.quantize_fp8(w, block)
            self.add(shard_of(False), name, "F8_E4M3", w.shape, codes.tobytes())
            self.add(shard_of(True), name[: -len("weight")] + "scale", "F8_E8M0", scales.shape, scales.tobytes())
            full = np.repeat(np.repeat(K.e8m0_decode(scales), block[0], 0), block[1], 1)[: w.shape[0], : w.shape[1]]
            self.values[name] = K.e4m3_decode(codes) * full
        elif short in spec.F32_WEIGHTS:
            self.add(shard_of(False), name, "F32", w.shape, w.astype(np.float32).tobytes())
            self.values[name] = w.astype(np.float32).astype(np.float64)
        else:
            bits, held = K.bf16_bits(w)
            self.add(shard_of(False), name, "BF16", w.shape, bits.tobytes())
            self.values[name] = held.astype(np.float64)

    def save(self, directory):
        self.directory = directory
        self.index_path = self.sharded.save(directory)
        self.config_path = os.path.join(directory, "config.json")
        with open(self.config_path, "w") as fh:
            json.dump(self.config, fh, indent=1)
        return self.index_path

    def write_dequantized(self, path):
        """The attention tensors as F64 (exact), named as stored: a weights file for ref41.py."""
        st.write(path, {k: v for k, v in self.values.items()})
        return path


def add_unrelated(ck, rng, layer, shard, dim):
    """Tensors of layer `layer` outside the attention, in the release's dtypes."""
    p = f"layers.{layer}."
    ck.add(shard, p + "attn_norm.weight", "BF16", [dim], K.bf16_bits(np.ones(dim))[0].tobytes())
    packed = rng.integers(0, 256, 8 * dim, dtype=np.uint8)                 # two FP4 values per byte
    ck.add(shard, p + "ffn.experts.0.w1.weight", "I8", [16, dim // 2], packed.tobytes())
    scale = np.full((16, dim // EXPERT_GROUP or 1), 127, dtype=np.uint8)
    scale[0, 0] = K.E8M0_NAN                                   # never read: no error
    ck.add(shard, p + "ffn.experts.0.w1.scale", "F8_E8M0", scale.shape, scale.tobytes())
    ck.add(shard, p + "ffn.shared_experts.w2.weight", "F8_E4M3", [dim, 16], bytes([0x7F] * (16 * dim)))  # NaN codes
    ck.add(shard, p + "ffn.shared_experts.w2.scale", "F8_E8M0", [1, 1], bytes([127]))
    ck.add(shard, p + "ffn.gate.weight", "BF16", [4, dim], bytes(8 * dim))
    ck.add(shard, p + "hc_attn_fn", "F32", [24, 4 * dim], bytes(24 * 4 * dim * 4))
    ck.add(shard, p + "hc_attn_base", "F32", [24], bytes(96))
    ck.add(shard, p + "hc_attn_scale", "F32", [3], bytes(12))


def add_engram(ck, rng, last_shard, rows, head_dim):
    """Engram tables: F8 rows with per-row E8M0 scales, in the last shard."""
    for layer in ENGRAM_LAYERS:
        p = f"layers.{layer}.engram."
        ck.add(last_shard, p + "embed.weight", "F8_E4M3", [rows, head_dim],
               rng.integers(0, 0x7E, rows * head_dim, dtype=np.uint8).tobytes())
        ck.add(last_shard, p + "embed.scale", "F8_E8M0", [rows, head_dim // 32], bytes([120] * (rows * head_dim // 32)))
        ck.add(last_shard, p + "wkv.weight", "BF16", [16, 8], bytes(256))


def add_vision_and_heads(ck, first_shard, last_shard, dim):
    ck.add(first_shard, "embed.weight", "BF16", [64, dim], bytes(64 * dim * 2))
    ck.add(first_shard, "vision.patch_embed.weight", "BF16", [16, 3, 2, 2], bytes(16 * 12 * 2))
    ck.add(first_shard, "vision.blocks.0.attn.qkv.weight", "BF16", [48, 16], bytes(48 * 16 * 2))
    ck.add(last_shard, "aligner.proj.weight", "BF16", [dim, 16], bytes(dim * 16 * 2))
    ck.add(last_shard, "mtp.0.attn.wq_a.weight", "F8_E4M3", [24, dim], bytes(24 * dim))   # DSpark stage: refused
    ck.add(last_shard, "mtp.0.attn.wq_a.scale", "F8_E8M0", [1, 1], bytes([127]))
    ck.add(last_shard, "head.weight", "BF16", [64, dim], bytes(64 * dim * 2))


def write_released(directory, text_config=None, layers=None, seed=0, n_shards=N_SHARDS, block=RELEASED_BLOCK,
                   split_layer=None):
    """Builds and saves the checkpoint; returns the Released object (index_path, config_path,
    values). text_config: flat V4.1 text keys (default: tiny41 from gen_case41). layers: the layers
    written (default: every model layer). split_layer: the layer spread over two shards
    (default: the second written layer). Layers go round-robin over shards 1..n-1; the last shard
    holds the Engram table, the DSpark stage and the head."""
    text = dict(text_config or gen_case41.default_text_config())
    config = released_config(text, block)
    cfg = spec.config_from_dict(config)
    layers = list(range(cfg.n_hidden_layers)) if layers is None else list(layers)
    split_layer = layers[min(1, len(layers) - 1)] if split_layer is None else split_layer
    rng = np.random.default_rng(seed)
    ck = Released(config)
    last = shard_name(n_shards, n_shards)
    for k, layer in enumerate(layers):
        home = shard_name(1 + k % (n_shards - 1), n_shards)
        other = shard_name(1 + (k + 1) % (n_shards - 1), n_shards)
        for short, shape in spec.weight_shapes(cfg, cfg.roles[layer]).items():
            w = gen_case41.random_weight(rng, short, shape).astype(np.float32)

            def shard_of(is_scale, short=short, layer=layer, home=home, other=other):
                if layer == split_layer and (is_scale and short == "attn.wq_b.weight" or "indexer" in short):
                    return other
                return home
            ck.add_weight(shard_of, spec.layer_prefix(layer) + short, short, w, block)
        add_unrelated(ck, rng, layer, home, cfg.dim)
    add_engram(ck, rng, last, rows=48, head_dim=32)
    add_vision_and_heads(ck, shard_name(1, n_shards), last, cfg.dim)
    ck.save(directory)
    return ck
