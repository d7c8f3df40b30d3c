"""layer_spec41.py: the DeepSeek V4.1 (CSA2) configuration, layer roles and weight names/shapes
(SPEC section 10 "Configuration", "Roles", "Weights").

Shared by gen_case41.py (which writes cases), ref41.py (which checks and reads them) and
ckptlib41.py, so none of them can disagree about a role or a shape. No torch here.

A config is V4.1 when it has `kv_source_layer_ids` (or the ModelArgs name `kv_source_layers`).
Three spellings load (SPEC 10):
  * flat Hugging Face keys (hidden_size, num_attention_heads, rope_scaling{...}, rms_norm_eps, ...);
  * the released nesting: the text keys under `text_config`, `quantization_config` at the top level
    (a key missing from text_config is looked up at the top level, so index_loss_coeff/mode may sit
    at either level);
  * the field names of DeepSeek's inference `ModelArgs` (dim, n_heads, rope_head_dim, window_size,
    norm_eps, n_layers, rope_factor, original_seq_len, beta_fast, beta_slow, kv_source_layers,
    index_source_layers, candidate_source_layer), as src/config.c reads V4's ModelArgs names.
  When both spellings of one quantity are present they must agree (an error names both).

Required: the structural keys (sizes, compress_ratios, num_hidden_layers, the source lists; the
indexer sizes when there is an index source; candidate_topk_blocks/candidate_block_size when there
is a candidate source). Optional, defaulting to SPEC 10's V4.1-Flash values: rope_theta 10000,
compress_rope_theta 160000, YaRN (16, 65536, 32, 1), rms_norm_eps 1e-20; index_loss_coeff 1e-3,
index_loss_mode "sparse". As in src/config.c, a ModelArgs-style file must name
compress_rope_theta and original_seq_len (ModelArgs' own defaults differ from the release), and
rope_factor when YaRN is on. `rope_scaling: null` or `original_seq_len: 0` turns YaRN off (DeepSeek's
precompute_freqs_cis applies YaRN only when original_seq_len > 0). Absent candidate source
(`candidate_source_layer_id` missing/null, or a negative value as ModelArgs' default -1): no
candidates.
"""
import json
import math
from dataclasses import dataclass, field

SWA = 0                       # ratio of a window-only layer
VALID_RATIOS = (0, 1, 2)      # SPEC 10: V4.1 ratios are 0, 1 and 2 only
LOSS_MODES = ("sparse", "dense")
DEFAULT_INDEX_LOSS_COEFF = 1e-3
DEFAULT_INDEX_LOSS_MODE = "sparse"
DEFAULT_FP8_BLOCK = (128, 128)   # quantization_config.weight_block_size when absent (V4's size)

# V4.1-Flash values of the optional hyperparameters (SPEC 10 "Configuration")
FLASH41_ROPE_THETA = 10000.0
FLASH41_COMPRESS_ROPE_THETA = 160000.0
FLASH41_YARN = (16.0, 65536.0, 32.0, 1.0)      # factor, original_max_position_embeddings, beta_fast, beta_slow
FLASH41_EPS = 1e-20

ROLE_WINDOW, ROLE_FULL, ROLE_REINDEX, ROLE_REUSE = "window", "full", "reindex", "reuse"

# the projections DeepSeek stores as F8_E4M3 with E8M0 block scales (SPEC 10 "Weights")
FP8_WEIGHTS = ("attn.wq_a.weight", "attn.wq_b.weight", "attn.wkv.weight", "attn.wo_a.weight",
               "attn.wo_b.weight", "attn.indexer.wq_b.weight")
F32_WEIGHTS = ("attn.attn_sink",)


class ConfigError(ValueError):
    """A configuration problem; the message names the key (and the layer)."""


@dataclass
class Config41:
    dim: int                      # d
    n_heads: int                  # H
    head_dim: int                 # D
    rope_dim: int                 # R
    q_lora_rank: int              # dq
    o_groups: int                 # G
    o_lora_rank: int              # Ro
    window: int                   # W
    index_n_heads: int            # Hi (0 when there is no index source and the key is absent)
    index_head_dim: int           # Di
    index_topk: int               # k
    ratios: list                  # compress_ratios (one per layer, draft stages included)
    n_hidden_layers: int          # num_hidden_layers: layers >= this are refused
    rope_theta: float
    compress_rope_theta: float
    yarn_factor: float
    yarn_original_max_pos: float  # 0: no YaRN
    yarn_beta_fast: float
    yarn_beta_slow: float
    eps: float
    kv_sources: tuple             # sorted layer ids
    index_sources: tuple          # sorted layer ids
    candidate_source: object      # layer id, or None: no candidates
    candidate_topk_blocks: int
    candidate_block_size: int
    index_loss_coeff: float
    index_loss_mode: str
    fp8_block: tuple = DEFAULT_FP8_BLOCK
    roles: dict = field(default_factory=dict)   # layer -> Role, for every layer < n_hidden_layers


@dataclass
class Role:
    """What a layer does (SPEC 10 "Roles")."""
    layer: int
    ratio: int
    kind: str                     # ROLE_WINDOW / ROLE_FULL / ROLE_REINDEX / ROLE_REUSE
    kv_source: object             # largest kv source <= layer (None for window-only layers)
    index_source: object          # largest index source <= layer (None for window-only layers)
    is_candidate_source: bool
    uses_candidates: bool         # an index source after the candidate source

    @property
    def is_kv_source(self):
        return self.kind == ROLE_FULL

    @property
    def is_index_source(self):
        return self.kind in (ROLE_FULL, ROLE_REINDEX)


# ----------------------------------------------------------------------------------------------
# Reading the keys
# ----------------------------------------------------------------------------------------------

def is_v41(raw):
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else {}
    return any(k in d for d in (raw, text) for k in ("kv_source_layer_ids", "kv_source_layers"))


def _flatten(raw):
    """The released nesting: text keys under text_config, quantization_config at the top. Returns
    one dict: text_config's keys, then any top-level key text_config lacks."""
    text = raw.get("text_config")
    if text is None:
        return dict(raw)
    if not isinstance(text, dict):
        raise ConfigError("config: key 'text_config' must be an object")
    flat = dict(text)
    for k, v in raw.items():
        if k != "text_config" and k not in flat:
            flat[k] = v
    return flat


class _Keys:
    """Looks a quantity up under its HF name and its ModelArgs name."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.ma_style = "dim" in cfg or "n_heads" in cfg

    def find(self, hf, ma=None, obj=None, shown=None):
        """(value or None, name shown in messages)."""
        obj = self.cfg if obj is None else obj
        shown = shown or hf
        a = obj.get(hf) if hf else None
        b = self.cfg.get(ma) if ma else None
        if a is not None and b is not None and a != b:
            raise ConfigError(f"config: keys '{shown}' and '{ma}' name the same quantity with different values")
        return (a, shown) if a is not None else (b, ma)

    def int(self, hf, ma=None, required=True, default=None, minimum=None):
        v, name = self.find(hf, ma)
        if v is None:
            if required:
                alt = f" (or '{ma}')" if ma else ""
                raise ConfigError(f"config: missing required key '{hf}'{alt}")
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v):
            raise ConfigError(f"config: key '{name}' must be an integer, got {v!r}")
        v = int(v)
        if minimum is not None and v < minimum:
            raise ConfigError(f"config: key '{name}' must be >= {minimum}, got {v}")
        return v

    def num(self, hf, ma=None, default=None, obj=None, shown=None):
        v, name = self.find(hf, ma, obj, shown)
        if v is None:
            return default, False
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ConfigError(f"config: key '{name}' must be a finite number, got {v!r}")
        return float(v), True

    def int_list(self, hf, ma, required=True):
        v, name = self.find(hf, ma)
        if v is None:
            if required:
                raise ConfigError(f"config: missing required key '{hf}' (or '{ma}')")
            return None
        if not isinstance(v, (list, tuple)) or any(isinstance(e, bool) or not isinstance(e, int) for e in v):
            raise ConfigError(f"config: key '{name}' must be a list of integers, got {v!r}")
        return [int(e) for e in v]


def _rope_scaling(keys):
    """(factor, original, beta_fast, beta_slow); original 0 = no YaRN."""
    cfg = keys.cfg
    if "rope_scaling" in cfg and cfg["rope_scaling"] is None:
        orig, _ = keys.num(None, "original_seq_len", default=0.0)
        if orig != 0:
            raise ConfigError("config: keys 'rope_scaling' (null: no YaRN) and 'original_seq_len' disagree")
        return FLASH41_YARN[0], 0.0, FLASH41_YARN[2], FLASH41_YARN[3]
    rs = cfg.get("rope_scaling")
    if rs is not None and not isinstance(rs, dict):
        raise ConfigError("config: key 'rope_scaling' must be an object or null")
    hf = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow")
    ma = ("rope_factor", "original_seq_len", "beta_fast", "beta_slow")
    values, found = [], []
    for i in range(4):
        if rs is not None and hf[i] not in rs:
            raise ConfigError(f"config: missing required key 'rope_scaling.{hf[i]}'")
        v, f = keys.num(hf[i], ma[i], default=FLASH41_YARN[i], obj=rs if rs is not None else {},
                        shown=f"rope_scaling.{hf[i]}")
        values.append(v)
        found.append(f)
    if keys.ma_style and not found[1]:
        raise ConfigError("config: missing required key 'original_seq_len' (or "
                          "'rope_scaling.original_max_position_embeddings'): ModelArgs' default differs")
    if keys.ma_style and not found[0] and values[1] > 0:
        raise ConfigError("config: missing required key 'rope_factor' (or 'rope_scaling.factor'): "
                          "ModelArgs' default differs")
    return tuple(values)


def _fp8_block(raw):
    q = raw.get("quantization_config")
    if q is None and isinstance(raw.get("text_config"), dict):
        q = raw["text_config"].get("quantization_config")
    if q is None:
        return DEFAULT_FP8_BLOCK
    if not isinstance(q, dict):
        raise ConfigError("config: key 'quantization_config' must be an object")
    bs = q.get("weight_block_size")
    if bs is None:
        return DEFAULT_FP8_BLOCK
    if (not isinstance(bs, (list, tuple)) or len(bs) != 2
            or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in bs)):
        raise ConfigError("config: key 'quantization_config.weight_block_size' must be two positive integers")
    return (int(bs[0]), int(bs[1]))


def config_from_dict(raw):
    """Parses and validates a V4.1 config dict (any of the three spellings). Errors name the key."""
    if not isinstance(raw, dict):
        raise ConfigError("config: top level must be a JSON object")
    if not is_v41(raw):
        raise ConfigError("config: not a V4.1 config (no 'kv_source_layer_ids' / 'kv_source_layers')")
    cfg = _flatten(raw)
    k = _Keys(cfg)
    kv_sources = k.int_list("kv_source_layer_ids", "kv_source_layers")
    index_sources = k.int_list("index_source_layer_ids", "index_source_layers")
    cand, cand_name = k.find("candidate_source_layer_id", "candidate_source_layer")
    if cand is not None and (isinstance(cand, bool) or not isinstance(cand, int)):
        raise ConfigError(f"config: key '{cand_name}' must be an integer, got {cand!r}")
    cand = None if cand is None or cand < 0 else int(cand)
    need_index = bool(index_sources)
    ratios = k.int_list("compress_ratios", None) if "compress_ratios" in cfg else None
    if ratios is None:
        raise ConfigError("config: missing required key 'compress_ratios'")
    rope_theta, _ = k.num("rope_theta", default=FLASH41_ROPE_THETA)
    crt, have_crt = k.num("compress_rope_theta", default=FLASH41_COMPRESS_ROPE_THETA)
    if k.ma_style and not have_crt:
        raise ConfigError("config: missing required key 'compress_rope_theta': ModelArgs' default differs")
    factor, orig, beta_fast, beta_slow = _rope_scaling(k)
    eps, _ = k.num("rms_norm_eps", "norm_eps", default=FLASH41_EPS)
    coeff, _ = k.num("index_loss_coeff", default=DEFAULT_INDEX_LOSS_COEFF)
    mode = cfg.get("index_loss_mode", DEFAULT_INDEX_LOSS_MODE)
    c = Config41(
        dim=k.int("hidden_size", "dim", minimum=1),
        n_heads=k.int("num_attention_heads", "n_heads", minimum=1),
        head_dim=k.int("head_dim", minimum=1),
        rope_dim=k.int("qk_rope_head_dim", "rope_head_dim", minimum=1),
        q_lora_rank=k.int("q_lora_rank", minimum=1),
        o_groups=k.int("o_groups", minimum=1),
        o_lora_rank=k.int("o_lora_rank", minimum=1),
        window=k.int("sliding_window", "window_size", minimum=1),
        index_n_heads=k.int("index_n_heads", required=need_index, default=0, minimum=1),
        index_head_dim=k.int("index_head_dim", required=need_index, default=0, minimum=1),
        index_topk=k.int("index_topk", required=need_index, default=0, minimum=1),
        ratios=ratios,
        n_hidden_layers=k.int("num_hidden_layers", "n_layers", minimum=0),
        rope_theta=rope_theta,
        compress_rope_theta=crt,
        yarn_factor=factor,
        yarn_original_max_pos=orig,
        yarn_beta_fast=beta_fast,
        yarn_beta_slow=beta_slow,
        eps=eps,
        kv_sources=tuple(sorted(set(kv_sources))),
        index_sources=tuple(sorted(set(index_sources))),
        candidate_source=cand,
        candidate_topk_blocks=k.int("candidate_topk_blocks", required=cand is not None, default=0, minimum=1),
        candidate_block_size=k.int("candidate_block_size", required=cand is not None, default=0, minimum=1),
        index_loss_coeff=coeff,
        index_loss_mode=str(mode),
        fp8_block=_fp8_block(raw),
    )
    validate(c)
    c.roles = {layer: role_of(c, layer) for layer in range(c.n_hidden_layers)}
    return c


def load_config(path):
    with open(path) as fh:
        return config_from_dict(json.load(fh))


# ----------------------------------------------------------------------------------------------
# Validation (SPEC 1 values, SPEC 10 roles)
# ----------------------------------------------------------------------------------------------

def validate(c):
    if c.n_heads % c.o_groups:
        raise ConfigError("config: 'o_groups' must divide 'num_attention_heads'")
    if c.rope_dim % 2 or c.rope_dim > c.head_dim:
        raise ConfigError("config: 'qk_rope_head_dim' must be even and <= head_dim")
    if c.index_sources and c.rope_dim > c.index_head_dim:
        raise ConfigError("config: 'qk_rope_head_dim' must be <= index_head_dim")
    if c.rope_theta <= 1 or c.compress_rope_theta <= 1:
        raise ConfigError("config: 'rope_theta' and 'compress_rope_theta' must be > 1")
    if c.yarn_original_max_pos < 0:
        raise ConfigError("config: 'rope_scaling.original_max_position_embeddings' must be >= 0")
    if c.yarn_original_max_pos > 0 and (c.yarn_factor < 1 or c.yarn_beta_fast <= 0 or c.yarn_beta_slow <= 0):
        raise ConfigError("config: 'rope_scaling.factor' must be >= 1 and beta_fast/beta_slow positive")
    if not 0 < c.eps < 1:
        raise ConfigError(f"config: 'rms_norm_eps' must be in (0, 1), got {c.eps}")
    if c.index_loss_coeff < 0:
        raise ConfigError(f"config: 'index_loss_coeff' must be >= 0, got {c.index_loss_coeff}")
    if c.index_loss_mode not in LOSS_MODES:
        raise ConfigError(f"config: 'index_loss_mode' must be one of {LOSS_MODES}, got {c.index_loss_mode!r}")
    if not c.ratios:
        raise ConfigError("config: 'compress_ratios' is empty")
    if not 0 <= c.n_hidden_layers <= len(c.ratios):
        raise ConfigError(f"config: 'num_hidden_layers' ({c.n_hidden_layers}) must be in [0, {len(c.ratios)}] "
                          "(the length of compress_ratios)")
    for layer, r in enumerate(c.ratios):
        if r not in VALID_RATIOS:
            raise ConfigError(f"config: 'compress_ratios' entry {r} of layer {layer} is not one of {VALID_RATIOS}")
    for key, ids in (("kv_source_layer_ids", c.kv_sources), ("index_source_layer_ids", c.index_sources)):
        for s in ids:
            if not 0 <= s < c.n_hidden_layers:
                raise ConfigError(f"config: '{key}' names layer {s}, outside 0..num_hidden_layers-1 "
                                  f"({c.n_hidden_layers - 1}; the draft stages are not this layer)")
            if c.ratios[s] == SWA:
                raise ConfigError(f"config: '{key}' names layer {s}, whose compress ratio is 0")
    for s in c.kv_sources:
        if s not in c.index_sources:
            raise ConfigError(f"config: 'kv_source_layer_ids' layer {s} is not in 'index_source_layer_ids' "
                              "(a kv source owns the indexer keys and must select with them)")
    for layer in range(c.n_hidden_layers):
        r = c.ratios[layer]
        if r == SWA:
            continue
        kv = _largest_at_most(c.kv_sources, layer)
        ix = _largest_at_most(c.index_sources, layer)
        if kv is None:
            raise ConfigError(f"config: 'kv_source_layer_ids': layer {layer} (ratio {r}) has no kv source "
                              "at or below it")
        if c.ratios[kv] != r:
            raise ConfigError(f"config: 'compress_ratios': layer {layer} has ratio {r} but its kv source, "
                              f"layer {kv}, has ratio {c.ratios[kv]}")
        if c.ratios[ix] != r:
            raise ConfigError(f"config: 'compress_ratios': layer {layer} has ratio {r} but its index source, "
                              f"layer {ix}, has ratio {c.ratios[ix]}")
    if c.candidate_source is not None:
        cs = c.candidate_source
        if not c.kv_sources or cs != c.kv_sources[-1]:
            raise ConfigError(f"config: 'candidate_source_layer_id' layer {cs} is not the last kv source "
                              f"(kv_source_layer_ids {list(c.kv_sources)})")
        if c.candidate_topk_blocks * c.candidate_block_size < c.index_topk:
            raise ConfigError(f"config: 'candidate_topk_blocks' * 'candidate_block_size' "
                              f"({c.candidate_topk_blocks} * {c.candidate_block_size}) < 'index_topk' "
                              f"({c.index_topk}) at candidate source layer {cs}")


def _largest_at_most(ids, layer):
    below = [s for s in ids if s <= layer]
    return max(below) if below else None


def role_of(c, layer):
    """The Role of one layer (< num_hidden_layers; validate() has run)."""
    if not 0 <= layer < c.n_hidden_layers:
        raise ConfigError(f"config: layer {layer} is not a model layer (num_hidden_layers {c.n_hidden_layers}; "
                          "the draft stages are refused)")
    r = c.ratios[layer]
    if r == SWA:
        return Role(layer, r, ROLE_WINDOW, None, None, False, False)
    kv = _largest_at_most(c.kv_sources, layer)
    ix = _largest_at_most(c.index_sources, layer)
    kind = ROLE_FULL if layer == kv else ROLE_REINDEX if layer == ix else ROLE_REUSE
    is_cand = c.candidate_source is not None and layer == c.candidate_source
    uses = (c.candidate_source is not None and kind in (ROLE_FULL, ROLE_REINDEX)
            and layer > c.candidate_source)
    return Role(layer, r, kind, kv, ix, is_cand, uses)


def check_range(c, first, last):
    """Layers first..last must be model layers, and every source a layer reads must be in the
    range (the shared state is built by this one forward). Returns the roles in order."""
    if first > last:
        raise ConfigError(f"--layers {first}-{last}: the first layer is after the last")
    roles = []
    for layer in range(first, last + 1):
        if not 0 <= layer < c.n_hidden_layers:
            raise ConfigError(f"config: layer {layer} >= num_hidden_layers ({c.n_hidden_layers}): the DSpark "
                              "draft stages are not this layer and are refused")
        role = c.roles[layer]
        for what, src in (("kv source", role.kv_source), ("index source", role.index_source)):
            if src is not None and src < first:
                raise ConfigError(f"layer {layer}: its {what}, layer {src}, lies outside the range "
                                  f"{first}-{last} (run the range from layer {src})")
        roles.append(role)
    return roles


# ----------------------------------------------------------------------------------------------
# Weights (SPEC 10 "Weights")
# ----------------------------------------------------------------------------------------------

def weight_shapes(c, role):
    """Ordered {short name (after 'layers.L.'): shape} of every tensor the layer's role reads."""
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
    Hi, Di = c.index_n_heads, c.index_head_dim
    if role.is_kv_source:
        shapes["attn.compressor.wkv.weight"] = (D, d)
        if role.ratio == 2:
            shapes["attn.compressor.wgate.weight"] = (D, d)
        shapes["attn.compressor.norm.weight"] = (D,)
        shapes["attn.indexer.wk.weight"] = (Di, D)
        shapes["attn.indexer.k_norm.weight"] = (Di,)
    if role.is_index_source:
        shapes["attn.indexer.wq_b.weight"] = (Hi * Di, dq)
        shapes["attn.indexer.weights_proj.weight"] = (Hi, d)
    return shapes


def layer_prefix(layer):
    return f"layers.{layer}."


def parse_range(text):
    """'A-B' or 'A' -> (A, B)."""
    first, sep, last = text.partition("-")
    try:
        a = int(first)
        b = int(last) if sep else a
    except ValueError:
        raise ConfigError(f"--layers: expected A-B, got {text!r}") from None
    return a, b
