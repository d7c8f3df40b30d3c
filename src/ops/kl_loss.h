/* kl_loss.h: the fast indexer KL loss adding its k_idx gradient into the caller's exact sums, so that
 * a layer backward that keeps those sums anyway (the indexer keys' gradient over all its chunks) holds
 * one copy of them, not a second one per call and thread. */
#ifndef DSV4_KL_LOSS_H
#define DSV4_KL_LOSS_H

#include "dsv4cp_ops.h"
#include "util/xrows.h"

/* dsv4_indexer_kl_loss with the rows of d k_idx added into x_k (a util/xrows.h view of at least C
 * rows of width Di, zeroed by its owner; its copies bound the threads used) instead of into
 * a->d_k_idx, which is then not written but must be non-NULL for the gradient to be computed.
 * x_k NULL: exactly dsv4_indexer_kl_loss. The sums are integers, so x_k holds the same bits
 * whichever calls and threads added which queries. */
dsv4_status dsv4_indexer_kl_loss_into(const dsv4_kl_args *a, dsv4_xrows *x_k);

#endif
