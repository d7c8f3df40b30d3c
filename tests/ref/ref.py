#!/usr/bin/env -S /usr/bin/python3
"""ref.py: independent float64 PyTorch reference of one DeepSeek V4 attention layer (SPEC sections 3-4),
forward and backward (autograd), for the tests of the C library.

  ref.py --config C.json --layer L --weights W.safetensors --input IN.safetensors
         [--grad-output G.safetensors] --output EXP.safetensors

Writes (float64 unless noted):
  out            same shape as x ([T, d] or [B, S, d])
  topk_ids       I32 [T, index_topk]   (r = 4) global compressed ids, sorted by (score desc, id asc), -1 padded
  topk_scores    [T, index_topk]       (r = 4) indexer scores of topk_ids, -inf padded      (reference only)
  index_scores   [T, C_total]          (r = 4) indexer score of every visible slot, -inf elsewhere
                                                (reference only: compare.py uses it to judge near-ties)
  indexer_loss   [1]                   (r = 4) KL loss, already multiplied by index_loss_coeff
  dx, grad.<weight name>               with --grad-output: gradients of sum(out * dout) + indexer_loss

The code follows SPEC step by step, one small function per step; one document at a time (every
position is document-local), vectorised inside a document with explicit masks. It is written to be
read, not to be fast.
"""
import argparse
import math
import os
import sys
from dataclasses import dataclass

import numpy as np
import torch

sys.dont_write_bytecode = True   # keep tests/ref free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import layer_spec  # noqa: E402
import st  # noqa: E402
from layer_spec import CSA_RATIO, SWA_RATIO  # noqa: E402

torch.set_num_threads(1)
DTYPE = torch.float64
NO_ID = -1                      # padding of topk_ids
REFERENCE_ONLY = ("topk_scores", "index_scores")   # outputs the C program does not write


@dataclass
class Doc:
    """One packed document: rows [start, start + padded) of x, the first `real` of them real."""
    start: int
    padded: int
    real: int


# ----------------------------------------------------------------------------------------------
# Files
# ----------------------------------------------------------------------------------------------

def load_weights(path, cfg, layer):
    """Returns ({short name: float64 tensor}, prefix). Accepts names with or without 'layers.L.'
    and any stored float dtype (converted exactly). Missing tensors / wrong shapes are errors."""
    stored = st.read(path)
    shapes = layer_spec.weight_shapes(cfg)
    prefix = layer_spec.layer_prefix(layer)
    probe = next(iter(shapes))
    if prefix + probe not in stored:
        if probe not in stored:
            raise SystemExit(f"ref.py: {path}: no '{prefix}{probe}' (nor '{probe}')")
        prefix = ""
    weights = {}
    for short, shape in shapes.items():
        name = prefix + short
        if name not in stored:
            raise SystemExit(f"ref.py: {path}: missing tensor '{name}'")
        arr = stored[name]
        if tuple(arr.shape) != tuple(shape):
            raise SystemExit(f"ref.py: {path}: tensor '{name}' has shape {list(arr.shape)}, expected {list(shape)}")
        if not np.issubdtype(arr.dtype, np.floating):
            raise SystemExit(f"ref.py: {path}: tensor '{name}' must be a float tensor")
        weights[short] = torch.from_numpy(arr.astype(np.float64))
    return weights, prefix


def docs_from_cu(cu, real, n_rows):
    """Validates cu_seqlens / seqlens_real (SPEC 4) and returns the documents."""
    cu = [int(v) for v in cu]
    if len(cu) < 2 or cu[0] != 0 or cu[-1] != n_rows:
        raise SystemExit(f"ref.py: cu_seqlens must start at 0 and end at T = {n_rows}, got {cu}")
    padded = [b - a for a, b in zip(cu[:-1], cu[1:])]
    real = padded if real is None else [int(v) for v in real]
    if len(real) != len(padded):
        raise SystemExit("ref.py: seqlens_real must have one entry per document")
    docs = []
    for i, (p, r) in enumerate(zip(padded, real)):
        if not 0 < r <= p:
            raise SystemExit(f"ref.py: document {i}: need 0 < seqlens_real ({r}) <= padded length ({p})")
        docs.append(Doc(cu[i], p, r))
    return docs


def load_input(path):
    """Returns (x [T, d] float64, docs, original shape of x). A batch [B, S, d] is the packed case
    cu = [0, S, 2S, ...] with every token real (SPEC 4)."""
    tensors = st.read(path)
    if "x" not in tensors:
        raise SystemExit(f"ref.py: {path}: missing tensor 'x'")
    x = tensors["x"].astype(np.float64)
    if x.ndim == 3:
        if "cu_seqlens" in tensors or "seqlens_real" in tensors:
            raise SystemExit(f"ref.py: {path}: x [B, S, d] must not come with cu_seqlens/seqlens_real")
        B, S, _ = x.shape
        docs = [Doc(b * S, S, S) for b in range(B)]
    elif x.ndim == 2:
        T = x.shape[0]
        cu = tensors.get("cu_seqlens", np.array([0, T]))
        docs = docs_from_cu(cu, tensors.get("seqlens_real"), T)
    else:
        raise SystemExit(f"ref.py: {path}: x must be [T, d] or [B, S, d], got {list(x.shape)}")
    return torch.from_numpy(x.reshape(-1, x.shape[-1])), docs, x.shape


def check_layout(cfg, docs, x):
    """SPEC 4: documents of any length; the last real % r real tokens of a document form no slot."""
    if x.shape[1] != cfg.dim:
        raise SystemExit(f"ref.py: x has {x.shape[1]} columns, hidden_size is {cfg.dim}")


# ----------------------------------------------------------------------------------------------
# Building blocks (SPEC 3)
# ----------------------------------------------------------------------------------------------

def rmsnorm(v, weight, eps):
    """v / sqrt(mean(v^2) + eps) * weight over the last dim (weight None: no multiply)."""
    v = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)
    return v if weight is None else v * weight


def rope_frequencies(cfg):
    """f_i = theta^(-2i/R), i < R/2. r > 0: compress_rope_theta with the YaRN ramp (no mscale);
    r == 0: rope_theta, no YaRN. float64."""
    R = cfg.rope_dim
    i = np.arange(R // 2, dtype=np.float64)
    if cfg.ratio == SWA_RATIO:
        return torch.from_numpy(cfg.rope_theta ** (-2.0 * i / R))
    theta = cfg.compress_rope_theta
    freqs = theta ** (-2.0 * i / R)

    def correction_dim(n_rotations):
        return R * math.log(cfg.yarn_original_max_pos / (n_rotations * 2 * math.pi)) / (2 * math.log(theta))

    lo = max(math.floor(correction_dim(cfg.yarn_beta_fast)), 0)
    hi = min(math.ceil(correction_dim(cfg.yarn_beta_slow)), R - 1)
    span = hi - lo if hi != lo else 0.001
    ramp = np.clip((i - lo) / span, 0.0, 1.0)
    smooth = 1.0 - ramp
    freqs = freqs / cfg.yarn_factor * (1.0 - smooth) + freqs * smooth
    return torch.from_numpy(freqs)


def rope(v, pos, freqs):
    """RoPE_pos on the LAST R dims of v, interleaved pairs (v[D'-R+2i], v[D'-R+2i+1]).
    pos (float64) broadcasts against v.shape[:-1]; pass -pos for the inverse rotation."""
    R = 2 * freqs.numel()
    angle = pos.to(torch.float64).unsqueeze(-1) * freqs.to(torch.float64)   # angles in double,
    cos, sin = angle.cos().to(v.dtype), angle.sin().to(v.dtype)               # cos/sin in v's dtype
    keep, rot = v[..., :-R], v[..., -R:]
    a, b = rot[..., 0::2], rot[..., 1::2]
    rotated = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
    return torch.cat([keep, rotated], dim=-1)


def compress(x, wkv, wgate, ape, norm_weight, ratio, head_dim, eps, freqs):
    """Compressor of one document's REAL rows x [n, d] -> [n // ratio, head_dim] (SPEC 3 step 3).
    ratio 128: slot j pools rows [jr, jr+r) of all channels. ratio 4 (overlapping): channel e of slot j
    pools 8 rows: the own window's second-half channels (head_dim + e) and the previous window's
    first-half channels (e), the latter absent for j = 0 (logit -inf, value 0). Softmax per channel
    over the rows of logits Z + ape; then RMSNorm and RoPE at the slot position j * ratio."""
    n_slots = x.shape[0] // ratio
    if n_slots == 0:
        return x.new_zeros((0, head_dim))
    rows = x[: n_slots * ratio]
    values = (rows @ wkv.T).view(n_slots, ratio, -1)          # C  [n_slots, ratio, coff * head_dim]
    logits = (rows @ wgate.T).view(n_slots, ratio, -1) + ape  # Z + ape
    if ratio == CSA_RATIO:
        own_v, own_z = values[..., head_dim:], logits[..., head_dim:]
        prev_v, prev_z = values[..., :head_dim], logits[..., :head_dim]
        # slot j takes window j-1's first half: shift down by one slot, slot 0 gets nothing
        no_v = prev_v.new_zeros((1, ratio, head_dim))
        no_z = prev_z.new_full((1, ratio, head_dim), -math.inf)
        prev_v = torch.cat([no_v, prev_v[:-1]], dim=0)
        prev_z = torch.cat([no_z, prev_z[:-1]], dim=0)
        values = torch.cat([prev_v, own_v], dim=1)            # [n_slots, 2 * ratio, head_dim]
        logits = torch.cat([prev_z, own_z], dim=1)
    pooled = (torch.softmax(logits, dim=1) * values).sum(dim=1)
    slot_pos = torch.arange(n_slots, dtype=DTYPE) * ratio
    return rope(rmsnorm(pooled, norm_weight, eps), slot_pos, freqs)


def compressor_of(W, prefix, ratio, head_dim, cfg, freqs, x):
    return compress(x, W[prefix + "wkv.weight"], W[prefix + "wgate.weight"], W[prefix + "ape"],
                    W[prefix + "norm.weight"], ratio, head_dim, cfg.eps, freqs)


def indexer_scores(cfg, W, x, qr, pos, freqs):
    """I[t, j] = sum_h w[t,h] ReLU(qI[t,h] . KI[j]) for every (t, j) of one document (SPEC 3 step 5;
    visibility is applied by the caller). x and qr are already detached by the caller."""
    Hi, Di = cfg.index_n_heads, cfg.index_head_dim
    KI = compressor_of(W, "attn.indexer.compressor.", CSA_RATIO, Di, cfg, freqs, x)
    qI = rope((qr @ W["attn.indexer.wq_b.weight"].T).view(-1, Hi, Di), pos.unsqueeze(-1), freqs)
    w = (x @ W["attn.indexer.weights_proj.weight"].T) * (Di ** -0.5) * (Hi ** -0.5)
    dots = torch.einsum("thd,jd->thj", qI, KI)
    return (w.unsqueeze(-1) * torch.relu(dots)).sum(dim=1)


def select_topk(scores, slot_visible, k):
    """Per query: the min(k, #visible) visible slots with the largest score, sorted by (score desc,
    slot asc): a stable sort of -score keeps ties in ascending slot order. Returns lists of slots."""
    scores = scores.detach().numpy() + 0.0      # + 0.0 turns -0.0 into 0.0 (they tie anyway)
    n_visible = slot_visible.sum(dim=1).tolist()
    selected = []
    for t in range(scores.shape[0]):
        n_vis = n_visible[t]                    # visible slots are the prefix 0 .. n_vis-1
        order = np.argsort(-scores[t, :n_vis], kind="stable")
        selected.append(order[: min(k, n_vis)].tolist())
    return selected


def attend(q, keys, mask, sink, scale):
    """o[t,h] = sum_j e^{z_j} key_j / (sum_j e^{z_j} + e^{sink[h]}), z_j = scale q[t,h].key_j over
    the keys allowed by mask [n, n_keys]. The sink is an unscaled logit with no value."""
    z = torch.einsum("thd,jd->htj", q, keys) * scale
    z = z.masked_fill(~mask, -math.inf)
    sink_column = sink.view(-1, 1, 1).expand(-1, z.shape[1], 1)
    lse = torch.logsumexp(torch.cat([z, sink_column], dim=-1), dim=-1, keepdim=True)
    p = torch.exp(z - lse)
    return torch.einsum("htj,jd->thd", p, keys)


def project_out(o, wo_a, wo_b, groups):
    """Grouped output projection: u[t,g] = wo_a[g] concat_{h in g} o[t,h]; out = wo_b concat_g u."""
    n = o.shape[0]
    o = o.reshape(n, groups, -1)                              # heads of a group are consecutive
    u = torch.einsum("tgk,grk->tgr", o, wo_a.view(groups, -1, o.shape[-1]))
    return u.reshape(n, -1) @ wo_b.T


def kl_sum(q, cmp_kv, scores, entries, scale):
    """Sum over valid queries of KL(teacher || student) over the entries [n, n_c] of each query
    (selected slots, or all visible slots in dense mode); valid = at least one entry.
    Teacher: per-head softmax of scale q.cmp_kv over the entries (no window, no sink), summed over
    heads and L1-normalised; q and cmp_kv come in detached. Student: softmax of the indexer scores.
    Returns (sum, number of valid queries)."""
    valid = entries.any(dim=1)
    entries = entries[valid]
    if entries.shape[0] == 0:
        return scores.sum() * 0.0, 0
    z = torch.einsum("thd,jd->htj", q[valid], cmp_kv) * scale
    per_head = torch.softmax(z.masked_fill(~entries, -math.inf), dim=-1)
    teacher = per_head.sum(dim=0)
    teacher = teacher / teacher.sum(dim=-1, keepdim=True)
    log_student = torch.log_softmax(scores[valid].masked_fill(~entries, -math.inf), dim=-1)
    log_student = log_student.masked_fill(~entries, 0.0)    # teacher is 0 there; avoid 0 * -inf
    kl = torch.xlogy(teacher, teacher) - teacher * log_student
    return kl.sum(), int(valid.sum())


# ----------------------------------------------------------------------------------------------
# The layer
# ----------------------------------------------------------------------------------------------

@dataclass
class DocResult:
    out: torch.Tensor          # [n_real, d]
    selected: list             # r = 4: per query, selected slots (document-local ids)
    scores: torch.Tensor       # r = 4: [n_real, n_c] indexer scores (not masked)
    slot_visible: torch.Tensor # [n_real, n_c] bool
    kl: torch.Tensor           # r = 4: sum of KL over the document's valid queries
    n_valid: int


def doc_forward(cfg, W, x, freqs):
    """SPEC 3 for one document's real rows x [n, d]; positions are document-local."""
    n = x.shape[0]
    H, D, r = cfg.n_heads, cfg.head_dim, cfg.ratio
    pos = torch.arange(n, dtype=DTYPE)
    scale = D ** -0.5

    # 1. queries: qr, per-head RMSNorm without weight, RoPE at t
    qr = rmsnorm(x @ W["attn.wq_a.weight"].T, W["attn.q_norm.weight"], cfg.eps)
    q = (qr @ W["attn.wq_b.weight"].T).view(n, H, D)
    q = rope(rmsnorm(q, None, cfg.eps), pos.unsqueeze(-1), freqs)
    # 2. shared key/value
    kv = rope(rmsnorm(x @ W["attn.wkv.weight"].T, W["attn.kv_norm.weight"], cfg.eps), pos, freqs)
    # 3. compressed kv of this document
    if r > 0:
        cmp_kv = compressor_of(W, "attn.compressor.", r, D, cfg, freqs, x)
    else:
        cmp_kv = x.new_zeros((0, D))
    n_c = cmp_kv.shape[0]
    # 4. visibility: window max(0, t-W+1) .. t; slots j < (t+1) // r
    t_idx = torch.arange(n).unsqueeze(1)
    window = (torch.arange(n).unsqueeze(0) <= t_idx) & (torch.arange(n).unsqueeze(0) > t_idx - cfg.window)
    if r > 0:
        slot_visible = torch.arange(n_c).unsqueeze(0) < (t_idx + 1) // r
    else:
        slot_visible = torch.zeros((n, 0), dtype=torch.bool)
    # 5. indexer (detached from x and qr) and top-k selection (a constant for backward)
    selected, scores, kl, n_valid = [], None, None, 0
    if r == CSA_RATIO:
        scores = indexer_scores(cfg, W, x.detach(), qr.detach(), pos, freqs)
        selected = select_topk(scores, slot_visible, cfg.index_topk)
        attended_slots = torch.zeros((n, n_c), dtype=torch.bool)
        for t, slots in enumerate(selected):
            attended_slots[t, slots] = True
        loss_entries = attended_slots if cfg.index_loss_mode == "sparse" else slot_visible
        kl, n_valid = kl_sum(q.detach(), cmp_kv.detach(), scores, loss_entries, scale)
    else:
        attended_slots = slot_visible                          # HCA: every visible slot; SWA: none
    # 6-7. attention over window entries then compressed entries, with the sink
    keys = torch.cat([kv, cmp_kv], dim=0)
    o = attend(q, keys, torch.cat([window, attended_slots], dim=1), W["attn.attn_sink"], scale)
    # 8. inverse RoPE at the query position
    o = rope(o, -pos.unsqueeze(-1), freqs)
    # 9. grouped output projection
    out = project_out(o, W["attn.wo_a.weight"], W["attn.wo_b.weight"], cfg.o_groups)
    return DocResult(out, selected, scores, slot_visible, kl, n_valid)


@dataclass
class LayerResult:
    out: torch.Tensor              # [T, d]
    loss: torch.Tensor             # r = 4: scalar (coeff already applied); else None
    n_valid: int
    topk_ids: np.ndarray           # r = 4: int32 [T, index_topk]
    topk_scores: np.ndarray        # r = 4: float64 [T, index_topk]
    index_scores: np.ndarray       # r = 4: float64 [T, C_total]
    cu_cmp: list                   # prefix sums of the documents' slot counts


def layer_forward(cfg, W, x, docs):
    """The whole layer on packed x [T, d] (SPEC 4): each document on its own real rows, padding rows
    give zero output. Compressed ids are global: cu_cmp[doc] + local slot."""
    freqs = rope_frequencies(cfg)
    T, k = x.shape[0], cfg.index_topk
    n_slots = [doc.real // cfg.ratio if cfg.ratio else 0 for doc in docs]
    cu_cmp = [0] + np.cumsum(n_slots).tolist()
    pieces, kl_total, n_valid = [], x.new_zeros(()), 0
    topk_ids = np.full((T, k), NO_ID, dtype=np.int32)
    topk_scores = np.full((T, k), -math.inf)
    index_scores = np.full((T, cu_cmp[-1]), -math.inf)
    for i, doc in enumerate(docs):
        res = doc_forward(cfg, W, x[doc.start: doc.start + doc.real], freqs)
        pieces += [res.out, x.new_zeros((doc.padded - doc.real, cfg.dim))]
        if cfg.ratio == CSA_RATIO:
            kl_total = kl_total + res.kl
            n_valid += res.n_valid
            s = res.scores.detach().numpy()
            for t, slots in enumerate(res.selected):
                row = doc.start + t
                topk_ids[row, :len(slots)] = np.array(slots, dtype=np.int64) + cu_cmp[i]
                topk_scores[row, :len(slots)] = s[t, slots]
                vis = res.slot_visible[t].numpy()
                index_scores[row, cu_cmp[i]: cu_cmp[i + 1]][vis] = s[t, vis]
    out = torch.cat(pieces, dim=0)
    loss = None
    if cfg.ratio == CSA_RATIO:
        # loss = coeff / n_valid * sum of KL (0 when no token has a visible slot)
        loss = cfg.index_loss_coeff * kl_total / max(n_valid, 1)
    return LayerResult(out, loss, n_valid, topk_ids, topk_scores, index_scores, cu_cmp)


def objective(result, dout):
    """The scalar whose gradients are reported: sum(out * dout) + indexer_loss."""
    value = (result.out * dout).sum()
    return value if result.loss is None else value + result.loss


def run(cfg, weights, x, docs, dout=None):
    """Forward (and backward when dout is given) on float64 tensors. Returns (LayerResult, dx,
    {short name: grad}); dx and grads are None without dout. Weights that receive no gradient get
    exact zeros."""
    check_layout(cfg, docs, x)
    W = {name: w.detach().clone().requires_grad_(dout is not None) for name, w in weights.items()}
    x = x.detach().clone().requires_grad_(dout is not None)
    result = layer_forward(cfg, W, x, docs)
    if dout is None:
        return result, None, None
    objective(result, dout).backward()
    grads = {name: (w.grad if w.grad is not None else torch.zeros_like(w)) for name, w in W.items()}
    dx = x.grad if x.grad is not None else torch.zeros_like(x)
    return result, dx, grads


def run_files(config, layer, weights_path, input_path, grad_path=None):
    """Reads a case and returns the {name: numpy array} to write (see the file's docstring)."""
    cfg = layer_spec.load_layer_config(config, layer)
    weights, prefix = load_weights(weights_path, cfg, layer)
    x, docs, x_shape = load_input(input_path)
    dout = None
    if grad_path:
        g = st.read(grad_path)
        if "dout" not in g:
            raise SystemExit(f"ref.py: {grad_path}: missing tensor 'dout'")
        if tuple(g["dout"].shape) != tuple(x_shape):
            raise SystemExit(f"ref.py: dout shape {list(g['dout'].shape)} != out shape {list(x_shape)}")
        dout = torch.from_numpy(g["dout"].astype(np.float64).reshape(x.shape))
    result, dx, grads = run(cfg, weights, x, docs, dout)
    outputs = {"out": result.out.detach().numpy().reshape(x_shape)}
    if cfg.ratio == CSA_RATIO:
        outputs["topk_ids"] = result.topk_ids
        outputs["topk_scores"] = result.topk_scores
        outputs["index_scores"] = result.index_scores
        outputs["indexer_loss"] = np.array([float(result.loss)])
    if dout is not None:
        outputs["dx"] = dx.numpy().reshape(x_shape)
        for short, g in grads.items():
            outputs["grad." + prefix + short] = g.numpy()
    meta = {"producer": "tests/ref/ref.py", "ratio": cfg.ratio, "n_valid": result.n_valid,
            "reference_only": ",".join(REFERENCE_ONLY)}
    return outputs, meta


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    p.add_argument("--layer", type=int, required=True)
    p.add_argument("--weights", required=True)
    p.add_argument("--input", required=True)
    p.add_argument("--grad-output", default=None)
    p.add_argument("--output", required=True)
    a = p.parse_args(argv)
    try:
        outputs, meta = run_files(a.config, a.layer, a.weights, a.input, a.grad_output)
    except ValueError as e:          # configuration errors from layer_spec
        raise SystemExit(f"ref.py: {e}")
    st.write(a.output, outputs, metadata=meta)


if __name__ == "__main__":
    main()
