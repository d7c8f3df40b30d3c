/* TEMPORARY (removed when src/cp/ lands): CP entry points not yet written. */
#include "util/err.h"
dsv4_status dsv4_cp_patch(dsv4_core *core, dsv4_comm *comm, const dsv4_cp_config *cfg) {
  (void)core, (void)comm, (void)cfg;
  return dsv4__err(DSV4_ERR_UNSUPPORTED, __FILE__, __LINE__, "context parallelism is not built yet");
}
dsv4_status dsv4_cp_allreduce_grads(dsv4_comm *comm, dsv4_weights *grads) { (void)comm, (void)grads; return DSV4_OK; }
dsv4_status dsv4_cp_get_stats(const dsv4_core *core, dsv4_cp_stats *st) { (void)core, (void)st; return DSV4_OK; }
const char *dsv4_msg_kind_name(dsv4_msg_kind k) { (void)k; return "?"; }
