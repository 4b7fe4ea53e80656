/* Pieces of a training step that every strategy shares: a whole (or TP-sliced) copy
 * of the model with its optimizer, and a step's batch loaded into a model. */
#ifndef REPLICA_H
#define REPLICA_H
#include <stddef.h>

#include "checkpoint.h"
#include "data.h"
#include "grad_vector.h"
#include "model.h"
#include "run_config.h"

/* A whole (or TP-sliced) copy of the model on this rank: parameters, gradients and,
 * when asked, AdamW moments, each in one contiguous slab-ordered vector.
 *
 * In mixed precision (bf16, fp16) `params` are the fp32 master weights, which AdamW updates
 * (tagged optimizer state, as the ZeRO paper counts them in its K = 12 bytes), and forward
 * and backward read `compute`, their 16-bit copy (tagged params: 2 B per parameter),
 * rounded from the masters by AdamW as it updates them (one pass over memory:
 * mixed_adamw_update_round), and by replica_compute_params before the first step (fresh or
 * resumed). In fp32 both are the same vector. Gradients are fp32, or with --grad-dtype
 * bf16|fp16 (grads16.h) held 16-bit in `grads16` (tagged grads: 2 B per parameter, `grads`
 * NULL): AdamW widens them a chunk at a time as it goes (mixed_adamw_update), so no fp32
 * copy is held. */
typedef struct {
    gpt_shape shape;
    size_t num_params;
    precision precision;   /* of `compute` */
    float *params, *grads, *adam_m, *adam_v;
    void *compute;
    int compute_current;        /* 16 bits: compute holds the masters rounded (0 until the
                                   first step's rounding) */
    precision grad_precision;   /* of the gradients held: fp32, or `precision` */
    void *grads16;              /* 16-bit gradients, else NULL */
    float grads16_unscale;      /* what AdamW multiplies them by (fp16's 1/S), else 1 */
    int adam_step;
    int masters_in_16_bits;   /* negative control: the masters rounded after each update */
} replica;

void replica_init(replica *r, const gpt_shape *s, uint64_t seed, int with_optimizer);
/* Computes in p from now on (a 16-bit p allocates the compute copy). Before the first
 * step. */
void replica_set_precision(replica *r, precision p);
/* At the start of a step: the compute copy rounded from the master weights where
 * AdamW has not written it (the first step; in fp32, nothing to do). Returns what
 * forward and backward read. */
const void *replica_compute_params(replica *r);
/* Holds its gradients in gp from now on (16 bits: grads16; fp32: nothing changes).
 * After replica_set_precision, before the first step. */
void replica_set_grad_precision(replica *r, precision gp);
/* The gradients held, zeroed: a step's start. */
void replica_grads_zero(replica *r);
/* One micro-batch's backward onto the gradients held (gpt_backward's arguments). */
void replica_backward(replica *r, gpt_model *m, const void *weights, float dloss,
                      gpt_slab_ready_fn on_slab_ready, void *ctx);
void replica_free(replica *r);
/* The replica as one checkpoint part; writes: whether this rank's copy is the one
 * saved (one replica of each TP slice and stage is). */
void replica_checkpoint_state(replica *r, int writes, ckpt_state *out);
/* Its gradient as the one vector the loss scale checks (train_loop.h); returns 1. */
int replica_optimizer_grads(replica *r, grad_vector *vectors);
/* The gradient AdamW reads, into host[num_params] (16 bits: widened and unscaled). */
void replica_download_grads(const replica *r, float *host);
/* One AdamW step over the whole vector (16-bit gradients: widened as it goes; 16-bit
 * compute: rounded from the updated masters in the same pass). */
void replica_adamw(replica *r, const adamw_config *cfg);

/* Uploads sequences [first, first + count) of a step's global batch into m; count is the
 * model's micro-batch size B (the batch is staged in the model's own host buffer). */
void load_batch(gpt_model *m, const dataset *d, const run_config *cfg, int step,
                int first, int count);

#endif
