/* ZeRO's rule (Rajbhandari et al., 2019), written once: stage 1 shards the optimizer
 * state over the data-parallel group, stage 2 the gradients too, stage 3 the parameters
 * too; stage 0 (DDP) keeps every vector whole on every rank. The trainer's buffers
 * (dp_grads.c), the formulas (zero_formulas.c), the planner (plan_memory.c) and the
 * chapters' tables all read it here. */
#ifndef ZERO_RULE_H
#define ZERO_RULE_H

typedef struct {
    int optimizer, grads, params;   /* 1: this rank holds 1/N of it; 0: all of it */
} zero_sharded;

static inline zero_sharded zero_sharded_at(int stage) {
    return (zero_sharded){.optimizer = stage >= 1, .grads = stage >= 2, .params = stage >= 3};
}

/* The fraction of a vector a rank holds on N ranks: 1/N when sharded, else all of it. */
static inline double zero_share(int sharded, int N) { return sharded ? 1.0 / N : 1.0; }

/* Bytes per element of the vectors the stage shards, from each vector's bytes per
 * element (where a shard's padding costs: one element of each a slab that N does not
 * divide). */
static inline double zero_sharded_bytes(int stage, double params, double grads,
                                        double optimizer) {
    const zero_sharded z = zero_sharded_at(stage);
    return (z.optimizer ? optimizer : 0) + (z.grads ? grads : 0) + (z.params ? params : 0);
}

#endif
