/* The data-parallel side of one part of the model over a dp group: what each rank
 * stores, how the gradient is reduced after backward and how AdamW updates it. A part
 * is a gpt_shape: the whole model, a TP slice, a pipeline stage or a stage's TP slice,
 * so each dp group shards its own stage's TP slice. Plain ZeRO (zero.h, fsdp.h) and
 * the pipeline's data parallelism (pipeline.h: PP x DP and 3D) both run on it.
 *
 *   zero  params  grads  Adam    after backward                after AdamW
 *   0     whole   whole  whole   all-reduce (DDP's buckets)    -
 *   1     whole   whole  shard   reduce-scatter per slab       all-gather params
 *   2     whole   shard  shard   reduce-scatter per slab       all-gather params
 *   3     shard   shard  shard   reduce-scatter per slab       - (gathered when used)
 *
 * "none" is zero 0 on a group of one rank with quiet_alone: nothing communicated.
 *
 * Gradients come in one of two ways:
 *   whole     the caller back-propagates (one micro-batch or many) into the vector of
 *             dp_grads_step_begin, then dp_grads_after_backward reduces it. At zero 2
 *             and 3 that whole vector lives only from step_begin to after_backward,
 *             and at zero 3 step_begin also all-gathers the whole parameters for the
 *             step (freed with the gradient): between steps a rank holds shards alone.
 *   per slab  plain ZeRO-2/3 reduce each slab's gradient the moment backward finishes
 *             it (dp_grads_reduce_slab) and never hold a whole gradient; FSDP gathers
 *             parameters slab by slab itself (fsdp.c), with prefetch.
 *
 * Mixed precision (bf16, fp16), as DeepSpeed's ZeRO and PyTorch FSDP keep it: forward
 * and backward read 16-bit compute weights, whole at zero 0-2 and this rank's shard at
 * zero 3 (tagged params: 2 B per element); the fp32 master weights are optimizer state
 * (tagged so: the ZeRO paper's K = 12 is master + m + v), whole at zero 0 and sharded
 * from zero 1 on, like m and v. AdamW writes this rank's compute weights as it updates
 * its masters, each chunk rounded while it is in cache (mixed_adamw_update_round), so
 * dp_grads_begin_step_compute rounds them itself only before the first step (fresh or
 * resumed: the masters just initialised or loaded) and, at zero 1-2, all-gathers the
 * 16-bit weights at the start of every step (half the bytes of fp32's all-gather after
 * AdamW, which fp32 does instead); zero 3 gathers 16-bit slabs when they are used.
 * Gradients are fp32, or with grad_precision 16 bits (grads16.h; plain ZeRO and DDP: zero
 * 0-1 whole gradients, zero 2-3 per slab; the pipeline and the mesh: whole gradients of a
 * step summed in fp32, step_grads_fp32): held in grads16 (whole at zero 0-1, a shard from
 * 2), reduced in 16 bits, and read by AdamW a chunk at a time, widened as it goes
 * (mixed_adamw_update): `grads` stays NULL, and no fp32 copy of them is ever held. */
#ifndef DP_GRADS_H
#define DP_GRADS_H

#include "alloc.h"
#include "checkpoint.h"
#include "comm.h"
#include "grad_buckets.h"
#include "grad_vector.h"
#include "model.h"
#include "ops.h"
#include "shard.h"

/* Negative controls for the tests: each leaves out one step, and the comparison with
 * the baseline must then fail. */
typedef enum {
    DP_FAULT_NONE,
    DP_FAULT_SKIP_PARAM_ALLGATHER,   /* zero 1-2: others' pieces stay stale */
    DP_FAULT_SKIP_GRAD_REDUCE,       /* every zero: each rank keeps its own gradient */
    DP_FAULT_SKIP_REPLICATE_REDUCE,  /* HSDP: each replica keeps its own group's sum */
} dp_fault;

typedef struct {
    int zero;                    /* 0 (DDP), 1, 2, 3 (FSDP) */
    precision precision;         /* of the compute weights (fp32: they are the masters) */
    precision grad_precision;    /* of the gradients held: fp32 or `precision` */
    size_t first_bucket_bytes;   /* zero 0: DDP's bucket caps (0: one bucket) */
    size_t bucket_bytes;
    comm_dtype wire;             /* zero 0, fp32 gradients: the buckets' wire type (DDP's
                                    --compress); COMM_F32: none */
    int overlap;                 /* zero 0: the caller hands each slab of the step's last
                                    backward to dp_grads_slab_ready, whose buckets
                                    all-reduce while backward goes on (DDP's overlap) */
    int quiet_alone;             /* a group of one rank calls no collective (else zero 0
                                    all-reduces on it as on any group) */
    int step_grads_fp32;         /* 16-bit gradients, whole: a step accumulates in an fp32
                                    vector (the pipeline's micro-batches, the tied sum),
                                    rounded once by after_backward */
    comm *replicate;             /* HSDP: the replicas of this rank's shard group (NULL or
                                    one rank: none); each reduced piece all-reduced there */
    mem_stats *bookkeeping;      /* where the slab layout's arrays are charged (NULL: the
                                    rank's own account) */
    dp_fault fault;
} dp_grads_options;

typedef struct {
    comm *group;         /* the data-parallel group (with replicas: the shard group) */
    comm *replicate;     /* HSDP's replicas, or NULL */
    int zero;            /* 0 .. 3, as asked */
    dp_fault fault;
    gpt_shape shape;     /* the part */
    shard_layout layout; /* its slabs cut over the group */
    grad_buckets *buckets;   /* zero 0, unless quiet alone */
    precision precision;
    /* At rest: whole (layout.num_params) or this rank's shard (layout.shard_len).
     * params: the fp32 masters; compute: what forward and backward read (params
     * itself in fp32, else 16-bit: whole at zero 0-2, a shard at zero 3). */
    float *params, *grads, *adam_m, *adam_v;
    void *compute;
    int compute_current;   /* mixed precision: this rank's compute weights hold its masters
                              rounded (0 until the first step's rounding) */
    precision grad_precision;
    void *grads16;       /* 16-bit gradients (whole at zero 0-1, else a shard), or NULL */
    float grads16_unscale;   /* what AdamW multiplies them by (fp16's 1/S), else 1 */
    int step_grads_fp32;     /* as asked (dp_grads_options) */
    int overlap;             /* as asked: the buckets were started during backward */
    int params_whole, grads_whole, optimizer_whole, compute_whole;
    /* zero 3 / zero 2-3: the whole vectors of a step in progress, else NULL */
    void *step_compute;
    float *step_grads;
    int adam_step;
} dp_grads;

/* Allocates what the stage stores (tagged params, grads, optimizer) and initialises
 * the parameters this rank holds from the seed, bit for bit the whole model's values
 * there (a shard: its pieces alone). Nothing is communicated. */
void dp_grads_init(dp_grads *g, comm *group, const gpt_shape *part, uint64_t seed,
                   const dp_grads_options *opts);
void dp_grads_free(dp_grads *g);

/* The start of every step, before forward: in mixed precision this rank's compute
 * weights rounded from the masters where AdamW has not written them (the first step)
 * and all-gathered at zero 1-2; nothing in fp32, whose compute weights are the masters. */
void dp_grads_begin_step_compute(dp_grads *g);
/* This rank's compute weights of a slab at zero 3 (its piece: the part to gather). */
const void *dp_grads_compute_piece(const dp_grads *g, int slab);

/* ---- whole gradients ------------------------------------------------------------- */
/* Opens a step: the whole gradient vector zeroed (allocated at zero 2-3) and, at zero
 * 3, the whole parameters all-gathered. */
void dp_grads_step_begin(dp_grads *g);
/* The step's whole vectors: the compute weights forward and backward read (of the
 * precision), and the gradient backward accumulates into (fp32; with 16-bit gradients
 * only under step_grads_fp32, else NULL). */
void *dp_grads_whole_params(const dp_grads *g);
float *dp_grads_whole_grads(const dp_grads *g);
/* gpt_backward's on_slab_ready for overlap (ctx: the dp_grads): the slab's final
 * gradient into its bucket, whose all-reduce starts when its last slab arrives. */
void dp_grads_slab_ready(void *ctx, int slab);
/* Reduces the whole gradient over the group (and, HSDP, this rank's pieces over the
 * replicas): on return the summed gradient of this rank's part is in g->grads (zero 1: in its pieces; 16 bits: g->grads16, the fp32
 * step vector rounded once first); zero 2-3 free the step's whole vectors. */
void dp_grads_after_backward(dp_grads *g);

/* ---- per slab (zero 2-3) ----------------------------------------------------------- */
/* A zeroed full-size gradient buffer for one slab, tagged grads. */
float *dp_grads_slab_grad_alloc(dp_grads *g, int slab);
/* Reduce-scatters a slab's gradient into this rank's shard (HSDP: then all-reduces the
 * piece over the replicas) and frees the buffer. */
void dp_grads_reduce_slab(dp_grads *g, int slab, float *slab_grad);
/* Where this rank's piece of a slab lives in a whole vector or in a shard. */
float *dp_grads_piece(const dp_grads *g, float *vector, int is_whole, int slab);

/* The gradient AdamW reads, whole or this rank's shard, as one vector for the loss
 * scale (train_loop.h): returns 1. 16-bit at zero 1: the whole vector (see dp_grads.c). */
int dp_grads_optimizer_grads(dp_grads *g, grad_vector *vectors);
/* AdamW on the part this rank updates, then (zero 1, 2) the parameter all-gather. */
void dp_grads_optimizer_step(dp_grads *g, const adamw_config *cfg);

/* ---- checking and saving ------------------------------------------------------------- */
typedef enum { DP_PARAMS, DP_GRADS } dp_vector;
/* Collective: the whole reduced gradient or parameter vector on the device; a
 * temporary (tagged other) where the rank holds a shard or 16-bit gradients (widened and
 * unscaled as AdamW reads them), given back by dp_grads_whole_free. Parameters at zero 1-2: the rank's own copy, as it trains on. */
float *dp_grads_gather_whole(dp_grads *g, dp_vector which);
void dp_grads_whole_free(dp_grads *g, float *whole);
/* The part as a checkpoint part: from zero 1 on each rank saves its pieces (layout
 * set), at zero 0 the rank saves the whole part when `writes`. */
ckpt_part dp_grads_checkpoint_part(dp_grads *g, int writes);

/* Bytes rank dp_rank of dp stores of the part at rest, as dp_grads_init allocates
 * them, by tag: [0] params (the compute weights), [1] grads (of gp), [2] optimizer
 * (Adam m and v, and in mixed precision the fp32 masters). */
void dp_grads_state_bytes(const gpt_shape *part, int zero, precision p, precision gp, int dp,
                          int dp_rank, double bytes[3]);

#endif
