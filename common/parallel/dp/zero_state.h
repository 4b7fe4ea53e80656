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
#include "dp_grads.h"
#include "model.h"
#include "zeropp.h"

/* Negative controls for the tests: each leaves out one step of the algorithm, and the
 * comparison with the baseline must then fail. */
typedef enum {
    ZERO_FAULT_NONE = DP_FAULT_NONE,
    ZERO_FAULT_SKIP_PARAM_ALLGATHER = DP_FAULT_SKIP_PARAM_ALLGATHER,   /* stages 1-2 */
    ZERO_FAULT_SKIP_GRAD_REDUCE = DP_FAULT_SKIP_GRAD_REDUCE,   /* every stage */
} zero_fault;

typedef struct {
    int stage;                    /* 0 (plain DDP), 1, 2, 3 (FSDP) */
    precision precision;          /* compute weights and activations (dp_grads.h) */
    precision grad_precision;     /* gradients held and reduced: fp32 or `precision` */
    int prefetch;                 /* stage 3: all-gather the next block during this one */
    int checkpoint_activations;   /* keep block inputs only, recompute in backward */
    int zeropp;                   /* stage 3: ZeRO++'s pieces (zeropp.h: ZEROPP_QWZ ...) */
    int hsdp;                     /* stage 3 on two tiers: shard inside a node, replicate
                                     across (zero_train splits the world by node) */
    int ranks_per_node;           /* zeropp and hsdp: the nodes (0: one of all ranks) */
    zeropp_fault zeropp_fault;
    comm *replicate;              /* HSDP: the replicas of this rank's shard group */
    zero_fault fault;
} zero_options;

/* The whole model data-parallel over a group: its state and reductions are dp_grads'
 * (stage = zero), stage 0 with DDP's all-reduce in one bucket. */
typedef struct {
    dp_grads dp;     /* params, grads, Adam moments, each whole or this rank's shard */
    gpt_shape shape;
    zero_options opts;
    gpt_model *model;
    zeropp *zpp;     /* stage 3 with ZeRO++'s pieces, else NULL */
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

#endif
