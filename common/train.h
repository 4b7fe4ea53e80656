/* Pieces of a training loop that every strategy shares, and the single-device
 * baseline that every strategy is compared with. */
#ifndef TRAIN_H
#define TRAIN_H
#include <stddef.h>

#include "checkpoint.h"
#include "cli.h"
#include "data.h"
#include "model.h"
#include "report.h"

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

/* Largest |a[i] - b[i]| over n floats of host memory. */
double max_abs_diff(const float *a, const float *b, size_t n);

/* The single-device baseline: whole batch, one rank, plain AdamW. */
typedef struct {
    run_result result;     /* strategy "baseline"; differences are 0 */
    float *loss;           /* per step */
    float *first_grads;    /* gradients of step 1, before the update (host copy) */
    float *final_params;   /* after the last step (host copy) */
    size_t num_params;
} baseline_run;

baseline_run *baseline_train(const run_config *cfg, const dataset *data);
/* The baseline a strategy is compared with: it resumes from --resume as the strategy
 * does, but never saves (the strategy's checkpoint is the run's). */
baseline_run *baseline_reference(const run_config *cfg, const dataset *data);
void baseline_free(baseline_run *b);

/* The data set the flags ask for (exits 2 with a clear line if --data can't be used). */
dataset *dataset_from_config(const run_config *cfg);

#endif
