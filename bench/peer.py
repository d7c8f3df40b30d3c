#!/usr/bin/python3
"""bench/peer.py: the PyTorch peer of the C library, for speed comparison.

An efficient, vectorized fp32 PyTorch implementation of DeepSeek V4's hybrid attention layer
(SPEC sections 1-4: sliding window + HCA r = 128 + CSA r = 4 with the lightning indexer and its KL
loss), forward and backward, written for speed the way a PyTorch user would, not the test reference
(tests/ref/ref.py is a float64 reference written to be read). Everything is fp32; the backward is
torch.autograd; there are no per-token Python loops (only per query chunk and, in `check`, per
document). It shares only file helpers with tests/ref: st.py (safetensors) and layer_spec.py
(config keys, weight names and shapes).

How the layer is computed:
  * projections with F.linear; RMSNorm; RoPE from precomputed cos/sin tables (interleaved pairs on
    the last R dims, YaRN frequencies for r > 0 layers), applied as one batched op per tensor;
  * compressor: rows reshaped [n_slots, r, c*D], softmax over the r axis per channel; for r = 4 the
    previous window's first-half channels are shifted in by one slot (pad with -inf logits);
  * sliding window: banded blocks of W queries, each against its own and the previous key block
    ([2W keys], masked), i.e. one batched GEMM per block instead of a per-query gather;
  * HCA: dense over the chunk's visible slots with a causal mask;
  * CSA: indexer scores (einsum, ReLU, weighted sum over heads) under no_grad, top-k by a stable
    descending sort (SPEC: ties go to the smaller slot; torch.topk does not promise that and its
    tie order differs in practice; the sort costs < 1 % of the layer), then the selected compressed
    keys are gathered per query ([queries, k, D]; autograd keeps them for the backward);
  * one softmax over [window | compressed | sink] logits per head (the sink is a logit column
    without a value), inverse RoPE on the output, grouped output projection (einsum over groups);
  * KL indexer loss (sparse mode over the selected set; teacher = main logits, detached; indexer
    inputs x and qr detached), added to the objective sum(out * dout) + loss.

Memory: queries are processed in chunks of --chunk (default 1024) rows, still with autograd. Chunking
bounds the transient tensors (logits, the gathered keys' gradient) but not what autograd saves:
the gathered CSA keys alone are S*k*D*4 bytes (8 GiB at S = 8192 with V4-Flash dims). When the
estimate of the saved tensors exceeds the budget (--checkpoint auto), every attention chunk is
wrapped in torch.utils.checkpoint (non-reentrant): the chunk's gathers, logits and softmax are
recomputed in the backward instead of kept, as a PyTorch user training at that length would do.
The JSON records whether this happened. An address-space limit (--mem-limit-gib, default 20) turns
an out-of-memory into an error JSON instead of the OOM killer.

Threads: --threads sets torch.set_num_threads AND the OpenBLAS/OpenMP thread counts (Debian's torch
calls the system OpenBLAS for GEMMs, which torch.set_num_threads does not control), before torch
is imported.

Usage (Debian's interpreter, /usr/bin/python3: torch 1.13 CPU, numpy):
  bench/peer.py bench --preset flash --ratio 4 --seq 4096 --threads 1 --reps 3 --json out.json
  bench/peer.py bench --config config.json --layer L [--weights W.safetensors] [--input IN.safetensors]
                      [--seq S] [--seed N] [--threads N] [--reps K] [--json OUT]
  bench/peer.py check --config C --layer L --weights W --input IN --grad-output G --expected EXP
  common options: --chunk N (query chunk, default 1024), --checkpoint auto|on|off,
                  --mem-limit-gib G (0 = no limit)
bench: one warm-up, then K timed forward-only runs (torch.no_grad, loss included) and K timed
forward+backward runs (objective sum(out * dout) + indexer_loss, random dout). JSON keys: ratio, seq,
threads, num_threads, fwd_seconds, fwd_median, fwdbwd_seconds, fwdbwd_median, tokens_per_s
(fwd+bwd), tokens_per_s_fwd, peak_rss_bytes (VmHWM at the end: run one configuration per process),
torch_version, checkpoint, chunk, dims. On failure (e.g. out of memory) an error JSON, exit 2.
check: forward+backward on a tests/ref case (packed documents are run one by one; padding rows give
zero output and zero gradient) and compares out, indexer_loss, dx and every grad.<name> with the
float64 reference EXP (ref.py): max|a - b| <= tol * max|b|, tol 1e-4 for out/loss, 1e-3 for
gradients. Prints PASS/FAIL per tensor; exit 1 on any failure.
"""
import argparse
import json
import math
import os
import resource
import statistics
import sys
import time


def _set_thread_env(argv):
    """The BLAS thread count must be fixed before torch (and OpenBLAS) is loaded."""
    threads = None
    for i, arg in enumerate(argv):
        if arg == "--threads" and i + 1 < len(argv):
            threads = argv[i + 1]
        elif arg.startswith("--threads="):
            threads = arg.split("=", 1)[1]
    if threads is not None:
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(threads)


_set_thread_env(sys.argv)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch.utils.checkpoint  # noqa: E402

sys.dont_write_bytecode = True
_REF_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref")
sys.path.insert(0, os.path.abspath(_REF_DIR))
import layer_spec  # noqa: E402  (config keys, weight names/shapes)
import st  # noqa: E402          (safetensors I/O)
from layer_spec import CSA_RATIO, HCA_RATIO, SWA_RATIO  # noqa: E402

DTYPE = torch.float32
NO_SLOT = -1                     # padding of the selected-slot table
DEFAULT_CHUNK = 1024             # queries per attention chunk
DEFAULT_MEM_LIMIT_GIB = 20.0     # address-space limit of the process
# --checkpoint auto: checkpoint when saved_bytes_estimate() exceeds this. Measured with V4-Flash dims,
# r = 4: S = 4096 estimates 10.3 GiB and peaks at 11.7 GiB RSS (no checkpoint); S = 8192 estimates
# 20.5 GiB, which would not fit a 20 GiB limit, so it is checkpointed.
CHECKPOINT_BUDGET_GIB = 14.0
DEFAULT_SEED = 0
DEFAULT_REPS = 3
TOL_OUT = 1e-4                   # SPEC 8: out (and the loss) vs the float64 reference
TOL_GRAD = 1e-3                  # SPEC 8: dx and weight gradients
EXIT_CHECK_FAILED = 1
EXIT_RUN_FAILED = 2
GIB = 1 << 30

# Random weights, the same magnitudes as tests/ref/gen_case.py
NORM_WEIGHT_SPREAD = 0.2
APE_SCALE = 0.5
SINK_SCALE = 1.0

_YARN = {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
         "beta_fast": 32, "beta_slow": 1}
PRESETS = {
    "flash": {"hidden_size": 4096, "num_attention_heads": 64, "head_dim": 512, "qk_rope_head_dim": 64,
              "q_lora_rank": 1024, "o_groups": 8, "o_lora_rank": 1024, "sliding_window": 128,
              "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512, "rope_theta": 10000.0,
              "compress_rope_theta": 160000.0, "rope_scaling": _YARN, "rms_norm_eps": 1e-6,
              "index_loss_coeff": 1e-3},
    "tiny": {"hidden_size": 32, "num_attention_heads": 4, "head_dim": 16, "qk_rope_head_dim": 8,
             "q_lora_rank": 24, "o_groups": 2, "o_lora_rank": 12, "sliding_window": 8,
             "index_n_heads": 2, "index_head_dim": 16, "index_topk": 4, "rope_theta": 10000.0,
             "compress_rope_theta": 160000.0, "rope_scaling": _YARN, "rms_norm_eps": 1e-6,
             "index_loss_coeff": 1e-3},
}


class PeerError(Exception):
    """A bad input or configuration: reported in one line."""


# ----------------------------------------------------------------------------------------------
# Configuration, weights, inputs
# ----------------------------------------------------------------------------------------------

def preset_config(name, ratio):
    cfg = dict(PRESETS[name], compress_ratios=[ratio])
    return layer_spec.layer_config_from_dict(cfg, 0), 0


def random_weights(cfg, seed):
    """{short name: fp32 tensor}: Linear N(0,1)/sqrt(fan_in), norms 1 + 0.2 N, ape 0.5 N, sink N."""
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in layer_spec.weight_shapes(cfg).items():
        w = torch.randn(shape, generator=gen, dtype=DTYPE)
        if name.endswith("attn_sink"):
            w *= SINK_SCALE
        elif name.endswith(".ape"):
            w *= APE_SCALE
        elif "norm" in name:
            w = 1.0 + NORM_WEIGHT_SPREAD * w
        else:
            w /= math.sqrt(shape[1])
        weights[name] = w
    return weights


def load_weights(path, cfg, layer):
    """Returns ({short name: fp32 tensor}, prefix); names with or without 'layers.L.'."""
    stored = st.read(path)
    shapes = layer_spec.weight_shapes(cfg)
    prefix = layer_spec.layer_prefix(layer)
    if not any(prefix + name in stored for name in shapes):
        prefix = ""
    weights = {}
    for name, shape in shapes.items():
        arr = stored.get(prefix + name)
        if arr is None:
            raise PeerError(f"{path}: missing tensor '{prefix + name}'")
        if tuple(arr.shape) != tuple(shape):
            raise PeerError(f"{path}: tensor '{prefix + name}' has shape {list(arr.shape)}, expected {list(shape)}")
        if not np.issubdtype(arr.dtype, np.floating):
            raise PeerError(f"{path}: tensor '{prefix + name}' is not a float tensor")
        weights[name] = torch.from_numpy(arr.astype(np.float32))
    return weights, prefix


def load_input(path, dim):
    """Returns (x [T, d] fp32, documents [(start, padded, real)], shape of x in the file)."""
    tensors = st.read(path)
    if "x" not in tensors:
        raise PeerError(f"{path}: missing tensor 'x'")
    x = tensors["x"].astype(np.float32)
    if x.shape[-1] != dim:
        raise PeerError(f"{path}: x has {x.shape[-1]} columns, hidden_size is {dim}")
    if x.ndim == 3:
        B, S, _ = x.shape
        docs = [(b * S, S, S) for b in range(B)]
    elif x.ndim == 2:
        T = x.shape[0]
        cu = [int(v) for v in tensors.get("cu_seqlens", np.array([0, T]))]
        if len(cu) < 2 or cu[0] != 0 or cu[-1] != T or any(b < a for a, b in zip(cu, cu[1:])):
            raise PeerError(f"{path}: bad cu_seqlens {cu}")
        padded = [b - a for a, b in zip(cu, cu[1:])]
        real = [int(v) for v in tensors.get("seqlens_real", np.array(padded))]
        if len(real) != len(padded) or not all(0 < r <= p for r, p in zip(real, padded)):
            raise PeerError(f"{path}: bad seqlens_real {real}")
        docs = list(zip(cu[:-1], padded, real))
    else:
        raise PeerError(f"{path}: x must be [T, d] or [B, S, d], got {list(x.shape)}")
    return torch.from_numpy(x.reshape(-1, dim)), docs, x.shape


# ----------------------------------------------------------------------------------------------
# Building blocks
# ----------------------------------------------------------------------------------------------

def rope_frequencies(cfg):
    """f_i = theta^(-2i/R) (float64); r > 0: compress_rope_theta with the YaRN ramp, no mscale."""
    R = cfg.rope_dim
    i = torch.arange(R // 2, dtype=torch.float64)
    if cfg.ratio == SWA_RATIO:
        return cfg.rope_theta ** (-2.0 * i / R)
    theta = cfg.compress_rope_theta
    freqs = theta ** (-2.0 * i / R)

    def corr(n_rot):
        return R * math.log(cfg.yarn_original_max_pos / (n_rot * 2 * math.pi)) / (2 * math.log(theta))

    lo = max(math.floor(corr(cfg.yarn_beta_fast)), 0)
    hi = min(math.ceil(corr(cfg.yarn_beta_slow)), R - 1)
    ramp = ((i - lo) / (hi - lo if hi != lo else 0.001)).clamp(0.0, 1.0)
    return freqs / cfg.yarn_factor * ramp + freqs * (1.0 - ramp)


def rope_tables(cfg, n_pos):
    """cos, sin [n_pos, R/2] fp32 of angles t * f_i computed in double."""
    angles = torch.outer(torch.arange(n_pos, dtype=torch.float64), rope_frequencies(cfg))
    return angles.cos().to(DTYPE), angles.sin().to(DTYPE)


def apply_rope(v, cos, sin):
    """Rotates the interleaved pairs of the last R = 2 * cos.shape[-1] dims of v; cos/sin broadcast
    against v[..., :R/2]. Pass -sin for the inverse rotation."""
    R = 2 * cos.shape[-1]
    pairs = v[..., -R:].unflatten(-1, (R // 2, 2))
    a, b = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    return torch.cat((v[..., :-R], rotated), dim=-1)


def rmsnorm(v, weight, eps):
    v = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)
    return v if weight is None else v * weight


def overlap_windows(t, head_dim, fill):
    """r = 4: [n_slots, 4, 2D] -> [n_slots, 8, D]: the previous slot's first-half channels (slot 0:
    `fill`) followed by the slot's own second-half channels."""
    prev = F.pad(t[..., :head_dim], (0, 0, 0, 0, 1, 0), value=fill)[:-1]
    return torch.cat((prev, t[..., head_dim:]), dim=1)


def compress(x, wkv, wgate, ape, norm_weight, ratio, head_dim, eps, cos, sin):
    """Compressor (SPEC 3 step 3): x [S, d] -> [S // ratio, head_dim], RoPE at slot position j * r."""
    n_slots = x.shape[0] // ratio
    if n_slots == 0:
        return x.new_zeros((0, head_dim))
    rows = x[: n_slots * ratio]
    values = F.linear(rows, wkv).view(n_slots, ratio, -1)
    logits = F.linear(rows, wgate).view(n_slots, ratio, -1) + ape
    if ratio == CSA_RATIO:
        values = overlap_windows(values, head_dim, 0.0)
        logits = overlap_windows(logits, head_dim, -math.inf)
    pooled = (torch.softmax(logits, dim=1) * values).sum(dim=1)
    slot_pos = slice(0, n_slots * ratio, ratio)
    return apply_rope(rmsnorm(pooled, norm_weight, eps), cos[slot_pos], sin[slot_pos])


# ----------------------------------------------------------------------------------------------
# Layer steps
# ----------------------------------------------------------------------------------------------

def project_queries(W, x, cfg, cos, sin):
    """Step 1: qr [S, dq] and q [S, H, D] (per-head RMSNorm without weight, then RoPE)."""
    qr = rmsnorm(F.linear(x, W["attn.wq_a.weight"]), W["attn.q_norm.weight"], cfg.eps)
    q = F.linear(qr, W["attn.wq_b.weight"]).view(x.shape[0], cfg.n_heads, cfg.head_dim)
    return qr, apply_rope(rmsnorm(q, None, cfg.eps), cos[:, None], sin[:, None])


def project_kv(W, x, cfg, cos, sin):
    """Step 2: the shared key/value [S, D]."""
    return apply_rope(rmsnorm(F.linear(x, W["attn.wkv.weight"]), W["attn.kv_norm.weight"], cfg.eps), cos, sin)


def main_compressor(W, x, cfg, cos, sin):
    """Step 3: cmp_kv [S // r, D]."""
    p = "attn.compressor."
    return compress(x, W[p + "wkv.weight"], W[p + "wgate.weight"], W[p + "ape"], W[p + "norm.weight"],
                    cfg.ratio, cfg.head_dim, cfg.eps, cos, sin)


def indexer_inputs(W, x, qr, cfg, cos, sin):
    """Step 5 inputs from DETACHED x and qr: qI [S, Hi, Di], weights wI [S, Hi], keys KI [S // 4, Di]."""
    Hi, Di = cfg.index_n_heads, cfg.index_head_dim
    p = "attn.indexer."
    qI = F.linear(qr, W[p + "wq_b.weight"]).view(x.shape[0], Hi, Di)
    qI = apply_rope(qI, cos[:, None], sin[:, None])
    wI = F.linear(x, W[p + "weights_proj.weight"]) * (Di ** -0.5 * Hi ** -0.5)
    c = p + "compressor."
    KI = compress(x, W[c + "wkv.weight"], W[c + "wgate.weight"], W[c + "ape"], W[c + "norm.weight"],
                  CSA_RATIO, Di, cfg.eps, cos, sin)
    return qI, wI, KI


def index_scores(qI, wI, KI):
    """I[t, j] = sum_h wI[t, h] ReLU(qI[t, h] . KI[j]) -> [n, n_slots]."""
    return torch.einsum("thj,th->tj", torch.relu(torch.einsum("thd,jd->thj", qI, KI)), wI)


@torch.no_grad()
def select_topk(qI, wI, KI, topk, chunk):
    """Step 5 selection (a constant for the backward): sel [S, min(topk, n_slots)] int64, per query
    the min(topk, (t+1)//4) visible slots with the largest score, by (score desc, slot asc), padded
    with NO_SLOT. Scores are computed per query chunk against the chunk's visible slots only."""
    S, n_slots = qI.shape[0], KI.shape[0]
    width = min(topk, n_slots)
    sel = torch.full((S, width), NO_SLOT, dtype=torch.long)
    for t0 in range(0, S, chunk):
        t1 = min(S, t0 + chunk)
        n_seen = min(n_slots, t1 // CSA_RATIO)
        if n_seen == 0:
            continue
        n_vis = (torch.arange(t0, t1) + 1) // CSA_RATIO
        scores = index_scores(qI[t0:t1], wI[t0:t1], KI[:n_seen])
        scores.masked_fill_(torch.arange(n_seen) >= n_vis[:, None], -math.inf)
        order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :width]
        k_t = n_vis.clamp(max=topk)
        sel[t0:t1, : order.shape[1]] = order.masked_fill(torch.arange(order.shape[1]) >= k_t[:, None], NO_SLOT)
    return sel


def window_keys(kv, window):
    """Banded sliding window: kv [Sp, D] (Sp % W == 0) -> [Sp/W, 2W, D], block b = key blocks b-1, b
    (block -1 is zeros, always masked)."""
    blocks = kv.view(-1, window, kv.shape[-1])
    return torch.cat((F.pad(blocks, (0, 0, 0, 0, 1, 0))[:-1], blocks), dim=1)


def window_mask(t0, n, window):
    """[n, 2W] bool: key kk of query t's block pair is at position (t//W - 1) W + kk; visible iff
    t - W < position <= t and position >= 0."""
    t = torch.arange(t0, t0 + n)[:, None]
    pos = (t // window - 1) * window + torch.arange(2 * window)
    return (pos <= t) & (pos > t - window) & (pos >= 0)


def indexer_kl(z_cmp, sel, qI, wI, KI):
    """Sum over the chunk's valid queries of KL(teacher || student) over the selected slots.
    z_cmp [n, H, k]: scaled main logits of the selected slots (unmasked; detached here)."""
    entry = sel >= 0
    row_valid = entry[:, 0]
    entry = entry | ~row_valid[:, None]          # rows without a slot: keep everything finite, weight 0
    with torch.no_grad():
        teacher = torch.softmax(z_cmp.detach().masked_fill(~entry[:, None, :], -math.inf), dim=-1).sum(dim=1)
        teacher = teacher / teacher.sum(dim=-1, keepdim=True)
    student = index_scores_at(qI, wI, KI[sel.clamp(min=0)])
    log_student = torch.log_softmax(student.masked_fill(~entry, -math.inf), dim=-1).masked_fill(~entry, 0.0)
    kl = torch.xlogy(teacher, teacher) - teacher * log_student
    return (kl * row_valid[:, None]).sum()


def index_scores_at(qI, wI, keys):
    """Indexer scores of gathered keys [n, k, Di] -> [n, k] (with autograd, for the student)."""
    return torch.einsum("thj,th->tj", torch.relu(torch.einsum("thd,tjd->thj", qI, keys)), wI)


def attention_chunk(q, win_keys, cmp_kv, sel, qI, wI, KI, sink, t0, cfg):
    """Steps 6-7 (+ KL loss) for queries t0 .. t0+n-1 (n % W == 0): q [n, H, D], win_keys
    [n/W, 2W, D]; cmp_kv [n_slots, D] or None; sel [n, k] (CSA) or None (HCA: all visible slots).
    Returns (o [n, H, D], KL sum of the chunk)."""
    n, H, D = q.shape
    Wn = cfg.window
    scale = D ** -0.5
    n_blocks = n // Wn
    z_win = torch.einsum("bihd,bkd->bihk", q.view(n_blocks, Wn, H, D), win_keys).reshape(n, H, 2 * Wn)
    logits = [(z_win * scale).masked_fill(~window_mask(t0, n, Wn)[:, None, :], -math.inf)]
    kl = q.new_zeros(())
    cmp_keys = None
    if cmp_kv is not None:
        n_vis = (torch.arange(t0, t0 + n) + 1) // cfg.ratio
        if sel is None:                                       # HCA: every visible slot
            cmp_keys = cmp_kv[: min(cmp_kv.shape[0], (t0 + n) // cfg.ratio)]
            z_cmp = torch.einsum("thd,jd->thj", q, cmp_keys) * scale
            hidden = torch.arange(cmp_keys.shape[0]) >= n_vis[:, None]
        else:                                                 # CSA: the selected slots
            cmp_keys = cmp_kv[sel.clamp(min=0)]               # [n, k, D], kept by autograd
            z_cmp = torch.einsum("thd,tjd->thj", q, cmp_keys) * scale
            hidden = sel < 0
            kl = indexer_kl(z_cmp, sel, qI, wI, KI)
        logits.append(z_cmp.masked_fill(hidden[:, None, :], -math.inf))
    logits.append(sink.view(1, H, 1).expand(n, H, 1))
    probs = torch.softmax(torch.cat(logits, dim=-1), dim=-1)
    p_win = probs[..., : 2 * Wn].reshape(n_blocks, Wn, H, 2 * Wn)
    o = torch.einsum("bihk,bkd->bihd", p_win, win_keys).reshape(n, H, D)
    if cmp_keys is not None:
        p_cmp = probs[..., 2 * Wn: -1]
        eq = "thj,jd->thd" if sel is None else "thj,tjd->thd"
        o = o + torch.einsum(eq, p_cmp, cmp_keys)
    return o, kl


def saved_bytes_estimate(cfg, S):
    """Rough size of what autograd keeps for the backward without checkpointing (fp32)."""
    H, D, Wn = cfg.n_heads, cfg.head_dim, cfg.window
    k = {SWA_RATIO: 0, HCA_RATIO: S // HCA_RATIO, CSA_RATIO: min(cfg.index_topk, S // CSA_RATIO)}[cfg.ratio]
    per_query = 3 * H * (2 * Wn + k + 1) + 4 * H * D         # logits/probs, q and o copies
    if cfg.ratio == CSA_RATIO:
        per_query += k * (D + cfg.index_head_dim) + 2 * cfg.index_n_heads * k   # gathered keys
    return 4 * S * per_query


def attention(q, kv, cmp_kv, sel, indexer, sink, cfg, chunk, checkpoint):
    """Steps 6-7 over all queries in chunks of `chunk` rows (a multiple of W). Returns (o [S, H, D],
    KL sum). checkpoint: recompute each chunk in the backward instead of keeping its tensors."""
    S, Wn = q.shape[0], cfg.window
    qI, wI, KI = indexer if indexer is not None else (None, None, None)
    pad = -S % Wn
    if pad:                                                   # whole window blocks; padded rows dropped
        q = F.pad(q, (0, 0, 0, 0, 0, pad))
        kv = F.pad(kv, (0, 0, 0, pad))
        if sel is not None:
            sel = F.pad(sel, (0, 0, 0, pad), value=NO_SLOT)
            qI = F.pad(qI, (0, 0, 0, 0, 0, pad))
            wI = F.pad(wI, (0, 0, 0, pad))
    win_keys = window_keys(kv, Wn)
    chunk = max(Wn, chunk // Wn * Wn)
    use_checkpoint = checkpoint and torch.is_grad_enabled()
    outs, kl = [], q.new_zeros(())
    for t0 in range(0, S + pad, chunk):
        t1 = min(S + pad, t0 + chunk)
        rows = slice(t0, t1)
        args = (q[rows], win_keys[t0 // Wn: t1 // Wn], cmp_kv, None if sel is None else sel[rows],
                None if qI is None else qI[rows], None if wI is None else wI[rows], KI, sink, t0, cfg)
        if use_checkpoint:
            o, kl_c = torch.utils.checkpoint.checkpoint(attention_chunk, *args, use_reentrant=False)
        else:
            o, kl_c = attention_chunk(*args)
        outs.append(o)
        kl = kl + kl_c
    return torch.cat(outs)[:S], kl


def output_projection(o, wo_a, wo_b, groups):
    """Step 9: u[t, g] = wo_a[g] o[t, heads of g]; out = wo_b concat_g u."""
    S = o.shape[0]
    o = o.reshape(S, groups, -1)
    u = torch.einsum("tgk,grk->tgr", o, wo_a.view(groups, -1, o.shape[-1]))
    return F.linear(u.reshape(S, -1), wo_b)


def sequence_forward(W, x, cfg, chunk, checkpoint):
    """The layer on ONE sequence x [S, d] (positions 0..S-1). Returns (out [S, d], KL sum, n_valid)."""
    S = x.shape[0]
    cos, sin = rope_tables(cfg, S)
    qr, q = project_queries(W, x, cfg, cos, sin)
    kv = project_kv(W, x, cfg, cos, sin)
    cmp_kv = main_compressor(W, x, cfg, cos, sin) if cfg.ratio != SWA_RATIO else None
    if cmp_kv is not None and cmp_kv.shape[0] == 0:
        cmp_kv = None
    sel, indexer, n_valid = None, None, 0
    if cfg.ratio == CSA_RATIO and cmp_kv is not None:
        indexer = indexer_inputs(W, x.detach(), qr.detach(), cfg, cos, sin)
        sel = select_topk(*indexer, cfg.index_topk, chunk)
        n_valid = S - (CSA_RATIO - 1)                         # queries with (t+1)//4 >= 1
    o, kl = attention(q, kv, cmp_kv, sel, indexer, W["attn.attn_sink"], cfg, chunk, checkpoint)
    o = apply_rope(o, cos[:, None], -sin[:, None])            # step 8: inverse RoPE at t
    out = output_projection(o, W["attn.wo_a.weight"], W["attn.wo_b.weight"], cfg.o_groups)
    return out, kl, n_valid


def layer_forward(W, x, docs, cfg, chunk, checkpoint):
    """Packed documents, one by one (SPEC 4): padding rows give zero output. Returns (out [T, d],
    indexer loss (coeff applied) or None)."""
    pieces, kl, n_valid = [], x.new_zeros(()), 0
    for start, padded, real in docs:
        out, kl_doc, nv = sequence_forward(W, x[start: start + real], cfg, chunk, checkpoint)
        pieces += [out, x.new_zeros((padded - real, x.shape[1]))]
        kl, n_valid = kl + kl_doc, n_valid + nv
    pieces = [piece for piece in pieces if piece.shape[0]]
    out = torch.cat(pieces) if len(pieces) > 1 else pieces[0]
    if cfg.ratio != CSA_RATIO:
        return out, None
    return out, cfg.index_loss_coeff * kl / max(n_valid, 1)


def require_sparse_loss(cfg):
    if cfg.ratio == CSA_RATIO and cfg.index_loss_mode != "sparse":
        raise PeerError(f"index_loss_mode '{cfg.index_loss_mode}' is not supported (sparse only)")


def resolve_checkpoint(mode, cfg, docs):
    if mode != "auto":
        return mode == "on"
    est = sum(saved_bytes_estimate(cfg, real) for _, _, real in docs)
    return est > CHECKPOINT_BUDGET_GIB * GIB


def forward_backward(W, x, docs, dout, cfg, chunk, checkpoint):
    """Objective sum(out * dout) + indexer_loss, backward by autograd. Returns (out, loss)."""
    out, loss = layer_forward(W, x, docs, cfg, chunk, checkpoint)
    objective = (out * dout).sum()
    if loss is not None:
        objective = objective + loss
    objective.backward()
    return out, loss


# ----------------------------------------------------------------------------------------------
# Modes
# ----------------------------------------------------------------------------------------------

def peak_rss_bytes():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


def set_memory_limit(gib):
    if gib > 0:
        limit = int(gib * GIB)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def load_config(a):
    if a.config:
        return layer_spec.load_layer_config(a.config, a.layer), a.layer
    if a.preset is None or a.ratio is None:
        raise PeerError("give --config C --layer L, or --preset NAME --ratio R")
    return preset_config(a.preset, a.ratio)


def bench_inputs(a, cfg, layer):
    """(weights with requires_grad, x [S, d], dout [S, d]) for one sequence."""
    if a.weights:
        W, _ = load_weights(a.weights, cfg, layer)
    else:
        W = random_weights(cfg, a.seed)
    gen = torch.Generator().manual_seed(a.seed + 1)
    if a.input:
        x, docs, _ = load_input(a.input, cfg.dim)
        if len(docs) != 1 or docs[0][1] != docs[0][2]:
            raise PeerError("bench: the input must be one unpadded document (packing is for `check`)")
    else:
        if not a.seq:
            raise PeerError("bench: give --seq S or --input")
        x = torch.randn((a.seq, cfg.dim), generator=gen, dtype=DTYPE)
    if cfg.ratio != SWA_RATIO and x.shape[0] % cfg.ratio:
        raise PeerError(f"bench: sequence length {x.shape[0]} is not a multiple of the ratio {cfg.ratio}")
    dout = torch.randn(x.shape, generator=gen, dtype=DTYPE)
    return {k: v.requires_grad_() for k, v in W.items()}, x, dout


def timed(fn, reps):
    fn()                                                      # warm-up
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def run_bench(a):
    cfg, layer = load_config(a)
    require_sparse_loss(cfg)
    W, x, dout = bench_inputs(a, cfg, layer)
    S = x.shape[0]
    docs = [(0, S, S)]
    checkpoint = resolve_checkpoint(a.checkpoint, cfg, docs)
    result = {"ratio": cfg.ratio, "seq": S, "threads": a.threads, "num_threads": torch.get_num_threads(),
              "torch_version": torch.__version__, "chunk": a.chunk, "checkpoint": checkpoint,
              "preset": a.preset if not a.config else None, "reps": a.reps,
              "dims": {"d": cfg.dim, "H": cfg.n_heads, "D": cfg.head_dim, "R": cfg.rope_dim,
                       "dq": cfg.q_lora_rank, "G": cfg.o_groups, "Ro": cfg.o_lora_rank, "W": cfg.window,
                       "Hi": cfg.index_n_heads, "Di": cfg.index_head_dim, "topk": cfg.index_topk}}

    def fwd():
        with torch.no_grad():
            layer_forward(W, x, docs, cfg, a.chunk, False)

    def fwdbwd():
        for w in W.values():
            w.grad = None
        forward_backward(W, x, docs, dout, cfg, a.chunk, checkpoint)

    try:
        fwd_times = timed(fwd, a.reps)
        fwdbwd_times = timed(fwdbwd, a.reps)
    except (RuntimeError, MemoryError) as e:
        result.update(error=f"{type(e).__name__}: {str(e).splitlines()[0]}", peak_rss_bytes=peak_rss_bytes())
        write_json(a.json, result)
        print(f"peer r={cfg.ratio} S={S} threads={a.threads}: FAILED: {result['error']}", file=sys.stderr)
        return EXIT_RUN_FAILED
    result.update(fwd_seconds=fwd_times, fwd_median=statistics.median(fwd_times),
                  fwdbwd_seconds=fwdbwd_times, fwdbwd_median=statistics.median(fwdbwd_times))
    result.update(tokens_per_s=S / result["fwdbwd_median"], tokens_per_s_fwd=S / result["fwd_median"],
                  peak_rss_bytes=peak_rss_bytes())
    write_json(a.json, result)
    print(f"peer r={cfg.ratio} S={S} threads={a.threads}: fwd {result['fwd_median']:.3f} s, "
          f"fwd+bwd {result['fwdbwd_median']:.3f} s ({result['tokens_per_s']:.1f} tok/s), "
          f"peak RSS {result['peak_rss_bytes'] / GIB:.2f} GiB, checkpoint {'on' if checkpoint else 'off'}")
    return 0


def write_json(path, obj):
    if path:
        with open(path, "w") as fh:
            json.dump(obj, fh, indent=2)
            fh.write("\n")


def compare(name, got, expected, tol):
    """max|a - b| <= tol * max|b|. Returns ok and prints one line."""
    got = np.asarray(got, dtype=np.float64).reshape(-1)
    expected = np.asarray(expected, dtype=np.float64).reshape(-1)
    if got.shape != expected.shape:
        print(f"FAIL {name:<50} shape {got.shape} != {expected.shape}")
        return False
    err = float(np.abs(got - expected).max()) if got.size else 0.0
    scale = float(np.abs(expected).max()) if got.size else 0.0
    ok = bool(np.isfinite(got).all()) and err <= tol * scale
    rel = err / scale if scale else err
    print(f"{'PASS' if ok else 'FAIL'} {name:<50} max_err {err:.2e} rel {rel:.2e} (tol {tol:.0e})")
    return ok


def run_check(a):
    cfg = layer_spec.load_layer_config(a.config, a.layer)
    require_sparse_loss(cfg)
    W, prefix = load_weights(a.weights, cfg, a.layer)
    W = {k: v.requires_grad_() for k, v in W.items()}
    x, docs, x_shape = load_input(a.input, cfg.dim)
    if cfg.ratio != SWA_RATIO and any(p % cfg.ratio for _, p, _ in docs):
        raise PeerError(f"padded document lengths must be multiples of the ratio {cfg.ratio}")
    dout = torch.from_numpy(st.read(a.grad_output)["dout"].astype(np.float32).reshape(x.shape))
    expected = st.read(a.expected)
    x.requires_grad_()
    checkpoint = resolve_checkpoint(a.checkpoint, cfg, docs)
    out, loss = forward_backward(W, x, docs, dout, cfg, a.chunk, checkpoint)
    got = {"out": out.detach().numpy().reshape(x_shape), "dx": x.grad.numpy().reshape(x_shape)}
    if loss is not None:
        got["indexer_loss"] = np.array([float(loss)])
    for name, w in W.items():
        got["grad." + prefix + name] = (w.grad if w.grad is not None else torch.zeros_like(w)).numpy()
    ok = True
    for name, exp in expected.items():
        if name in ("topk_ids", "topk_scores", "index_scores"):
            continue
        if name not in got:
            print(f"FAIL {name:<50} not computed by the peer")
            ok = False
            continue
        tol = TOL_GRAD if (name == "dx" or name.startswith("grad.")) else TOL_OUT
        ok &= compare(name, got[name], exp, tol)
    print(f"{'PASS' if ok else 'FAIL'} (ratio {cfg.ratio}, {len(docs)} document(s), checkpoint "
          f"{'on' if checkpoint else 'off'}, chunk {a.chunk})")
    return 0 if ok else EXIT_CHECK_FAILED


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    for name in ("bench", "check"):
        s = sub.add_parser(name)
        s.add_argument("--config")
        s.add_argument("--layer", type=int, default=None)
        s.add_argument("--weights")
        s.add_argument("--input")
        s.add_argument("--threads", type=int, default=None)
        s.add_argument("--chunk", type=int, default=DEFAULT_CHUNK, help="queries per attention chunk")
        s.add_argument("--checkpoint", choices=("auto", "on", "off"), default="auto")
        s.add_argument("--mem-limit-gib", type=float, default=DEFAULT_MEM_LIMIT_GIB)
        if name == "bench":
            s.add_argument("--preset", choices=sorted(PRESETS))
            s.add_argument("--ratio", type=int, choices=layer_spec.VALID_RATIOS)
            s.add_argument("--seq", type=int)
            s.add_argument("--seed", type=int, default=DEFAULT_SEED)
            s.add_argument("--reps", type=int, default=DEFAULT_REPS)
            s.add_argument("--json")
        else:
            s.add_argument("--grad-output", required=True)
            s.add_argument("--expected", required=True)
    a = p.parse_args(argv)
    if a.mode == "check":
        for key in ("config", "layer", "weights", "input"):
            if getattr(a, key) is None:
                p.error(f"check needs --{key}")
    if a.config and a.layer is None:
        p.error("--config needs --layer")
    return a


def main(argv=None):
    a = parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    set_memory_limit(a.mem_limit_gib)
    try:
        return run_bench(a) if a.mode == "bench" else run_check(a)
    except (PeerError, ValueError, OSError, RuntimeError, MemoryError) as e:
        message = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        print(f"peer.py: {message}", file=sys.stderr)
        if a.mode == "bench":
            write_json(a.json, {"error": message, "ratio": a.ratio, "seq": a.seq, "threads": a.threads,
                                "peak_rss_bytes": peak_rss_bytes()})
        return EXIT_RUN_FAILED


if __name__ == "__main__":
    sys.exit(main())
