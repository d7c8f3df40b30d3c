#!/usr/bin/env -S /usr/bin/python3
"""gen_case41.py: writes one deterministic DeepSeek V4.1 (CSA2) test case of a layer RANGE into a
directory: config.json (flat Hugging Face keys by default; --nested: the released layout with
text_config + quantization_config; --modelargs: the field names of DeepSeek's inference ModelArgs),
weights.safetensors (every layer of the range, only the tensors its role reads, SPEC 10 names),
in.safetensors (x.{L} per layer, or one x with --shared-x; cu_seqlens/seqlens_real from --docs, or
x [B, S, d] from --batch/--seq) and grad.safetensors (dout.{L}).

Defaults are the C library's tiny V4.1 preset `tiny41` (the C side uses exactly these):
  hidden 32, heads 4, head_dim 16, rope 8, q_lora 24, o_groups 2, o_lora 12, window 8,
  index heads 2 x 16, index_topk 4, compress_ratios [0, 2, 2, 2, 2, 1, 1, 1, 1, 0],
  num_hidden_layers 10, kv_source_layer_ids [1, 5], index_source_layer_ids [1, 3, 5, 7],
  candidate_source_layer_id 5, candidate_topk_blocks 2, candidate_block_size 2, rms_norm_eps 1e-6,
  rope_theta 10000, compress_rope_theta 160000, YaRN factor 16 / original 65536 / beta 32, 1,
  index_loss_coeff 1e-3, index_loss_mode sparse.
Roles then: 0 window-only, 1 Full (r = 2), 2 Reuse, 3 Reindex, 4 Reuse, 5 Full (r = 1, candidate
source), 6 Reuse, 7 Reindex with candidates, 8 Reuse, 9 window-only.

Everything comes from numpy's default_rng(--seed), drawn in a fixed order (layers ascending, names
in layer_spec41 order; then x, then dout), so a case is reproducible from its arguments. Magnitudes
as gen_case.py: Linear N(0,1)/sqrt(fan_in) (so every projection keeps unit scale), norms
1 + 0.2 N(0,1), attn_sink N(0,1), x N(0,1) * --x-scale. ref41.py reads back exactly the stored
values, so the stored dtype (f32/bf16/f16) never needs mirroring elsewhere.

Example: gen_case41.py --out /tmp/c41 --docs 24:24,17,30:27 --coeff 0.5 --seed 3
"""
import argparse
import json
import os
import sys

import numpy as np

sys.dont_write_bytecode = True   # keep tests/ref free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import layer_spec41 as spec  # noqa: E402
import st  # noqa: E402
from gen_case import parse_docs  # noqa: E402

NORM_WEIGHT_SPREAD = 0.2   # norm weights = 1 + 0.2 N(0,1)
SINK_SCALE = 1.0           # attn_sink = N(0,1)
TIE_CHANNEL = 0            # --ties: the one non-zero channel of the indexer keys (a non-RoPE dim)
WEIGHT_DTYPES = {"f32": "F32", "bf16": "BF16", "f16": "F16"}
TINY41 = dict(dim=32, heads=4, head_dim=16, rope_dim=8, q_lora=24, o_groups=2, o_lora=12, window=8,
              index_heads=2, index_head_dim=16, topk=4, ratios="0,2,2,2,2,1,1,1,1,0", kv_sources="1,5",
              index_sources="1,3,5,7", candidate_source="5", candidate_topk_blocks=2, candidate_block_size=2,
              eps=1e-6, rope_theta=10000.0, compress_rope_theta=160000.0, yarn_factor=16.0,
              yarn_orig=65536.0, yarn_beta_fast=32.0, yarn_beta_slow=1.0, coeff=1e-3)
RELEASED_FP8_BLOCK = [32, 32]   # quantization_config.weight_block_size written by --nested


def int_list(text):
    return [int(v) for v in text.split(",")] if text else []


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    t = TINY41
    p.add_argument("--out", required=True, help="output directory (created)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", default=None, help="range A-B written (default: every model layer)")
    p.add_argument("--dim", type=int, default=t["dim"])
    p.add_argument("--heads", type=int, default=t["heads"])
    p.add_argument("--head-dim", type=int, default=t["head_dim"])
    p.add_argument("--rope-dim", type=int, default=t["rope_dim"])
    p.add_argument("--q-lora", type=int, default=t["q_lora"])
    p.add_argument("--o-groups", type=int, default=t["o_groups"])
    p.add_argument("--o-lora", type=int, default=t["o_lora"])
    p.add_argument("--window", type=int, default=t["window"])
    p.add_argument("--index-heads", type=int, default=t["index_heads"])
    p.add_argument("--index-head-dim", type=int, default=t["index_head_dim"])
    p.add_argument("--topk", type=int, default=t["topk"])
    p.add_argument("--ratios", default=t["ratios"], help="compress_ratios, comma separated")
    p.add_argument("--n-layers", type=int, default=None, help="num_hidden_layers (default: len(ratios))")
    p.add_argument("--kv-sources", default=t["kv_sources"])
    p.add_argument("--index-sources", default=t["index_sources"])
    p.add_argument("--candidate-source", default=t["candidate_source"], help='layer id, or "none"')
    p.add_argument("--candidate-topk-blocks", type=int, default=t["candidate_topk_blocks"])
    p.add_argument("--candidate-block-size", type=int, default=t["candidate_block_size"])
    p.add_argument("--coeff", type=float, default=t["coeff"], help="index_loss_coeff")
    p.add_argument("--loss-mode", choices=spec.LOSS_MODES, default=spec.DEFAULT_INDEX_LOSS_MODE)
    p.add_argument("--docs", default=None, help='packed layout "P:R,P:R,..." (padded:real; "P" = all real)')
    p.add_argument("--batch", type=int, default=None, help="batched layout: x [B, S, d]")
    p.add_argument("--seq", type=int, default=None, help="batched layout: S")
    p.add_argument("--omit-seqlens-real", action="store_true", help="packed, no padding: no seqlens_real")
    p.add_argument("--no-cu", action="store_true", help="one unpadded document: x alone, no cu_seqlens")
    p.add_argument("--shared-x", action="store_true", help="one x (and one dout) for every layer")
    p.add_argument("--weights-dtype", choices=sorted(WEIGHT_DTYPES), default="f32")
    p.add_argument("--model-prefix", action="store_true", help="weight names start with 'model.'")
    p.add_argument("--no-grad", action="store_true", help="do not write grad.safetensors")
    p.add_argument("--ties", action="store_true",
                   help="exact indexer score ties: one index head, index keys with a single non-zero "
                        "(non-RoPE) channel, so ReLU(q.k) is exactly 0 for about half the entries")
    p.add_argument("--nested", action="store_true", help="released layout: text_config + quantization_config")
    p.add_argument("--modelargs", action="store_true", help="DeepSeek inference ModelArgs names")
    p.add_argument("--x-scale", type=float, default=1.0)
    p.add_argument("--rope-theta", type=float, default=t["rope_theta"])
    p.add_argument("--compress-rope-theta", type=float, default=t["compress_rope_theta"])
    p.add_argument("--yarn-factor", type=float, default=t["yarn_factor"])
    p.add_argument("--yarn-orig", type=float, default=t["yarn_orig"], help="original_max_position_embeddings")
    p.add_argument("--yarn-beta-fast", type=float, default=t["yarn_beta_fast"])
    p.add_argument("--yarn-beta-slow", type=float, default=t["yarn_beta_slow"])
    p.add_argument("--eps", type=float, default=t["eps"])
    p.add_argument("--allow-invalid", action="store_true",
                   help="write a config or layout that fails validation (for error-path tests)")
    a = p.parse_args(argv)
    if (a.docs is None) == (a.batch is None):
        p.error("give exactly one of --docs or --batch/--seq")
    if a.batch is not None and a.seq is None:
        p.error("--batch needs --seq")
    if a.nested and a.modelargs:
        p.error("--nested and --modelargs exclude each other")
    if a.ties:
        a.index_heads = 1
        if a.index_head_dim <= a.rope_dim:
            p.error("--ties needs index_head_dim > rope_dim (the tie channel must not be rotated)")
    return a


def candidate_of(a):
    return None if a.candidate_source.lower() in ("none", "", "-1") else int(a.candidate_source)


def hf_text_config(a):
    """Flat Hugging Face keys (the released text_config without the MoE/mHC/Engram keys)."""
    ratios = int_list(a.ratios)
    c = {
        "hidden_size": a.dim, "num_attention_heads": a.heads, "head_dim": a.head_dim,
        "qk_rope_head_dim": a.rope_dim, "q_lora_rank": a.q_lora, "o_groups": a.o_groups,
        "o_lora_rank": a.o_lora, "sliding_window": a.window, "index_n_heads": a.index_heads,
        "index_head_dim": a.index_head_dim, "index_topk": a.topk, "compress_ratios": ratios,
        "num_hidden_layers": a.n_layers if a.n_layers is not None else len(ratios),
        "rope_theta": a.rope_theta, "compress_rope_theta": a.compress_rope_theta,
        "rope_scaling": {"type": "yarn", "factor": a.yarn_factor, "original_max_position_embeddings": a.yarn_orig,
                         "beta_fast": a.yarn_beta_fast, "beta_slow": a.yarn_beta_slow},
        "rms_norm_eps": a.eps,
        "kv_source_layer_ids": int_list(a.kv_sources), "index_source_layer_ids": int_list(a.index_sources),
    }
    if candidate_of(a) is not None:
        c.update(candidate_source_layer_id=candidate_of(a), candidate_topk_blocks=a.candidate_topk_blocks,
                 candidate_block_size=a.candidate_block_size)
    c.update(index_loss_coeff=a.coeff, index_loss_mode=a.loss_mode)
    return c


def default_text_config(*argv):
    """The flat text keys gen_case41 writes for these arguments (default: tiny41), e.g. for
    tests/ckptlib41.py's released-layout checkpoint."""
    return hf_text_config(parse_args(["--out", "-", "--docs", "1", *argv]))


def modelargs_config(a):
    """The same model under the field names of DeepSeek's inference ModelArgs."""
    ratios = int_list(a.ratios)
    cand = candidate_of(a)
    return {
        "dim": a.dim, "n_heads": a.heads, "head_dim": a.head_dim, "rope_head_dim": a.rope_dim,
        "q_lora_rank": a.q_lora, "o_groups": a.o_groups, "o_lora_rank": a.o_lora, "window_size": a.window,
        "index_n_heads": a.index_heads, "index_head_dim": a.index_head_dim, "index_topk": a.topk,
        "compress_ratios": ratios, "n_layers": a.n_layers if a.n_layers is not None else len(ratios),
        "rope_theta": a.rope_theta, "compress_rope_theta": a.compress_rope_theta,
        "rope_factor": a.yarn_factor, "original_seq_len": a.yarn_orig, "beta_fast": a.yarn_beta_fast,
        "beta_slow": a.yarn_beta_slow, "norm_eps": a.eps,
        "kv_source_layers": int_list(a.kv_sources), "index_source_layers": int_list(a.index_sources),
        "candidate_source_layer": -1 if cand is None else cand,
        "candidate_topk_blocks": a.candidate_topk_blocks if cand is not None else 0,
        "candidate_block_size": a.candidate_block_size if cand is not None else 0,
        "index_loss_coeff": a.coeff, "index_loss_mode": a.loss_mode,
    }


def make_config(a):
    if a.modelargs:
        return modelargs_config(a)
    text = hf_text_config(a)
    if not a.nested:
        return {"architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41", **text}
    return {
        "architectures": ["DeepseekV41ForConditionalGeneration"],
        "model_type": "deepseek_v41",
        "text_config": {"model_type": "deepseek_v41_text", **text},
        "vision_config": {"model_type": "deepseek_v41_vision", "hidden_size": 16},
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                "activation_scheme": "dynamic", "weight_block_size": RELEASED_FP8_BLOCK},
    }


def random_weight(rng, name, shape):
    """Linear: N(0,1)/sqrt(fan_in); norm: 1 + 0.2 N; sink: N(0,1)."""
    if name.endswith("attn_sink"):
        return SINK_SCALE * rng.standard_normal(shape)
    if "norm" in name:
        return 1.0 + NORM_WEIGHT_SPREAD * rng.standard_normal(shape)
    return rng.standard_normal(shape) / np.sqrt(shape[1])


def make_weights(cfg, roles, rng, ties=False):
    """{full name (layers.L.attn...): float64 array} for every layer of the range, in a fixed order."""
    weights = {}
    for role in roles:
        for short, shape in spec.weight_shapes(cfg, role).items():
            w = random_weight(rng, short, shape)
            if ties and short == "attn.indexer.k_norm.weight":
                keep = w[TIE_CHANNEL]
                w = np.zeros(shape)
                w[TIE_CHANNEL] = keep
            weights[spec.layer_prefix(role.layer) + short] = w
    return weights


def check_layout(a, docs):
    """SPEC 4: 0 < real <= padded (documents of any length; no alignment)."""
    problems = [f"document {i}: need 0 < real ({r}) <= padded ({p})" for i, (p, r) in enumerate(docs)
                if not 0 < r <= p]
    if problems and not a.allow_invalid:
        raise SystemExit("gen_case41: " + "; ".join(problems) + " (use --allow-invalid to write it anyway)")


def make_layout(a):
    """(tensors other than x: cu_seqlens/seqlens_real, shape of x)."""
    if a.batch is not None:
        check_layout(a, [(a.seq, a.seq)] * a.batch)
        return {}, (a.batch, a.seq, a.dim)
    docs = parse_docs(a.docs)
    check_layout(a, docs)
    cu = np.concatenate([[0], np.cumsum([p for p, _ in docs])]).astype(np.int32)
    all_real = all(p == r for p, r in docs)
    shape = (int(cu[-1]), a.dim)
    if a.no_cu:
        if len(docs) != 1 or not all_real:
            raise SystemExit("gen_case41: --no-cu needs exactly one document without padding")
        return {}, shape
    meta = {"cu_seqlens": cu}
    if a.omit_seqlens_real:
        if not all_real:
            raise SystemExit("gen_case41: --omit-seqlens-real needs every document without padding")
    else:
        meta["seqlens_real"] = np.array([r for _, r in docs], dtype=np.int32)
    return meta, shape


def per_layer_random(rng, base, layers, shape, scale, shared):
    """{base.L: array} (or {base: array} when shared); padding rows are random too."""
    if shared:
        return {base: (scale * rng.standard_normal(shape)).astype(np.float32)}
    return {f"{base}.{L}": (scale * rng.standard_normal(shape)).astype(np.float32) for L in layers}


def roles_of(a, cfg):
    first, last = spec.parse_range(a.layers) if a.layers else (0, cfg.n_hidden_layers - 1)
    return spec.check_range(cfg, first, last)


def main(argv=None):
    a = parse_args(argv)
    config = make_config(a)
    try:
        cfg = spec.config_from_dict(config)
        roles = roles_of(a, cfg)
    except spec.ConfigError as e:
        if not a.allow_invalid:
            raise SystemExit(f"gen_case41: {e}")
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "config.json"), "w") as fh:
            json.dump(config, fh, indent=2)
        return
    rng = np.random.default_rng(a.seed)
    weights = make_weights(cfg, roles, rng, a.ties)
    layout, shape = make_layout(a)
    layers = [r.layer for r in roles]
    inputs = {**per_layer_random(rng, "x", layers, shape, a.x_scale, a.shared_x), **layout}
    grads = per_layer_random(rng, "dout", layers, shape, 1.0, a.shared_x)

    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as fh:
        json.dump(config, fh, indent=2)
        fh.write("\n")
    prefix = "model." if a.model_prefix else ""
    stored = WEIGHT_DTYPES[a.weights_dtype]
    # float64 -> float32 first (BF16 then rounds from float32 with round-to-nearest-even)
    st.write(os.path.join(a.out, "weights.safetensors"),
             {prefix + k: v.astype(np.float32) for k, v in weights.items()},
             dtypes={prefix + k: stored for k in weights},
             metadata={"format": "pt", "seed": a.seed})
    st.write(os.path.join(a.out, "in.safetensors"), inputs)
    if not a.no_grad:
        st.write(os.path.join(a.out, "grad.safetensors"), grads)
    with open(os.path.join(a.out, "layers.txt"), "w") as fh:
        fh.write(f"{layers[0]}-{layers[-1]}\n")


if __name__ == "__main__":
    main()
