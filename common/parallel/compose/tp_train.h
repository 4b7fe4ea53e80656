/* Tensor parallelism (Megatron-LM) as a strategy for the training loop, times data
 * parallelism when there are more ranks than the TP size: on a mesh of tp x dp ranks
 * (pp 1), TP inside each group of t consecutive ranks, DDP's overlapped gradient
 * buckets across the groups. Every rank trains; world rank 0 gathers the unsplit
 * gradients of step 1 and parameters at the end into its outcome (strategy_outcome.h). */
#ifndef TP_TRAIN_H
#define TP_TRAIN_H
#include <stddef.h>

#include "baseline.h"
#include "data.h"
#include "mesh.h"
#include "strategy_outcome.h"
#include "tolerances.h"
#include "tp_bytes.h"
#include "tp_sizes.h"

/* The outcome's extra for TP (strategy_outcome.extra). */
typedef struct {
    int tp, dp;
    int vocab_parallel;               /* the vocabulary split over the TP ranks */
    int vocab_local, vocab_padding;   /* vocabulary rows per rank, zero rows added */
    size_t params_per_rank;           /* elements this rank holds */
    double allreduces_per_step;       /* measured on the tp group, timed steps */
    double gathers_per_step;          /* ... all-gathers and reduce-scatters (SP) */
    double dp_allreduces_per_step;    /* the dp group's, measured */
    double bytes_tp_per_step, bytes_dp_per_step;   /* per rank, measured */
    double replica_drift;             /* largest difference between TP ranks' copies of
                                         the replicated tensors */
    int sequence_parallel;            /* Megatron SP on the tp group */
    /* bytes per rank per step on the tp group by collective, measured */
    double tp_allreduce_bytes, tp_reduce_scatter_bytes, tp_allgather_bytes;
} tp_extra;
static inline const tp_extra *tp_extra_of(const strategy_outcome *o) { return o->extra; }

typedef struct {
    int drop_f_backward;   /* negative control: f's backward all-reduce left out */
    int sequence_parallel;    /* Megatron SP (tp_sequence.h) */
    int sp_copy_not_reduce;   /* negative control: SP's reduce-scatters left out */
    int tp_overlap_chunks;    /* with SP: collective matmuls in this many chunks (0: off) */
    int tp_overlap_control;   /* tp_overlap.h's negative controls */
    int recompute_attention;  /* selective recomputation */
    int checkpoint_activations;   /* full recomputation: block inputs kept alone */
    int grads_over_tp;        /* negative control: dp's gradient all-reduce run over the
                                 tp group (the wrong one) */
} tp_options;

/* Collective over world, the mesh m's (pp 1). opts may be NULL. */
void tp_train(comm *world, const mesh *m, const run_config *cfg, const tp_options *opts,
              const dataset *data, strategy_outcome *out);
/* strategy_launch of tp_train on cfg->comm's ranks as tp x (ranks / tp) (tp 0: all). */
int tp_launch(const run_config *cfg, const dataset *data, int tp, const tp_options *opts,
              strategy_outcome *rank0_out);

/* Every difference against its tolerance (tolerances.h; 1 = at the limit). */
double tp_worst_fraction_of_tolerance(const run_result *r);

/* The tolerances of a TP, pipeline or mesh run against baseline b in cfg's precision
 * (tolerances_for_tp, with b's largest step-1 gradient); tp: the run's TP size. */
run_tolerances tp_run_tolerances(const run_config *cfg, int tp, const baseline_run *b);

#endif
