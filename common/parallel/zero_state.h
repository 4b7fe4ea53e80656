/* ZeRO on one rank: what it stores at each stage (zero.h runs the stages' steps on it,
 * fsdp.h stage 3).
 *
 *   stage  parameters  gradients  Adam m, v   gradient reduction         after the update
 *   0      whole       whole      whole       all-reduce                 -
 *   1      whole       whole      shard       reduce-scatter per slab    all-gather params
 *   2      whole       shard      shard       reduce-scatter per block,  all-gather params
 *                                             during backward
 *   3      shard       shard      shard       reduce-scatter per block   - (gathered per
 *                                             during backward              block when used)
 *
 * Every rank takes B/N sequences of the global batch and back-propagates with
 * dloss = 1/(B*T), the baseline's; summing the ranks' gradients then gives exactly the
 * baseline's gradient (up to float rounding). */
#ifndef ZERO_STATE_H
#define ZERO_STATE_H

#include "checkpoint.h"
#include "comm.h"
#include "grad_buckets.h"
#include "model.h"
#include "ops.h"
#include "shard.h"

/* Negative controls for the tests: each leaves out one step of the algorithm, and the
 * comparison with the baseline must then fail. */
typedef enum {
    ZERO_FAULT_NONE,
    ZERO_FAULT_SKIP_PARAM_ALLGATHER,   /* stages 1-2: others' pieces stay stale */
    ZERO_FAULT_SKIP_GRAD_REDUCE,       /* every stage: each rank keeps its own gradient */
} zero_fault;

typedef struct {
    int stage;                    /* 0 (plain DDP), 1, 2, 3 (FSDP) */
    int prefetch;                 /* stage 3: all-gather the next block during this one */
    int checkpoint_activations;   /* keep block inputs only, recompute in backward */
    zero_fault fault;
} zero_options;

typedef struct {
    comm *group;    /* the data-parallel group the state is sharded over */
    gpt_shape shape;
    zero_options opts;
    shard_layout layout;
    gpt_model *model;
    grad_buckets *buckets;   /* stage 0: DDP's all-reduce, one bucket */
    /* Each vector is either whole (num_params elements, slab-ordered like the model)
     * or this rank's shard (layout.shard_len elements); see the table above. */
    float *params, *grads, *adam_m, *adam_v;
    int params_whole, grads_whole, optimizer_whole;
    int adam_step;
} zero_rank;

/* Allocates what the stage stores (tagged params, grads, optimizer) and initialises
 * the parameters this rank owns from the seed; whole copies are then all-gathered. */
zero_rank *zero_rank_create(comm *group, const gpt_shape *s, int local_batch, int T,
                            uint64_t seed, const zero_options *opts);
void zero_rank_free(zero_rank *z);

/* For checking only (collective): the whole reduced gradient / the whole parameter
 * vector, copied to host memory on ranks that pass a non-NULL buffer. */
void zero_gather_grads(zero_rank *z, float *host);
void zero_gather_params(zero_rank *z, float *host);

/* The state as one checkpoint part (checkpoint.h): each rank saves its pieces of
 * every vector, whole or not. */
void zero_checkpoint_state(zero_rank *z, ckpt_state *out);

/* Pieces the stages share. */
/* Where this rank's piece of a slab lives in a whole vector or in a shard. */
float *zero_piece(const zero_rank *z, float *vector, int is_whole, int slab);
/* A zeroed full-size gradient buffer for one slab, tagged grads. */
float *zero_slab_grad_alloc(zero_rank *z, int slab);
/* Reduce-scatters a slab's full gradient into this rank's gradient shard and frees
 * the full buffer: after this, the rank holds only its piece of that slab. */
void zero_reduce_into_shard(zero_rank *z, int slab, float *slab_grad);

#endif
