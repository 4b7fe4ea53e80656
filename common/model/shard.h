/* Who owns which elements: every slab of the flat parameter vector is cut into
 * comm_shard() pieces, one per rank (the first numel % N ranks hold one element more),
 * and a rank's shard is its pieces laid end to end, slab by slab.
 *
 * Cutting per slab rather than the whole vector at once costs nothing in stages 1
 * and 2 and is what stage 3 needs: a block can be all-gathered on its own. Gradients
 * and Adam moments use the same layout, so one index serves all of them. */
#ifndef SHARD_H
#define SHARD_H
#include <stddef.h>

#include "comm.h"
#include "model.h"
#include "ops.h"
#include "precision.h"

typedef struct {
    int num_slabs;
    int world_size, rank;
    size_t num_params;       /* P: the whole vector */
    size_t *slab_numel;      /* per slab */
    size_t *slab_offset;     /* where the slab starts in the whole vector */
    size_t *piece_offset;    /* where this rank's piece starts inside its slab */
    size_t *piece_len;       /* elements of the slab this rank owns */
    size_t *shard_pos;       /* where the piece starts in this rank's shard */
    size_t shard_len;        /* elements this rank owns, all slabs together */
} shard_layout;

void shard_layout_init(shard_layout *l, const gpt_shape *s, int world_size, int rank);
void shard_layout_free(shard_layout *l);

/* Index in the whole vector of the first element of this rank's piece of slab. */
static inline size_t shard_piece_begin(const shard_layout *l, int slab) {
    return l->slab_offset[slab] + l->piece_offset[slab];
}

/* ---- ZeRO-1's three moves on this layout, over the group it was cut for ------------ */
/* A whole gradient vector's reduction into this rank's pieces, in place: a
 * reduce-scatter per slab (the other pieces keep this rank's own partial sums). */
void shard_reduce_scatter_in_place(comm *group, const shard_layout *l, float *whole);
/* Every rank's pieces into every rank's whole vector: an all-gather per slab, of
 * elements of precision p (16-bit compute weights travel in 16 bits). */
void shard_allgather_in_place(comm *group, const shard_layout *l, precision p, void *whole);
/* The gradient shard_adamw reads: a whole vector or this rank's shard, fp32 or 16-bit
 * (widened a chunk at a time and multiplied by scale, mixed_adamw_update). */
typedef struct {
    const void *data;
    precision precision;
    int whole;
    float scale;   /* 1, or fp16's 1/S for 16-bit gradients */
} shard_grads;

/* The 16-bit compute weights shard_adamw writes as it updates (mixed precision): a
 * whole vector or this rank's shard, of precision. */
typedef struct {
    void *data;
    precision precision;
    int whole;
} shard_compute;

/* AdamW on this rank's pieces alone, with moments m, v of shard_len elements. params
 * are the whole vector or this rank's shard, as params_whole says. AdamW is element by
 * element, so this gives exactly what the whole update would give there. compute (NULL:
 * none) takes this rank's updated pieces rounded, in the same pass
 * (mixed_adamw_update_round). */
void shard_adamw(const shard_layout *l, float *params, int params_whole,
                 const shard_grads *grads, float *m, float *v, const adamw_config *cfg,
                 int step, const shard_compute *compute);

/* Elements the largest rank owns beyond an even split P/N: at most one per slab. */
size_t shard_largest_len(const gpt_shape *s, int world_size);

#endif
