#!/usr/bin/env -S /usr/bin/python3
"""ref41.py: independent float64 PyTorch reference of a RANGE of DeepSeek V4.1 (CSA2) attention layers
(SPEC section 10, on top of sections 3-4), run as a model runs them: forward A..B in order with one
shared state (compressed KV and index keys of the kv sources, selections of the index sources, the
candidate blocks), backward by autograd over the whole range.

  ref41.py --config C.json --layers A-B --weights W --input IN.safetensors
           [--grad-output G.safetensors] --output EXP.safetensors

W: a .safetensors file, a model.safetensors.index.json, or a directory holding one (or holding a
single .safetensors file). Tensors `layers.{L}.attn.<name>` (optional leading `model.`); F64, F32,
F16, BF16 read exactly, F8_E4M3 with an F8_E8M0 (or F32) sibling scale `<name minus weight>scale`
(or `weight_scale_inv`) dequantised exactly with the block size of quantization_config
(128 x 128 when absent). Tensors the range does not read are never decoded, whatever their dtype.

IN: `x.{L}` [T, d] for every layer L of the range, or one `x` that serves every layer without its
own `x.{L}` (each layer still gets its own input leaf, so `dx.{L}` is that layer's gradient);
optional `cu_seqlens`, `seqlens_real` (int32, SPEC 4); or x of shape [B, S, d] (a batch: packed
with cu = [0, S, 2S, ...], every token real). G: `dout.{L}` (or one `dout` for every layer).

EXP (float64 unless noted), for each layer L of the range:
  out.{L}                   shape of x
  topk_ids.{L}              I32 [T, index_topk]  (index sources) global ids in the compressed sequence
                            of the layer's KV source, sorted by (score desc, id asc), -1 padded
  indexer_loss.{L}          [1]                  (index sources) KL loss, coeff already applied
  topk_scores.{L}           [T, index_topk]      (index sources) scores of topk_ids, -inf padded   (ref only)
  index_scores.{L}          [T, C_total]         (index sources) I of every visible entry, -inf elsewhere
                                                 (before the candidate mask)                      (ref only)
  index_scores_masked.{L}   [T, C_total]         (index sources after the candidate source) I after the
                                                 candidate mask: -inf outside the kept blocks      (ref only)
  dx.{L}, grad.<stored weight name>              with G: gradients of
                            sum_L sum(out_L * dout_L) + sum over index layers of indexer_loss_L
Metadata: reference_only (the names marked "ref only"), selection_users ("I:L L ..;..": which
layers attend with index source I's selection; compare.py uses it for near-ties), roles, n_valid.

The code follows SPEC 10 step by step, one small function per step, one document at a time (every
position, window, compressed entry and block is document-local), vectorised inside a document with
explicit masks. Written to be read, not to be fast.

Checked against DeepSeek's V4.1 forward: a vendored, byte-identical copy of
deepseek-ai/DeepSeek-V4.1-Flash `inference/model.py` (revision
dba1be0a40aa45a94ad051997016db3960a90277, MIT; its header says so), read through the code search
index (file id 70871433627; the index did not name the repository holding the copy). Fake
quantisation (act_quant, fp4_act_quant, the FP8 kv quantisation) taken as identity:
  * Attention.__init__: queries `wq_b(q_norm(wq_a x))`, viewed [H, D], with NO per-head norm;
    RoPE on the last rope_head_dim dims; window kv `kv_norm(wkv x)` then RoPE; roles from
    `is_kv_source` / `is_index_source` (layer < n_layers and listed); freqs: compress_rope_theta and
    YaRN (original_seq_len) for every compress_ratio != 0, rope_theta without YaRN for ratio 0.
  * precompute_freqs_cis: f_i = base^(-2i/R); YaRN ramp (i - low) / max(high - low, 1e-3) between
    low = max(floor(corr(beta_fast)), 0) and high = min(ceil(corr(beta_slow)), R - 1); no mscale.
    (SPEC 3 writes the hi == lo case only; as in ref.py, hi < lo is taken as written. Not reached by
    any shipped configuration.)
  * apply_rotary_emb: adjacent pairs as complex numbers (interleaved), inverse = conjugate; used for
    q, window kv, compressed kv, indexer q and indexer k alike.
  * Compressor.forward: ratio 1 is `norm(wkv x)` with no gate; ratio > 1: `wkv x`, `wgate x` in fp32,
    groups of `ratio` consecutive rows, softmax of the gate over the rows of a group per channel,
    weighted sum, then `norm`. No APE, no overlap; a trailing partial group emits nothing. The
    latent is returned before RoPE.
  * Attention._compress_kv: the latent is rotated at position j * ratio (freqs_cis[::ratio]) AFTER the
    indexer read it; compress_len = (start_pos + seqlen) // ratio.
  * Indexer.forward: keys `k_norm(wk latent)` then RoPE at j * ratio (only in kv sources: owns_k);
    queries `wq_b(qr)` viewed [Hi, Di], RoPE at the query position, no norm; weights
    `weights_proj(x) * Di^-0.5 * Hi^-0.5`; score = sum over heads of weight * ReLU(q . k); entries
    j >= (p+1) // ratio set to -inf; the candidate source publishes select_candidate_blocks(score);
    `uses_candidates = 0 <= candidate_source_layer < layer_id` masks the score outside the kept
    blocks with -inf; then topk(min(index_topk, compress_len)).
  * select_candidate_blocks: block score = max over the block (the last block padded with -inf);
    the block (compress_len - 1) // block_size pinned to +inf; topk(min(topk_blocks, n_blocks));
    blocks that came back -inf dropped; mask expanded back to entries (it also covers the invisible
    tail of the pinned block; those entries are -inf anyway: here the mask holds visible entries only).
  * Attention._compress_topk_idxs: a non-index-source layer reuses `shared_attn.topk_idxs`, the
    selection of the last index source that ran (the largest index source <= L).
  * Indexer.forward also sorts the kept ids by position before returning them; the order does not
    change the attention (SPEC fixes the stored order: score desc, id asc).
  * Attention.forward: sparse_attn over [window kv, compressed kv at the selection] with the sink and
    softmax_scale = D^-0.5, inverse RoPE of the output at the query position, then the grouped
    `wo_a` (einsum per group) and `wo_b`.
Where SPEC 10 deliberately deviates, SPEC is followed: ties go to the smaller id (torch.topk leaves
them unspecified); a -inf entry is never selected (DeepSeek takes min(topk, visible) and may pick
masked entries); the KL loss (absent from DeepSeek's inference code) at every index source; the
detach rules of item 9.

Decisions where SPEC is silent:
  * KL with no valid token in the batch: 0 (the sum is divided by max(n_valid, 1)).
  * Dense loss mode changes only the loss entries (every visible entry, ignoring the candidate
    mask, teacher and student alike); attention always uses the selection.
  * The student of a layer after the candidate source is its raw I (before the mask); on its
    selection it equals the masked I.
  * A compressed layer with no kv source at or below it is a configuration error (layer_spec41).
  * Input: x.{L} wins over x; a layer with neither is an error. dout likewise.
  * Gradient names follow the tensor read (a leading "model." stays), as SPEC 2 asks.
"""
import argparse
import json
import math
import os
import sys
from dataclasses import dataclass, field

import numpy as np
import torch

sys.dont_write_bytecode = True   # keep tests/ref free of __pycache__
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))       # tests/: ckptlib.py (FP8 byte formats)
import ckptlib  # noqa: E402
import layer_spec41 as spec  # noqa: E402
import st  # noqa: E402
from ref import Doc, attend, docs_from_cu, kl_sum, project_out, rmsnorm, rope  # noqa: E402

torch.set_num_threads(1)
DTYPE = torch.float64
NO_ID = -1
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
SCALE_SUFFIXES = ("scale", "weight_scale_inv")     # sibling of "<name>.weight": "<name>.<suffix>"
MODEL_PREFIX = "model."


def fail(msg):
    raise SystemExit(f"ref41.py: {msg}")


# ----------------------------------------------------------------------------------------------
# Files: weights (single file, index, directory; float or FP8), input, grad-output
# ----------------------------------------------------------------------------------------------

class WeightFiles:
    """Where each stored tensor lives: a single safetensors file, or the shards of an index."""

    def __init__(self, path):
        if os.path.isdir(path):
            index = os.path.join(path, "model.safetensors.index.json")
            files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
            if os.path.exists(index):
                path = index
            elif len(files) == 1:
                path = os.path.join(path, files[0])
            else:
                fail(f"{path}: directory without model.safetensors.index.json (and not one .safetensors file)")
        self.path = path
        self.headers = {}
        if path.endswith(".json"):
            with open(path) as fh:
                weight_map = json.load(fh).get("weight_map")
            if not isinstance(weight_map, dict):
                fail(f"{path}: no weight_map")
            base = os.path.dirname(path)
            self.where = {name: os.path.join(base, shard) for name, shard in weight_map.items()}
        else:
            header, _, _ = st.read_header(path)
            self.where = {name: path for name in header}

    def __contains__(self, name):
        return name in self.where

    def info(self, name):
        f = self.where[name]
        if f not in self.headers:
            if not os.path.exists(f):
                fail(f"{self.path}: tensor '{name}' maps to missing shard {f}")
            self.headers[f] = st.read_header(f)[0]
        if name not in self.headers[f]:
            fail(f"{f}: index names tensor '{name}' but the shard does not hold it")
        return self.headers[f][name]

    def read(self, name):
        return st.read_selected(self.where[name], [name])[name]


def stored_name(files, full):
    """The name under which `full` (layers.L.attn...) is stored: as is, or with 'model.'."""
    for name in (full, MODEL_PREFIX + full):
        if name in files:
            return name
    return None


def dequantize_fp8(files, name, shape, block):
    """W[n][k] = e4m3(Wq[n][k]) * scale[n // b0][k // b1] in float64 (exact), SPEC 2."""
    base = name[: -len("weight")]
    scale_name = next((base + s for s in SCALE_SUFFIXES if base + s in files), None)
    if scale_name is None:
        fail(f"tensor '{name}' is F8_E4M3 but has no '{base}scale' (or '{base}weight_scale_inv')")
    b0, b1 = block
    want = (-(-shape[0] // b0), -(-shape[1] // b1))
    dt, s = files.read(scale_name)
    if tuple(s.shape) != want:
        fail(f"tensor '{scale_name}' has shape {list(s.shape)}, expected {list(want)} "
             f"(blocks of {b0} x {b1} over {list(shape)})")
    if dt == "F8_E8M0":
        scale = ckptlib.e8m0_decode(s)
    elif dt == "F32":
        scale = s.astype(np.float64)
    else:
        fail(f"tensor '{scale_name}': dtype {dt} is not a usable scale (F8_E8M0 or F32)")
    _, codes = files.read(name)
    full = np.repeat(np.repeat(scale, b0, axis=0), b1, axis=1)[: shape[0], : shape[1]]
    return ckptlib.e4m3_decode(codes) * full


def read_weight(files, name, shape, block):
    info = files.info(name)
    if tuple(info["shape"]) != tuple(shape):
        fail(f"tensor '{name}' has shape {list(info['shape'])}, expected {list(shape)}")
    dt = info["dtype"]
    if dt in FLOAT_DTYPES:
        w = files.read(name)[1].astype(np.float64)
    elif dt == "F8_E4M3" and len(shape) == 2:
        w = dequantize_fp8(files, name, shape, block)
    else:
        fail(f"tensor '{name}': dtype {dt} is not usable (F64/F32/F16/BF16, or F8_E4M3 with a scale)")
    if not np.isfinite(w).all() or (np.abs(w) > np.finfo(np.float32).max).any():
        fail(f"tensor '{name}': NaN or infinite (or beyond float32) weight")
    return torch.from_numpy(w)


def load_weights(path, cfg, roles):
    """Returns ({layer: {short name: float64 tensor}}, {layer: {short name: stored name}})."""
    files = WeightFiles(path)
    weights, names = {}, {}
    for role in roles:
        L = role.layer
        weights[L], names[L] = {}, {}
        for short, shape in spec.weight_shapes(cfg, role).items():
            full = spec.layer_prefix(L) + short
            name = stored_name(files, full)
            if name is None:
                fail(f"{path}: missing tensor '{full}' (layer {L}, role {role.kind})")
            weights[L][short] = read_weight(files, name, shape, cfg.fp8_block)
            names[L][short] = name
    return weights, names


def per_layer(tensors, base, layers, path, what):
    """{layer: array} from `base.{L}` or a single `base` serving every layer without its own."""
    out = {}
    for L in layers:
        name = f"{base}.{L}"
        if name in tensors:
            out[L] = tensors[name]
        elif base in tensors:
            out[L] = tensors[base]
        else:
            fail(f"{path}: missing tensor '{name}' (nor a single '{base}') for layer {L} {what}")
    return out


def load_input(path, layers, dim):
    """Returns ({layer: x [T, d] float64}, docs, shape of x). A batch [B, S, d] is the packed case
    cu = [0, S, 2S, ...] with every token real (SPEC 4)."""
    tensors = st.read(path)
    xs = per_layer(tensors, "x", layers, path, "input")
    shapes = {tuple(x.shape) for x in xs.values()}
    if len(shapes) != 1:
        fail(f"{path}: the layers' inputs have different shapes {sorted(shapes)}")
    shape = shapes.pop()
    if len(shape) == 3:
        if "cu_seqlens" in tensors or "seqlens_real" in tensors:
            fail(f"{path}: x [B, S, d] must not come with cu_seqlens/seqlens_real")
        B, S, _ = shape
        docs = [Doc(b * S, S, S) for b in range(B)]
    elif len(shape) == 2:
        T = shape[0]
        try:
            docs = docs_from_cu(tensors.get("cu_seqlens", np.array([0, T])), tensors.get("seqlens_real"), T)
        except SystemExit as e:
            fail(str(e).replace("ref.py: ", ""))
    else:
        fail(f"{path}: x must be [T, d] or [B, S, d], got {list(shape)}")
    if shape[-1] != dim:
        fail(f"{path}: x has {shape[-1]} columns, hidden_size is {dim}")
    return ({L: torch.from_numpy(x.astype(np.float64).reshape(-1, dim)) for L, x in xs.items()}, docs, shape)


def load_grad(path, layers, shape, dim):
    douts = per_layer(st.read(path), "dout", layers, path, "grad-output")
    for L, g in douts.items():
        if tuple(g.shape) != tuple(shape):
            fail(f"{path}: dout of layer {L} has shape {list(g.shape)}, out has {list(shape)}")
    return {L: torch.from_numpy(g.astype(np.float64).reshape(-1, dim)) for L, g in douts.items()}


# ----------------------------------------------------------------------------------------------
# Building blocks (SPEC 3 as changed by SPEC 10); rmsnorm, rope, attend, project_out, kl_sum
# come from ref.py (the V4 reference): the same math.
# ----------------------------------------------------------------------------------------------

def rope_frequencies(cfg, ratio):
    """f_i = theta^(-2i/R). r != 0 (r = 1 included): compress_rope_theta with the YaRN ramp when
    original_max_position_embeddings > 0 (no mscale); r == 0: rope_theta, no YaRN. float64."""
    R = cfg.rope_dim
    i = np.arange(R // 2, dtype=np.float64)
    if ratio == spec.SWA:
        return torch.from_numpy(cfg.rope_theta ** (-2.0 * i / R))
    theta = cfg.compress_rope_theta
    freqs = theta ** (-2.0 * i / R)
    if cfg.yarn_original_max_pos <= 0:
        return torch.from_numpy(freqs)

    def correction_dim(n_rotations):
        return R * math.log(cfg.yarn_original_max_pos / (n_rotations * 2 * math.pi)) / (2 * math.log(theta))

    lo = max(math.floor(correction_dim(cfg.yarn_beta_fast)), 0)
    hi = min(math.ceil(correction_dim(cfg.yarn_beta_slow)), R - 1)
    span = hi - lo if hi != lo else 0.001
    ramp = np.clip((i - lo) / span, 0.0, 1.0)
    smooth = 1.0 - ramp
    return torch.from_numpy(freqs / cfg.yarn_factor * (1.0 - smooth) + freqs * smooth)


def queries(cfg, W, x, pos, freqs):
    """Step 1: qr = RMSNorm_{q_norm}(wq_a x); q = RoPE_p(wq_b qr) viewed [H, D], no per-head norm."""
    qr = rmsnorm(x @ W["attn.wq_a.weight"].T, W["attn.q_norm.weight"], cfg.eps)
    q = (qr @ W["attn.wq_b.weight"].T).view(x.shape[0], cfg.n_heads, cfg.head_dim)
    return qr, rope(q, pos.unsqueeze(-1), freqs)


def window_kv(cfg, W, x, pos, freqs):
    """Step 2: kv = RoPE_p(RMSNorm_{kv_norm}(wkv x)); key = value."""
    return rope(rmsnorm(x @ W["attn.wkv.weight"].T, W["attn.kv_norm.weight"], cfg.eps), pos, freqs)


def compress_latent(cfg, W, x, ratio):
    """Step 3 (kv sources), before RoPE. r = 1: latent[j] = RMSNorm(compressor.wkv x[j]).
    r = 2: entry j pools rows [2j, 2j+2): per channel softmax over the two rows of Z = wgate x,
    weighted sum of C = wkv x, then RMSNorm. A trailing odd row forms no entry."""
    n_c = x.shape[0] // ratio
    norm = W["attn.compressor.norm.weight"]
    if ratio == 1:
        return rmsnorm(x @ W["attn.compressor.wkv.weight"].T, norm, cfg.eps)
    rows = x[: n_c * ratio]
    C = (rows @ W["attn.compressor.wkv.weight"].T).view(n_c, ratio, cfg.head_dim)
    Z = (rows @ W["attn.compressor.wgate.weight"].T).view(n_c, ratio, cfg.head_dim)
    pooled = (torch.softmax(Z, dim=1) * C).sum(dim=1)
    return rmsnorm(pooled, norm, cfg.eps)


def entry_positions(n_c, ratio):
    """Compressed entry j sits at document position j * r."""
    return torch.arange(n_c, dtype=DTYPE) * ratio


def index_keys(cfg, W, latent, ratio, freqs):
    """Step 4 (kv sources): KI[j] = RoPE_{j r}(RMSNorm_{k_norm}(indexer.wk latent[j])), from the
    latent before its RoPE. The latent comes in detached (item 9): only wk and k_norm learn here."""
    k = rmsnorm(latent @ W["attn.indexer.wk.weight"].T, W["attn.indexer.k_norm.weight"], cfg.eps)
    return rope(k, entry_positions(latent.shape[0], ratio), freqs)


def index_scores(cfg, W, x, qr, keys, pos, freqs):
    """Step 4 (index sources): I[p, j] = sum_h w[p,h] ReLU(qI[p,h] . KI[j]) for every (p, j);
    qI = RoPE_p(indexer.wq_b qr) viewed [Hi, Di], w = weights_proj x * Di^-0.5 * Hi^-0.5.
    x and qr come in detached. Visibility is applied by the caller (masks)."""
    Hi, Di = cfg.index_n_heads, cfg.index_head_dim
    qI = rope((qr @ W["attn.indexer.wq_b.weight"].T).view(qr.shape[0], Hi, Di), pos.unsqueeze(-1), freqs)
    w = (x @ W["attn.indexer.weights_proj.weight"].T) * (Di ** -0.5) * (Hi ** -0.5)
    dots = torch.einsum("thd,jd->thj", qI, keys)
    return (w.unsqueeze(-1) * torch.relu(dots)).sum(dim=1)


def visibility(n, n_c, ratio):
    """Query p (document-local) sees entries j < (p + 1) // r. Returns (mask [n, n_c], counts [n])."""
    counts = (torch.arange(n) + 1) // ratio
    return torch.arange(n_c).unsqueeze(0) < counts.unsqueeze(1), counts


def window_mask(n, W):
    """Query p sees raw tokens max(0, p-W+1) .. p of its document."""
    p = torch.arange(n).unsqueeze(1)
    j = torch.arange(n).unsqueeze(0)
    return (j <= p) & (j > p - W)


def masked_scores(scores, allowed):
    """numpy float64 copy of scores with -inf where not allowed (+ 0.0 turns -0.0 into 0.0)."""
    s = scores.detach().numpy() + 0.0
    return np.where(allowed.numpy(), s, -np.inf)


def order_desc(values):
    """Indices of each row sorted by (value desc, index asc): a stable sort of -value."""
    return np.argsort(-values, axis=1, kind="stable")


def candidate_blocks(scores, n_visible, topk_blocks, block_size):
    """Step 5 at the candidate source. scores [n, n_c] numpy, -inf where invisible. Block b covers
    entries [b bs, (b+1) bs); block score = max over the block; the block of the newest visible
    entry, (n_visible - 1) // bs, is pinned to +inf (none without a visible entry); the topk_blocks
    best blocks with a score > -inf are kept, ties to the smaller block. Returns the kept-entry
    mask [n, n_c] (bool numpy: the visible entries of kept blocks) and the kept block ids per row
    (sorted by (score desc, id asc)).
    Example (bs 2, keep 2): entry scores [5, 1 | 3, 3 | 0, -inf] (query sees 5 entries): block
    scores [5, 3, 0], newest block 2 pinned -> [5, 3, +inf] -> keep blocks [2, 0] = entries 0, 1, 4."""
    n, n_c = scores.shape
    n_blocks = -(-n_c // block_size)
    padded = np.full((n, n_blocks * block_size), -np.inf)
    padded[:, :n_c] = scores
    block = padded.reshape(n, n_blocks, block_size).max(axis=2) if n_blocks else np.zeros((n, 0))
    rows = np.nonzero(np.asarray(n_visible) > 0)[0]
    block[rows, (np.asarray(n_visible)[rows] - 1) // block_size] = np.inf
    kept_ids, kept = [], np.zeros((n, n_blocks), dtype=bool)
    for t, order in enumerate(order_desc(block)):
        ids = [int(b) for b in order[:topk_blocks] if block[t, b] > -np.inf]
        kept[t, ids] = True
        kept_ids.append(ids)
    visible = np.arange(n_c)[None, :] < np.asarray(n_visible)[:, None]
    return np.repeat(kept, block_size, axis=1)[:, :n_c] & visible, kept_ids


def select_entries(scores, k):
    """Step 6: per row the min(k, #finite) entries with the largest score, ties to the smaller id,
    never a -inf entry; sorted by (score desc, id asc). scores [n, n_c] numpy (-inf = not allowed)."""
    n_finite = np.isfinite(scores).sum(axis=1)
    return [order[: min(k, int(n_finite[t]))].tolist() for t, order in enumerate(order_desc(scores))]


def selection_mask(selected, n_c):
    mask = torch.zeros((len(selected), n_c), dtype=torch.bool)
    for t, ids in enumerate(selected):
        mask[t, ids] = True
    return mask


# ----------------------------------------------------------------------------------------------
# The shared state of one forward pass (SPEC 10 "Running layers that share")
# ----------------------------------------------------------------------------------------------

@dataclass
class KVSource:
    """What a kv source publishes, per document: cmp (RoPE'd latent; carries the gradients of
    every consumer into the source's compressor and x) and KI (gradients into wk, k_norm only)."""
    layer: int
    cmp: list
    keys: list
    cu_cmp: list            # prefix sums of the documents' entry counts (global compressed ids)


@dataclass
class Shared:
    kv: dict = field(default_factory=dict)          # kv source layer -> KVSource
    selections: dict = field(default_factory=dict)  # index source layer -> per doc, per real token, local ids
    candidates: object = None                       # per doc kept-entry mask [n, n_c] (numpy), or None
    candidate_blocks: object = None                 # per doc, per token, kept block ids


@dataclass
class LayerResult:
    layer: int
    role: object
    out: torch.Tensor                  # [T, d]
    loss: object = None                # index sources: scalar tensor (coeff applied)
    n_valid: int = 0
    topk_ids: object = None            # index sources: int32 [T, k]
    topk_scores: object = None         # [T, k]
    index_scores: object = None        # [T, C_total] before the candidate mask
    index_scores_masked: object = None # layers using candidates: after it


# ----------------------------------------------------------------------------------------------
# One layer on one document, then on the packed stream
# ----------------------------------------------------------------------------------------------

def publish_kv(cfg, role, W, x, i, state, freqs, n_docs):
    """Steps 3-4 at a kv source: cmp[j] = RoPE_{j r}(latent[j]) and KI from the detached latent,
    published for every consumer of document i."""
    r = role.ratio
    latent = compress_latent(cfg, W, x, r)
    src = state.kv.setdefault(role.layer, KVSource(role.layer, [None] * n_docs, [None] * n_docs, None))
    src.cmp[i] = rope(latent, entry_positions(latent.shape[0], r), freqs)
    src.keys[i] = index_keys(cfg, W, latent.detach(), r, freqs)


def select_and_publish(cfg, role, W, x, qr, q, src, i, state, freqs, n_docs):
    """Steps 4-6 and 8 at an index source, for document i: scores I (from detached x, qr), the
    candidate blocks (candidate source), the candidate mask (index sources after it), the selection
    (published), and the KL loss against this layer's own detached attention over cmp at it.
    Returns (attended-entry mask [n, n_c], dict of results for the outputs)."""
    cmp = src.cmp[i]
    visible, n_visible = visibility(x.shape[0], cmp.shape[0], role.ratio)
    scores = index_scores(cfg, W, x.detach(), qr.detach(), src.keys[i], torch.arange(x.shape[0], dtype=DTYPE), freqs)
    allowed = masked_scores(scores, visible)
    masked = None
    if role.is_candidate_source:
        kept, kept_ids = candidate_blocks(allowed, n_visible.numpy(), cfg.candidate_topk_blocks,
                                          cfg.candidate_block_size)
        if state.candidates is None:
            state.candidates, state.candidate_blocks = [None] * n_docs, [None] * n_docs
        state.candidates[i], state.candidate_blocks[i] = kept, kept_ids
    if role.uses_candidates:
        masked = np.where(state.candidates[i], allowed, -np.inf)
    selected = select_entries(allowed if masked is None else masked, cfg.index_topk)
    state.selections.setdefault(role.layer, [None] * n_docs)[i] = selected
    attended = selection_mask(selected, cmp.shape[0])
    entries = attended if cfg.index_loss_mode == "sparse" else visible
    # student: the raw I (before the candidate mask); teacher: q and cmp detached
    kl, n_valid = kl_sum(q.detach(), cmp.detach(), scores, entries, cfg.head_dim ** -0.5)
    return attended, dict(selected=selected, scores=allowed, masked=masked, kl=kl, n_valid=n_valid)


def doc_forward(cfg, role, W, x, i, state, freqs, n_docs):
    """SPEC 10 steps 1-9 of layer role.layer for document i's real rows x [n, d] (positions
    document-local). Returns (out [n, d], dict of index-source results or None)."""
    n = x.shape[0]
    pos = torch.arange(n, dtype=DTYPE)
    qr, q = queries(cfg, W, x, pos, freqs)                                 # 1
    keys = window_kv(cfg, W, x, pos, freqs)                                # 2
    mask = window_mask(n, cfg.window)
    extra = None
    if role.ratio != spec.SWA:
        if role.is_kv_source:                                              # 3, 4 (keys)
            publish_kv(cfg, role, W, x, i, state, freqs, n_docs)
        src = state.kv[role.kv_source]
        if role.is_index_source:                                           # 4 (scores), 5, 6, 8
            attended, extra = select_and_publish(cfg, role, W, x, qr, q, src, i, state, freqs, n_docs)
        else:                                                              # Reuse: the index source's
            attended = selection_mask(state.selections[role.index_source][i], src.cmp[i].shape[0])
        keys = torch.cat([keys, src.cmp[i]], dim=0)                        # 7: window, then cmp at sel
        mask = torch.cat([mask, attended], dim=1)
    o = attend(q, keys, mask, W["attn.attn_sink"], cfg.head_dim ** -0.5)   # 7: sink, scale
    o = rope(o, -pos.unsqueeze(-1), freqs)                                 # 8: inverse RoPE
    return project_out(o, W["attn.wo_a.weight"], W["attn.wo_b.weight"], cfg.o_groups), extra   # 9


def layer_forward(cfg, role, W, x, docs, state):
    """One layer on packed x [T, d] (SPEC 4): each document on its own real rows; padding rows give
    zero output. Global compressed ids: cu_cmp[doc] + local id in the KV source's sequence."""
    freqs = rope_frequencies(cfg, role.ratio)
    T, k = x.shape[0], cfg.index_topk
    res = LayerResult(role.layer, role, None)
    pieces, extras = [], []
    for i, doc in enumerate(docs):
        out, extra = doc_forward(cfg, role, W, x[doc.start: doc.start + doc.real], i, state, freqs, len(docs))
        pieces += [out, x.new_zeros((doc.padded - doc.real, cfg.dim))]
        extras.append(extra)
    res.out = torch.cat(pieces, dim=0)
    if role.is_kv_source:
        src = state.kv[role.layer]
        src.cu_cmp = [0] + np.cumsum([c.shape[0] for c in src.cmp]).tolist()
    if role.is_index_source:
        cu = state.kv[role.kv_source].cu_cmp
        res.topk_ids = np.full((T, k), NO_ID, dtype=np.int32)
        res.topk_scores = np.full((T, k), -np.inf)
        res.index_scores = np.full((T, cu[-1]), -np.inf)
        if role.uses_candidates:
            res.index_scores_masked = np.full((T, cu[-1]), -np.inf)
        kl_total = x.new_zeros(())
        for i, (doc, extra) in enumerate(zip(docs, extras)):
            rows = slice(doc.start, doc.start + doc.real)
            for t, ids in enumerate(extra["selected"]):
                res.topk_ids[doc.start + t, :len(ids)] = np.array(ids, dtype=np.int64) + cu[i]
                res.topk_scores[doc.start + t, :len(ids)] = extra["scores"][t, ids]
            res.index_scores[rows, cu[i]:cu[i + 1]] = extra["scores"]
            if role.uses_candidates:
                res.index_scores_masked[rows, cu[i]:cu[i + 1]] = extra["masked"]
            kl_total = kl_total + extra["kl"]
            res.n_valid += extra["n_valid"]
        # coeff / n_valid * sum of KL over the whole batch (0 when no token has an entry)
        res.loss = cfg.index_loss_coeff * kl_total / max(res.n_valid, 1)
    return res


# ----------------------------------------------------------------------------------------------
# The range
# ----------------------------------------------------------------------------------------------

def forward_range(cfg, roles, W, xs, docs):
    """Forward of layers in order with one shared state. Returns ({layer: LayerResult}, state)."""
    state = Shared()
    results = {}
    for role in roles:
        results[role.layer] = layer_forward(cfg, role, W[role.layer], xs[role.layer], docs, state)
    return results, state


def objective(results, douts, loss_weight=None):
    """sum_L sum(out_L * dout_L) + sum over index layers of (loss_weight[L] *) indexer_loss_L."""
    total = 0.0
    for L, res in results.items():
        total = total + (res.out * douts[L]).sum()
        if res.loss is not None:
            total = total + res.loss * (1.0 if loss_weight is None else loss_weight.get(L, 0.0))
    return total


def run(cfg, roles, weights, xs, docs, douts=None, loss_weight=None):
    """Forward (and backward with douts) on float64 tensors. Returns (results, state, {layer: dx},
    {layer: {short name: grad}}); gradients are None without douts; weights no path reaches get
    exact zeros. loss_weight (tests only) weighs each index layer's loss in the objective."""
    grad = douts is not None
    W = {L: {n: w.detach().clone().requires_grad_(grad) for n, w in ws.items()} for L, ws in weights.items()}
    X = {L: x.detach().clone().requires_grad_(grad) for L, x in xs.items()}
    results, state = forward_range(cfg, roles, W, X, docs)
    if not grad:
        return results, state, None, None
    objective(results, douts, loss_weight).backward()
    dx = {L: x.grad if x.grad is not None else torch.zeros_like(x) for L, x in X.items()}
    grads = {L: {n: (w.grad if w.grad is not None else torch.zeros_like(w)) for n, w in ws.items()}
             for L, ws in W.items()}
    return results, state, dx, grads


def selection_users(roles):
    """{index source: [layers attending with its selection]} within the range."""
    users = {}
    for role in roles:
        if role.index_source is not None:
            users.setdefault(role.index_source, []).append(role.layer)
    return users


def outputs_of(results, roles, x_shape, dx=None, grads=None, names=None):
    """The {name: numpy array} to write, and the list of reference-only names."""
    outputs, reference_only = {}, []
    for role in roles:
        L, res = role.layer, results[role.layer]
        outputs[f"out.{L}"] = res.out.detach().numpy().reshape(x_shape)
        if role.is_index_source:
            outputs[f"topk_ids.{L}"] = res.topk_ids
            outputs[f"indexer_loss.{L}"] = np.array([float(res.loss)])
            outputs[f"topk_scores.{L}"] = res.topk_scores
            outputs[f"index_scores.{L}"] = res.index_scores
            reference_only += [f"topk_scores.{L}", f"index_scores.{L}"]
            if role.uses_candidates:
                outputs[f"index_scores_masked.{L}"] = res.index_scores_masked
                reference_only.append(f"index_scores_masked.{L}")
    if dx is not None:
        for role in roles:
            outputs[f"dx.{role.layer}"] = dx[role.layer].numpy().reshape(x_shape)
        for role in roles:
            for short, g in grads[role.layer].items():
                outputs["grad." + names[role.layer][short]] = g.numpy()
    return outputs, reference_only


def run_files(config, layers, weights_path, input_path, grad_path=None):
    """Reads a case and returns ({name: numpy array}, metadata) to write (see the docstring)."""
    try:
        cfg = spec.load_config(config)
        first, last = spec.parse_range(layers) if isinstance(layers, str) else layers
        roles = spec.check_range(cfg, first, last)
    except spec.ConfigError as e:
        fail(str(e))
    weights, names = load_weights(weights_path, cfg, roles)
    layer_ids = [r.layer for r in roles]
    xs, docs, x_shape = load_input(input_path, layer_ids, cfg.dim)
    douts = load_grad(grad_path, layer_ids, x_shape, cfg.dim) if grad_path else None
    results, _, dx, grads = run(cfg, roles, weights, xs, docs, douts)
    outputs, reference_only = outputs_of(results, roles, x_shape, dx, grads, names)
    users = selection_users(roles)
    meta = {"producer": "tests/ref/ref41.py", "layers": f"{first}-{last}",
            "roles": ",".join(f"{r.layer}:{r.kind}" for r in roles),
            "n_valid": ",".join(f"{L}:{res.n_valid}" for L, res in results.items() if res.role.is_index_source),
            "selection_users": ";".join(f"{s}:" + " ".join(map(str, u)) for s, u in users.items()),
            "reference_only": ",".join(reference_only)}
    return outputs, meta


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    p.add_argument("--layers", required=True, help="A-B (or A)")
    p.add_argument("--weights", required=True)
    p.add_argument("--input", required=True)
    p.add_argument("--grad-output", default=None)
    p.add_argument("--output", required=True)
    a = p.parse_args(argv)
    outputs, meta = run_files(a.config, a.layers, a.weights, a.input, a.grad_output)
    st.write(a.output, outputs, metadata=meta)


if __name__ == "__main__":
    main()
