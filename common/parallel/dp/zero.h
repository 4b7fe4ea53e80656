/* ZeRO's training step at stages 0, 1 and 2, and stage 3 through fsdp.h, on the state
 * of zero_state.h (its reductions and update are dp_grads.h's, which the pipeline
 * uses too):
 *
 *   stage 0   backward, then the gradient all-reduced (DDP's buckets, one bucket)
 *   stage 1   backward, then a reduce-scatter per slab: each rank gets its piece
 *   stage 2   a reduce-scatter per slab as soon as backward finishes the slab
 *   stage 3   FSDP: parameters gathered per block just in time
 *   then      AdamW on this rank's pieces; stages 1 and 2 all-gather the parameters
 *             (dp_grads_optimizer_step)
 * The mesh trainer runs them on one stage in ZeRO's way (pipeline.h: zero_way), which is
 * what chapter 2 trains (zero_train.h). */
#ifndef ZERO_H
#define ZERO_H

#include "zero_state.h"

/* Forward and backward on the micro-batch loaded into z->model, and the stage's
 * gradient reduction: on return the reduced gradient of this rank's part is in
 * z->dp.grads. Returns this rank's mean loss. */
float zero_forward_backward(zero_rank *z, float dloss);

#endif
