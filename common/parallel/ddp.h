/* DistributedDataParallel: one whole replica per rank, each on its slice of the global
 * batch; gradients averaged by all-reduce in buckets that start during backward; every
 * rank then runs the same AdamW step, so the replicas stay identical.
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

typedef struct {
    size_t bucket_bytes;   /* cap of one gradient bucket (--bucket-mb, default 25 MiB) */
    size_t first_bucket_bytes;   /* cap of the first (--first-bucket-mb, default 1 MiB) */
    int grad_accum;        /* micro-steps per optimizer step (--grad-accum) */
    comm_dtype wire;       /* type gradients travel in (--compress); COMM_F32: none */
    int allreduce;         /* 0: never average gradients (the tests' negative control) */
} ddp_options;

ddp_options ddp_options_default(void);

/* Whether the global batch splits into ranks x grad_accum equal micro-batches; if
 * not, writes one line saying why and what would fit, and returns 0. */
int ddp_check_batch(int batch, int ranks, int grad_accum, char *err, size_t err_len);
/* The same, for main: on failure prints that line (under mpirun from world rank 0's
 * process only) and exits with status 2, before any rank starts. */
void ddp_check_batch_or_exit(int batch, int ranks, int grad_accum);

/* What a DDP run needs and, on world rank 0, what it measured. */
typedef struct {
    const run_config *cfg;
    const dataset *data;
    ddp_options opts;
    /* when set, world rank 0 prints the run's header (report_header) with this title
     * before the first step, once the communicator, hence its backend, is known */
    const char *header_title;
    /* filled on world rank 0 (host memory, freed by ddp_job_release) */
    run_result result;        /* differences left to the caller */
    float *loss;              /* per step, global-batch mean */
    float *first_grads;       /* averaged gradients of step 1, before the update */
    float *final_params;      /* rank 0's parameters after the last step */
    int num_buckets;
    size_t *bucket_numel;     /* [num_buckets], launch order */
    double async_seconds;     /* per rank per run: all-reduces in flight (largest rank) */
    uint64_t allreduce_calls; /* per rank per timed step, on the gradient group */
    double replica_max_diff;  /* largest |params_r - params_0| over ranks at the end */
    int world;
    const char *backend;      /* comm_backend_name(world): "threads", "mpi", "nccl" */
} ddp_job;

/* A rank_main for launch(): trains cfg->steps steps; args is a ddp_job. */
int ddp_rank_main(comm *world, void *job);
void ddp_job_release(ddp_job *job);

#endif
