/* weights.h: internal view of a layer's weight set: tensors addressed by id. */
#ifndef DSV4_WEIGHTS_H
#define DSV4_WEIGHTS_H

#include "dsv4cp.h"
#include "io/checkpoint.h"

typedef enum {
  W_WQ_A = 0,   /* attn.wq_a.weight            [dq, d] */
  W_Q_NORM,     /* attn.q_norm.weight          [dq] */
  W_WQ_B,       /* attn.wq_b.weight            [H*D, dq] */
  W_WKV,        /* attn.wkv.weight             [D, d] */
  W_KV_NORM,    /* attn.kv_norm.weight         [D] */
  W_SINK,       /* attn.attn_sink              [H] */
  W_WO_A,       /* attn.wo_a.weight            [G*Ro, (H/G)*D] */
  W_WO_B,       /* attn.wo_b.weight            [d, G*Ro] */
  W_C_APE,      /* attn.compressor.ape         [r, c*D]      r > 0 (V4 only) */
  W_C_WKV,      /* attn.compressor.wkv.weight  [c*D, d] */
  W_C_WGATE,    /* attn.compressor.wgate.weight [c*D, d]    (V4.1: kv sources of ratio 2) */
  W_C_NORM,     /* attn.compressor.norm.weight [D] */
  W_I_WQ_B,     /* attn.indexer.wq_b.weight    [Hi*Di, dq]   r == 4, V4.1 index sources */
  W_I_PROJ,     /* attn.indexer.weights_proj.weight [Hi, d] */
  W_I_APE,      /* attn.indexer.compressor.ape [4, 2*Di] */
  W_I_WKV,      /* attn.indexer.compressor.wkv.weight [2*Di, d] */
  W_I_WGATE,    /* attn.indexer.compressor.wgate.weight [2*Di, d] */
  W_I_NORM,     /* attn.indexer.compressor.norm.weight [Di] */
  W_I_WK,       /* attn.indexer.wk.weight      [Di, D]       V4.1 kv sources */
  W_I_KNORM,    /* attn.indexer.k_norm.weight  [Di] */
  W_COUNT
} dsv4_wid;

/* Data of tensor id, or NULL when the layer kind has no such tensor. */
float *dsv4_w(const dsv4_weights *w, dsv4_wid id);
/* The one allocation behind every tensor (n floats), for whole-set reductions. */
float *dsv4_weights_block(const dsv4_weights *w, int64_t *n);
/* Floats in the weight set of `layer` (what dsv4_weights_create would allocate), without allocating. */
dsv4_status dsv4_weights_numel(const dsv4_config *cfg, int layer, int64_t *n);
int dsv4_weights_layer(const dsv4_weights *w);
const dsv4_config *dsv4_weights_config(const dsv4_weights *w);
/* Finds every tensor of the layer in an opened checkpoint without reading data: sets the name
 * prefix the checkpoint uses (see dsv4_weights_prefix), checks names, dtypes, shapes and FP8 scales.
 * src[i] (at least dsv4_weights_count entries) is tensor i in dsv4_weights_get order. */
dsv4_status dsv4_weights_locate(dsv4_weights *w, dsv4_ckpt *c, dsv4_ckpt_tensor *src);
/* Reads located tensors into w (FP8 dequantised); every value must be finite. */
dsv4_status dsv4_weights_read(dsv4_weights *w, const dsv4_ckpt_tensor *src);

#endif
