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
                                     across (zero_train's mesh: dp_shard = a node) */
    int ranks_per_node;           /* zeropp and hsdp: the nodes (0: one of all ranks) */
    zeropp_fault zeropp_fault;
    zero_fault fault;
} zero_options;

/* ZeRO's way of running one data-parallel stage (zero.h): the stage's state and
 * reductions (dp_grads, stage = zero), the model that computes on them and ZeRO++'s
 * pieces. The mesh trainer owns the state and the model (pipeline.h, one stage); this
 * borrows them. */
typedef struct {
    dp_grads *dp;    /* params, grads, Adam moments, each whole or this rank's shard;
                        dp->shape is the stage's */
    zero_options opts;
    gpt_model *model;
    zeropp *zpp;     /* stage 3 with ZeRO++'s pieces, else NULL */
} zero_rank;

/* Points z at a stage's state and model; at stage 3 with ZeRO++ makes its pieces' groups
 * inside dp's (collective over dp's group). */
void zero_rank_attach(zero_rank *z, dp_grads *dp, gpt_model *model, const zero_options *opts);
void zero_rank_detach(zero_rank *z);

#endif
