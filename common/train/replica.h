/* Pieces of a training step that every strategy shares: a whole (or TP-sliced) copy
 * of the model with its optimizer, and a step's batch loaded into a model. */
#ifndef REPLICA_H
#define REPLICA_H
#include <stddef.h>

#include "checkpoint.h"
#include "data.h"
#include "model.h"
#include "run_config.h"

/* A whole (or TP-sliced) copy of the model on this rank: parameters, gradients and,
 * when asked, AdamW moments, each in one contiguous slab-ordered vector. */
typedef struct {
    gpt_shape shape;
    size_t num_params;
    float *params, *grads, *adam_m, *adam_v;
    int adam_step;
} replica;

void replica_init(replica *r, const gpt_shape *s, uint64_t seed, int with_optimizer);
void replica_free(replica *r);
/* The replica as one checkpoint part; writes: whether this rank's copy is the one
 * saved (one replica of each TP slice and stage is). */
void replica_checkpoint_state(replica *r, int writes, ckpt_state *out);
/* One AdamW step over the whole vector. */
void replica_adamw(replica *r, const adamw_config *cfg);

/* Uploads sequences [first, first + count) of a step's global batch into m; count is the
 * model's micro-batch size B (the batch is staged in the model's own host buffer). */
void load_batch(gpt_model *m, const dataset *d, const run_config *cfg, int step,
                int first, int count);

#endif
