/* ZeRO stage 3 = FSDP: every rank holds 1/N of each slab's parameters, gradients and
 * Adam moments. A slab is all-gathered into a temporary buffer just before it is used
 * and freed right after; backward gathers it again and reduce-scatters its gradient.
 *
 *   forward:   embed, block 0 .. block L-1, head     all-gather, compute, free
 *   backward:  head, block L-1 .. block 0, embed     all-gather, compute, free,
 *                                                    reduce-scatter the gradient
 *
 * With opts.prefetch the next unit's all-gather is started (comm_allgather_start)
 * before this unit computes, so the transfer hides behind the arithmetic at the price
 * of a second gathered buffer. */
#ifndef FSDP_H
#define FSDP_H

#include "zero_state.h"

/* Stage 3's forward and backward on z (created with opts.stage = 3); on return the
 * reduced gradient of this rank's shard is in z->dp.grads. Returns the local mean loss. */
float fsdp_forward_backward(zero_rank *z, float dloss);

#endif
