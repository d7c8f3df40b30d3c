"""layer_spec.py: the layer's configuration (SPEC section 1) and weight names/shapes (SPEC section 2).

Shared by gen_case.py (which writes cases) and ref.py (which checks and reads them), so the two
cannot disagree about a shape. No torch here: gen_case.py must stay quick to start.
"""
import json
from dataclasses import dataclass

CSA_RATIO = 4      # compressed sparse attention: overlapping compressor + lightning indexer
HCA_RATIO = 128    # heavily compressed attention: non-overlapping compressor, dense over slots
SWA_RATIO = 0      # sliding window only
VALID_RATIOS = (SWA_RATIO, CSA_RATIO, HCA_RATIO)
LOSS_MODES = ("sparse", "dense")
DEFAULT_INDEX_LOSS_COEFF = 1e-3
DEFAULT_INDEX_LOSS_MODE = "sparse"


@dataclass
class LayerConfig:
    """Everything the layer needs, for one layer index (ratio = compress_ratios[layer])."""
    dim: int                  # d
    n_heads: int              # H
    head_dim: int             # D
    rope_dim: int             # R (last R dims of every rotated vector)
    q_lora_rank: int          # dq
    o_groups: int             # G
    o_lora_rank: int          # Ro
    window: int               # W
    index_n_heads: int        # Hi
    index_head_dim: int       # Di
    index_topk: int           # k
    ratio: int                # r of this layer
    rope_theta: float
    compress_rope_theta: float
    yarn_factor: float
    yarn_original_max_pos: float
    yarn_beta_fast: float
    yarn_beta_slow: float
    eps: float
    index_loss_coeff: float
    index_loss_mode: str


def _require(cfg, key):
    if key not in cfg:
        raise ValueError(f"config: missing required key '{key}'")
    return cfg[key]


def layer_config_from_dict(cfg, layer):
    """Parses a Hugging Face style config dict for layer `layer`; errors name the key."""
    ratios = _require(cfg, "compress_ratios")
    if not (0 <= layer < len(ratios)):
        raise ValueError(f"config: layer {layer} outside compress_ratios (length {len(ratios)})")
    scaling = _require(cfg, "rope_scaling")
    for key in ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow"):
        if key not in scaling:
            raise ValueError(f"config: missing required key 'rope_scaling.{key}'")
    c = LayerConfig(
        dim=int(_require(cfg, "hidden_size")),
        n_heads=int(_require(cfg, "num_attention_heads")),
        head_dim=int(_require(cfg, "head_dim")),
        rope_dim=int(_require(cfg, "qk_rope_head_dim")),
        q_lora_rank=int(_require(cfg, "q_lora_rank")),
        o_groups=int(_require(cfg, "o_groups")),
        o_lora_rank=int(_require(cfg, "o_lora_rank")),
        window=int(_require(cfg, "sliding_window")),
        index_n_heads=int(_require(cfg, "index_n_heads")),
        index_head_dim=int(_require(cfg, "index_head_dim")),
        index_topk=int(_require(cfg, "index_topk")),
        ratio=int(ratios[layer]),
        rope_theta=float(_require(cfg, "rope_theta")),
        compress_rope_theta=float(_require(cfg, "compress_rope_theta")),
        yarn_factor=float(scaling["factor"]),
        yarn_original_max_pos=float(scaling["original_max_position_embeddings"]),
        yarn_beta_fast=float(scaling["beta_fast"]),
        yarn_beta_slow=float(scaling["beta_slow"]),
        eps=float(_require(cfg, "rms_norm_eps")),
        index_loss_coeff=float(cfg.get("index_loss_coeff", DEFAULT_INDEX_LOSS_COEFF)),
        index_loss_mode=str(cfg.get("index_loss_mode", DEFAULT_INDEX_LOSS_MODE)),
    )
    validate(c)
    return c


def load_layer_config(path, layer):
    with open(path) as fh:
        return layer_config_from_dict(json.load(fh), layer)


def validate(c):
    """Impossible values are errors naming the key (SPEC section 1)."""
    positive = {"hidden_size": c.dim, "num_attention_heads": c.n_heads, "head_dim": c.head_dim,
                "qk_rope_head_dim": c.rope_dim, "q_lora_rank": c.q_lora_rank,
                "o_groups": c.o_groups, "o_lora_rank": c.o_lora_rank, "sliding_window": c.window,
                "index_n_heads": c.index_n_heads, "index_head_dim": c.index_head_dim,
                "index_topk": c.index_topk}
    for key, value in positive.items():
        if value <= 0:
            raise ValueError(f"config: '{key}' must be positive, got {value}")
    if c.ratio not in VALID_RATIOS:
        raise ValueError(f"config: 'compress_ratios' entry {c.ratio} is not one of {VALID_RATIOS}")
    if c.n_heads % c.o_groups:
        raise ValueError("config: 'o_groups' must divide 'num_attention_heads'")
    if c.rope_dim % 2 or c.rope_dim > c.head_dim:
        raise ValueError("config: 'qk_rope_head_dim' must be even and <= head_dim")
    if c.ratio == CSA_RATIO and c.rope_dim > c.index_head_dim:
        raise ValueError("config: 'qk_rope_head_dim' must be <= index_head_dim")
    if c.index_loss_mode not in LOSS_MODES:
        raise ValueError(f"config: 'index_loss_mode' must be one of {LOSS_MODES}")


def weight_shapes(c):
    """Ordered {short name (without 'layers.L.'): shape} of every weight of the layer (SPEC 2)."""
    d, H, D, dq = c.dim, c.n_heads, c.head_dim, c.q_lora_rank
    G, Ro = c.o_groups, c.o_lora_rank
    shapes = {
        "attn.wq_a.weight": (dq, d),
        "attn.q_norm.weight": (dq,),
        "attn.wq_b.weight": (H * D, dq),
        "attn.wkv.weight": (D, d),
        "attn.kv_norm.weight": (D,),
        "attn.attn_sink": (H,),
        "attn.wo_a.weight": (G * Ro, (H // G) * D),
        "attn.wo_b.weight": (d, G * Ro),
    }
    if c.ratio > 0:
        coff = 2 if c.ratio == CSA_RATIO else 1   # overlapping compressor has two channel halves
        shapes.update({
            "attn.compressor.ape": (c.ratio, coff * D),
            "attn.compressor.wkv.weight": (coff * D, d),
            "attn.compressor.wgate.weight": (coff * D, d),
            "attn.compressor.norm.weight": (D,),
        })
    if c.ratio == CSA_RATIO:
        Hi, Di = c.index_n_heads, c.index_head_dim
        shapes.update({
            "attn.indexer.wq_b.weight": (Hi * Di, dq),
            "attn.indexer.weights_proj.weight": (Hi, d),
            "attn.indexer.compressor.ape": (CSA_RATIO, 2 * Di),
            "attn.indexer.compressor.wkv.weight": (2 * Di, d),
            "attn.indexer.compressor.wgate.weight": (2 * Di, d),
            "attn.indexer.compressor.norm.weight": (Di,),
        })
    return shapes


def layer_prefix(layer):
    return f"layers.{layer}."
