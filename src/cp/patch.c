/* patch.c: dsv4_cp_patch (a core runs its stages over another communicator), the weight-gradient
 * all-reduce (now done by the backward itself), and the message counters of a core. The core's algorithm is one for one rank and N:
 * patching only replaces the communicator it runs its messages on and the split it plans with. */
#include <string.h>

#include "model/core.h"
#include "model/weights.h"
#include "util/abi.h"
#include "util/err.h"

dsv4_status dsv4_cp_patch(dsv4_core *core, dsv4_comm *comm, const dsv4_cp_config *cfg) {
  dsv4_status rc = DSV4_OK;
  static const dsv4_cp_config defaults = DSV4_CP_CONFIG_INIT;
  dsv4_cp_config c = defaults;
  const dsv4_cp_config *cf = &c;
  DSV4_CHECK(core && comm, DSV4_ERR_ARG, "cp_patch: core and comm are required");
  if (cfg) DSV4_TRY(DSV4_STRUCT_IN(&c, cfg, dsv4_cp_config, &defaults));
  DSV4_CHECK(cf->split == DSV4_SPLIT_CONTIGUOUS || cf->split == DSV4_SPLIT_ZIGZAG, DSV4_ERR_ARG,
             "cp_patch: unknown split %d", (int)cf->split);
  dsv4_xfer_drain(&core->xfer);
  dsv4_core_forget(core);
  core->xfer.comm = comm;
  core->xfer.overlap = cf->overlap != 0;
  core->split = cf->split;
  if (core->have_plan) dsv4_plan_free(&core->plan); /* planned for the old communicator */
  core->have_plan = 0;
  dsv4_offload_free(&core->off);
  memset(&core->xfer.stats, 0, sizeof core->xfer.stats);
fail:
  return rc;
}

dsv4_status dsv4_cp_allreduce_grads(dsv4_comm *comm, dsv4_weights *grads) {
  dsv4_status rc = DSV4_OK;
  /* the backward already summed them over the group, exactly (model/wgrad.h): another sum would
   * count every rank's share N times */
  DSV4_CHECK(comm && grads, DSV4_ERR_ARG, "cp_allreduce_grads: comm and grads are required");
fail:
  return rc;
}

/* dsv4_cp_stats as 0.2.x and 0.3.x laid it out: arrays of DSV4_MSG_KINDS_0_2 / _0_3 entries. */
#define OLD_STATS(K)                                                                                \
  struct {                                                                                          \
    DSV4_STRUCT_HEAD;                                                                               \
    uint64_t bytes_sent[K], bytes_recv[K], messages[K];                                             \
    double seconds[K];                                                                              \
    double hidden_seconds, overlap_window_seconds;                                                  \
  }
typedef OLD_STATS(DSV4_MSG_KINDS_0_2) stats_0_2;
typedef OLD_STATS(DSV4_MSG_KINDS_0_3) stats_0_3;

/* The kinds an older layout knows, copied into it. */
#define COPY_OLD(old, src, K)                                                                       \
  do {                                                                                              \
    memcpy((old).bytes_sent, (src)->bytes_sent, sizeof(uint64_t) * (K));                            \
    memcpy((old).bytes_recv, (src)->bytes_recv, sizeof(uint64_t) * (K));                            \
    memcpy((old).messages, (src)->messages, sizeof(uint64_t) * (K));                                \
    memcpy((old).seconds, (src)->seconds, sizeof(double) * (K));                                    \
    (old).hidden_seconds = (src)->hidden_seconds;                                                   \
    (old).overlap_window_seconds = (src)->overlap_window_seconds;                                   \
  } while (0)

dsv4_status dsv4_cp_stats_out(dsv4_cp_stats *dst, const dsv4_cp_stats *src) {
  dsv4_status rc = DSV4_OK;
  DSV4_TRY(DSV4_STRUCT_CHECK(dst, dsv4_cp_stats));
  if (dst->struct_size == sizeof(stats_0_2)) { /* a caller built against 0.2.x */
    stats_0_2 old = {0};
    COPY_OLD(old, src, DSV4_MSG_KINDS_0_2);
    return DSV4_STRUCT_OUT(dst, &old, stats_0_2);
  }
  if (dst->struct_size == sizeof(stats_0_3)) { /* against 0.3.x */
    stats_0_3 old = {0};
    COPY_OLD(old, src, DSV4_MSG_KINDS_0_3);
    return DSV4_STRUCT_OUT(dst, &old, stats_0_3);
  }
  DSV4_TRY(DSV4_STRUCT_OUT(dst, src, dsv4_cp_stats));
fail:
  return rc;
}

dsv4_status dsv4_cp_get_stats(const dsv4_core *core, dsv4_cp_stats *st) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(core, DSV4_ERR_ARG, "cp_get_stats: NULL core");
  DSV4_TRY(dsv4_cp_stats_out(st, &core->xfer.stats));
fail:
  return rc;
}

void dsv4_cp_stats_reset(dsv4_core *core) {
  if (core) memset(&core->xfer.stats, 0, sizeof core->xfer.stats);
}

const char *dsv4_msg_kind_name(dsv4_msg_kind k) {
  static const char *const names[DSV4_MSG_KINDS] = {
      "window_halo", "compressor_halo", "slot_allgather", "loss_reduce", "meta_check",
      "window_halo_bwd", "compressor_halo_bwd", "slot_reduce_scatter", "wgrad_rows", "wgrad_sums",
      "wgrad_allgather", "attn_offload", "attn_offload_bwd"};
  return k >= 0 && k < DSV4_MSG_KINDS ? names[k] : "unknown";
}
