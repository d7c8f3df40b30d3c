#!/usr/bin/env -S /usr/bin/python3
"""gen_case.py: writes one deterministic test case of the DeepSeek V4 attention layer into a directory:
config.json (Hugging Face style, SPEC section 1), weights.safetensors (SPEC section 2 names/shapes),
in.safetensors (x [T, d] with cu_seqlens/seqlens_real, or x [B, S, d]) and grad.safetensors (dout).

Everything comes from numpy's default_rng(--seed). Magnitudes are chosen so every part of the layer
matters (see WEIGHT_* below). The reference (ref.py) reads the files back and uses exactly the stored
values, so the dtype used here (f32/bf16/f16) never needs to be mirrored anywhere else.

Example: gen_case.py --out /tmp/c1 --ratio 4 --docs 32:32,24:21 --seed 7
"""
import argparse
import json
import os
import sys

import numpy as np

sys.dont_write_bytecode = True   # keep tests/ref free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import layer_spec  # noqa: E402
import st  # noqa: E402

NORM_WEIGHT_SPREAD = 0.2   # norm weights = 1 + 0.2 N(0,1)
APE_SCALE = 0.5            # compressor ape = 0.5 N(0,1)
SINK_SCALE = 1.0           # attn_sink = N(0,1)
TIE_CHANNEL = 0            # --ties: the one non-zero channel of the indexer key (a non-RoPE dim)
WEIGHT_DTYPES = {"f32": "F32", "bf16": "BF16", "f16": "F16"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output directory (created)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ratio", type=int, choices=layer_spec.VALID_RATIOS, default=4)
    p.add_argument("--layer", type=int, default=2)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=16)
    p.add_argument("--rope-dim", type=int, default=8)
    p.add_argument("--q-lora", type=int, default=24)
    p.add_argument("--o-groups", type=int, default=2)
    p.add_argument("--o-lora", type=int, default=12)
    p.add_argument("--window", type=int, default=8)
    p.add_argument("--index-heads", type=int, default=2)
    p.add_argument("--index-head-dim", type=int, default=16)
    p.add_argument("--topk", type=int, default=4)
    p.add_argument("--coeff", type=float, default=layer_spec.DEFAULT_INDEX_LOSS_COEFF,
                   help="index_loss_coeff")
    p.add_argument("--loss-mode", choices=layer_spec.LOSS_MODES, default=layer_spec.DEFAULT_INDEX_LOSS_MODE,
                   help="index_loss_mode")
    p.add_argument("--docs", default=None,
                   help='packed layout "P:R,P:R,..." (padded:real per document; "P" = all real)')
    p.add_argument("--batch", type=int, default=None, help="batched layout: x [B, S, d]")
    p.add_argument("--seq", type=int, default=None, help="batched layout: S")
    p.add_argument("--omit-seqlens-real", action="store_true",
                   help="packed: do not write seqlens_real (only allowed when every R == P)")
    p.add_argument("--no-cu", action="store_true",
                   help="packed with one unpadded document: write x [T, d] alone, no cu_seqlens")
    p.add_argument("--weights-dtype", choices=sorted(WEIGHT_DTYPES), default="f32")
    p.add_argument("--no-prefix", action="store_true", help="weight names without 'layers.L.'")
    p.add_argument("--no-grad", action="store_true", help="do not write grad.safetensors")
    p.add_argument("--ties", action="store_true",
                   help="force exact indexer score ties: one index head, indexer keys with a single "
                        "non-zero (non-RoPE) channel, so ReLU(q.k) is exactly 0 for about half the slots")
    p.add_argument("--x-scale", type=float, default=1.0)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--compress-rope-theta", type=float, default=160000.0)
    p.add_argument("--yarn-factor", type=float, default=16.0)
    p.add_argument("--yarn-orig", type=float, default=65536.0, help="original_max_position_embeddings")
    p.add_argument("--yarn-beta-fast", type=float, default=32.0)
    p.add_argument("--yarn-beta-slow", type=float, default=1.0)
    p.add_argument("--eps", type=float, default=1e-6)
    p.add_argument("--allow-invalid", action="store_true",
                   help="write document lengths that violate SPEC 4 (for error-path tests)")
    args = p.parse_args(argv)
    if (args.docs is None) == (args.batch is None):
        p.error("give exactly one of --docs or --batch/--seq")
    if args.batch is not None and args.seq is None:
        p.error("--batch needs --seq")
    if args.ties:
        args.index_heads = 1
        if args.ratio != layer_spec.CSA_RATIO:
            p.error("--ties needs --ratio 4")
        if args.index_head_dim <= args.rope_dim:
            p.error("--ties needs index_head_dim > rope_dim (the tie channel must not be rotated)")
    return args


def compress_ratios_for(layer, ratio):
    """A V4-Flash-like list ([0, 0, 4, 128, ..., 0]) with `ratio` at index `layer`."""
    n = layer + 2
    ratios = [0 if i < 2 or i == n - 1 else (4 if i % 2 == 0 else 128) for i in range(n)]
    ratios[layer] = ratio
    return ratios


def make_config(a):
    return {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "hidden_size": a.dim,
        "num_attention_heads": a.heads,
        "head_dim": a.head_dim,
        "qk_rope_head_dim": a.rope_dim,
        "q_lora_rank": a.q_lora,
        "o_groups": a.o_groups,
        "o_lora_rank": a.o_lora,
        "sliding_window": a.window,
        "index_n_heads": a.index_heads,
        "index_head_dim": a.index_head_dim,
        "index_topk": a.topk,
        "compress_ratios": compress_ratios_for(a.layer, a.ratio),
        "num_hidden_layers": a.layer + 2,
        "rope_theta": a.rope_theta,
        "compress_rope_theta": a.compress_rope_theta,
        "rope_scaling": {"type": "yarn", "factor": a.yarn_factor,
                         "original_max_position_embeddings": a.yarn_orig,
                         "beta_fast": a.yarn_beta_fast, "beta_slow": a.yarn_beta_slow},
        "rms_norm_eps": a.eps,
        "index_loss_coeff": a.coeff,
        "index_loss_mode": a.loss_mode,
    }


def random_weight(rng, name, shape):
    """Linear: N(0,1)/sqrt(fan_in); norm: 1 + 0.2 N; ape: 0.5 N; sink: N(0,1)."""
    if name.endswith("attn_sink"):
        return SINK_SCALE * rng.standard_normal(shape)
    if name.endswith(".ape"):
        return APE_SCALE * rng.standard_normal(shape)
    if "norm" in name:
        return 1.0 + NORM_WEIGHT_SPREAD * rng.standard_normal(shape)
    return rng.standard_normal(shape) / np.sqrt(shape[1])


def make_weights(a, cfg, rng):
    """{full name: float64 array}; main() rounds them to float32, then st.write to the stored dtype."""
    prefix = "" if a.no_prefix else layer_spec.layer_prefix(a.layer)
    weights = {}
    for short, shape in layer_spec.weight_shapes(cfg).items():
        w = random_weight(rng, short, shape)
        if a.ties and short == "attn.indexer.compressor.norm.weight":
            keep = w[TIE_CHANNEL]
            w = np.zeros(shape)
            w[TIE_CHANNEL] = keep
        weights[prefix + short] = w
    return weights


def parse_docs(text):
    docs = []
    for item in text.split(","):
        padded, _, real = item.partition(":")
        padded = int(padded)
        docs.append((padded, int(real) if real else padded))
    return docs


def check_layout(a, docs):
    """SPEC 4: 0 < real <= padded (documents of any length; no alignment to r)."""
    problems = []
    for i, (padded, real) in enumerate(docs):
        if not 0 < real <= padded:
            problems.append(f"document {i}: need 0 < real ({real}) <= padded ({padded})")
    if problems and not a.allow_invalid:
        raise SystemExit("gen_case: " + "; ".join(problems) + " (use --allow-invalid to write it anyway)")


def make_inputs(a, rng):
    """Returns (inputs dict, shape of x). Padding rows of x are random too."""
    if a.batch is not None:
        check_layout(a, [(a.seq, a.seq)] * a.batch)
        x = a.x_scale * rng.standard_normal((a.batch, a.seq, a.dim))
        return {"x": x.astype(np.float32)}, x.shape
    docs = parse_docs(a.docs)
    check_layout(a, docs)
    cu = np.concatenate([[0], np.cumsum([p for p, _ in docs])]).astype(np.int32)
    real = np.array([r for _, r in docs], dtype=np.int32)
    x = a.x_scale * rng.standard_normal((int(cu[-1]), a.dim))
    inputs = {"x": x.astype(np.float32)}
    all_real = all(p == r for p, r in docs)
    if a.no_cu:
        if len(docs) != 1 or not all_real:
            raise SystemExit("gen_case: --no-cu needs exactly one document without padding")
        return inputs, x.shape
    inputs["cu_seqlens"] = cu
    if a.omit_seqlens_real:
        if not all_real:
            raise SystemExit("gen_case: --omit-seqlens-real needs every document without padding")
    else:
        inputs["seqlens_real"] = real
    return inputs, x.shape


def main(argv=None):
    a = parse_args(argv)
    config = make_config(a)
    cfg = layer_spec.layer_config_from_dict(config, a.layer)
    rng = np.random.default_rng(a.seed)
    weights = make_weights(a, cfg, rng)
    inputs, x_shape = make_inputs(a, rng)
    dout = rng.standard_normal(x_shape).astype(np.float32)

    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as fh:
        json.dump(config, fh, indent=2)
        fh.write("\n")
    stored = WEIGHT_DTYPES[a.weights_dtype]
    # float64 -> float32 first (BF16 then rounds from float32 with round-to-nearest-even)
    st.write(os.path.join(a.out, "weights.safetensors"),
             {k: v.astype(np.float32) for k, v in weights.items()},
             dtypes={k: stored for k in weights}, metadata={"format": "pt", "seed": a.seed})
    st.write(os.path.join(a.out, "in.safetensors"), inputs)
    if not a.no_grad:
        st.write(os.path.join(a.out, "grad.safetensors"), {"dout": dout})


if __name__ == "__main__":
    main()
