/* DataParallel, as torch.nn.DataParallel does it: ONE process, a master replica on
 * device 0, and every step
 *
 *     replicate: copy the master's parameters to replicas 1..N-1
 *     scatter:   give each replica B/N sequences of the batch
 *     parallel:  N threads run forward and backward, every op under one global lock
 *     gather:    add the replicas' gradients onto the master's
 *     step:      AdamW on the master only
 *
 * All parameter and gradient traffic goes through the master, so its link carries
 * 2 (N-1) x the gradient bytes per step, while a DDP rank's carries 2 (N-1)/N x.
 *
 * In bf16/fp16 (autocast's replicas) the master keeps fp32 weights and AdamW, and sends
 * its 16-bit compute copy; with --grad-dtype bf16|fp16 the replicas hold and send
 * 16-bit gradients, summed onto the master's in 16 bits; fp16's loss scale multiplies
 * every replica's d(loss). FP8 is DDP's alone (its amax is a group's reduction). */
#ifndef DP_H
#define DP_H

#include "data.h"
#include "report.h"
#include "baseline.h"
#include "replica.h"
#include "strategy_outcome.h"

typedef struct {
    int threads;       /* replicas, one thread each */
    int release_gil;   /* --gil release: heavy kernels run without the lock */
    int skip_gather;   /* negative control: the replicas' gradients never reach the master */
} dp_options;

/* The outcome's extra for DataParallel (strategy_outcome.extra). */
typedef struct {
    dp_options opts;
    /* per timed step, on the master's clock */
    double replicate_seconds, scatter_seconds, parallel_seconds, gather_seconds,
        optimizer_seconds;
    /* per timed step, summed over the threads */
    double gil_wait_seconds, gil_held_seconds;
    double gil_acquisitions;
    /* share of the forward+backward time during which some thread held the lock (one
     * at a time): with --gil hold all compute happens inside it */
    double gil_busy_fraction;
    /* bytes through the master per step */
    double params_out_bytes, batch_out_bytes, grads_in_bytes;
} dp_extra;

/* Trains with opts->threads replicas in this process and fills out, whose buffers the
 * caller allocated (strategy_outcome_alloc): strategy "dp", the master's loss, summed
 * gradients of step 1 and final parameters; out->extra, when set, is a dp_extra. */
void dp_train(const run_config *cfg, const dataset *data, const dp_options *opts,
              strategy_outcome *out);

#endif
