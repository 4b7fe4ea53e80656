/* DistributedDataParallel: one whole replica per rank, each on its slice of the global
 * batch; gradients averaged by all-reduce in buckets that start during backward; every
 * rank then runs the same AdamW step, so the replicas stay identical. A configuration
 * of the mesh trainer (pp_train.h, parallelize.h): a mesh of dp ranks, one stage, its
 * grad_accum micro-batches, dp_grads.h at ZeRO 0 with the buckets overlapped
 * (pipeline_options.ddp_buckets); here its options, checks and measurements.
 *
 *   for each step:
 *       for each micro-step k of K:            (--grad-accum K; PyTorch's no_sync)
 *           forward + backward on my B/(N K) sequences, gradients accumulate
 *           on the last micro-step only: all-reduce each bucket as soon as it is final
 *       wait for the buckets; AdamW */
#ifndef DDP_H
#define DDP_H
#include <stddef.h>
#include <stdint.h>

#include "comm.h"
#include "data.h"
#include "report.h"
#include "baseline.h"
#include "replica.h"
#include "strategy_outcome.h"

typedef struct {
    size_t bucket_bytes;   /* cap of one gradient bucket (--bucket-mb, default 25 MiB) */
    size_t first_bucket_bytes;   /* cap of the first (--first-bucket-mb, default 1 MiB) */
    int grad_accum;        /* micro-steps per optimizer step (--grad-accum) */
    comm_dtype wire;       /* type gradients travel in (--compress); COMM_F32: none */
    int allreduce;         /* 0: never average gradients (the tests' negative control) */
    /* when set, world rank 0 prints the run's header (report_header) with this title
     * before the first step, once the communicator, hence its backend, is known */
    const char *header_title;
} ddp_options;

ddp_options ddp_options_default(void);

/* Whether the global batch splits into ranks x grad_accum equal micro-batches; if
 * not, writes one line saying why and what would fit, and returns 0. */
int ddp_check_batch(int batch, int ranks, int grad_accum, char *err, size_t err_len);

/* The outcome's extra for DDP (strategy_outcome.extra), filled by world rank 0. */
typedef struct {
    ddp_options opts;
    const char *backend;      /* comm_backend_name(world): "threads", "mpi", "nccl" */
    int num_buckets;
    size_t *bucket_numel;     /* [num_buckets], launch order (ddp_launch allocates room
                                 for one bucket per slab; ddp_extra_free) */
    double async_seconds;     /* per rank per run: all-reduces in flight (largest rank) */
    uint64_t allreduce_calls; /* per rank per timed step, on the gradient group */
    double replica_max_diff;  /* largest |params_r - params_0| over ranks at the end */
} ddp_extra;
static inline const ddp_extra *ddp_extra_of(const strategy_outcome *o) { return o->extra; }
void ddp_extra_free(ddp_extra *x);

/* Collective over world: trains cfg->steps steps and fills out (strategy_outcome.h).
 * With opts->header_title, world rank 0 prints the run's header first. An extra, when
 * set, needs its bucket_numel (ddp_launch gives it one). */
void ddp_train(comm *world, const run_config *cfg, const dataset *data,
               const ddp_options *opts, strategy_outcome *out);
/* strategy_launch of ddp_train on cfg->comm's ranks; rank0_out->extra, when set, is a
 * ddp_extra whose bucket list this allocates. */
int ddp_launch(const run_config *cfg, const dataset *data, const ddp_options *opts,
               strategy_outcome *rank0_out);

#endif
