/* What an MoE run keeps on each rank while it trains (step 1's gradients, the routing of
 * every step, the rows it exchanged) and how world rank 0's outcome collects it at the
 * end (ep_train.h). Not for callers. */
#ifndef EP_COLLECT_H
#define EP_COLLECT_H
#include <stddef.h>

#include "ep_train.h"
#include "train_loop.h"

typedef struct {
    moe_shape shape;               /* this rank's experts */
    size_t dense_n;
    float *first[3], *final[3];    /* host copies: dense, routers, this rank's experts */
    double remote_rows, exchanged_rows;   /* since the warm-up */
} ep_keep;

void ep_keep_init(ep_keep *k, const moe_shape *s, size_t dense_n);
void ep_keep_free(ep_keep *k);
/* After a step's backward: its routing statistics into out (world rank 0: out not
 * NULL), its exchanged rows into the totals. */
void ep_keep_step(ep_keep *k, const moe_layer *layer, int step, ep_outcome *out);
void ep_keep_reset_traffic(ep_keep *k);
/* Host copies of the three vectors: step 1's gradients (first) or the final parameters. */
void ep_keep_vectors(ep_keep *k, const float *dense, const float *routers,
                     const float *experts, int first);
/* Collective over the mesh's world (nothing to do on one device): the run's row, loss,
 * whole-model vectors and traffic into world rank 0's out. */
void ep_collect(ep_keep *k, const mesh *mesh, const train_outcome *run, ep_outcome *out);

#endif
