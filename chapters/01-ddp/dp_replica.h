/* One DataParallel replica, driven op by op as Python drives a module: every op is
 * called with the GIL held; the heavy kernels (matmuls and attention) may let it go
 * while they run, as PyTorch's C++ kernels do, and the light ones (layer norm, GELU,
 * residual adds, embedding, loss) keep it. The ops and their order are exactly those
 * of gpt_forward / gpt_backward (common/model.c), so a one-thread DataParallel is
 * bit-identical to the baseline; only the lock around each op is new. */
#ifndef DP_REPLICA_H
#define DP_REPLICA_H

#include "gil.h"
#include "model.h"

/* The thread that runs a replica: the lock it must take and what it spent on it. */
typedef struct {
    gil *lock;
    int release_in_kernels;   /* --gil release */
    gil_account account;
} dp_thread;

typedef struct dp_replica dp_replica;

/* Activations for B sequences of T tokens (tensor parallel size 1). */
dp_replica *dp_replica_create(const gpt_shape *s, int B, int T);
void dp_replica_free(dp_replica *r);
void dp_replica_set_batch(dp_replica *r, const int *tokens, const int *targets);
/* Returns the mean loss over the replica's tokens. */
float dp_replica_forward(dp_replica *r, const float *params, dp_thread *t);
/* Accumulates into grads; dloss as in gpt_backward. */
void dp_replica_backward(dp_replica *r, const float *params, float *grads, float dloss,
                         dp_thread *t);

#endif
