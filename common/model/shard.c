#include "shard.h"

#include <stdlib.h>

#include "alloc.h"
#include "comm.h"
#include "ops_mixed.h"

static size_t *count_array(int n) {
    return mem_alloc(MEM_OTHER, (size_t)n * sizeof(size_t));   /* freed with a stopped rank */
}

void shard_layout_init(shard_layout *l, const gpt_shape *s, int world_size, int rank) {
    const int n = gpt_num_slabs(s);
    *l = (shard_layout){.num_slabs = n, .world_size = world_size, .rank = rank,
                        .num_params = gpt_num_params(s)};
    l->slab_numel = count_array(n);
    l->slab_offset = count_array(n);
    l->piece_offset = count_array(n);
    l->piece_len = count_array(n);
    l->shard_pos = count_array(n);
    for (int slab = 0; slab < n; slab++) {
        l->slab_numel[slab] = gpt_slab_numel(s, slab);
        l->slab_offset[slab] = gpt_slab_offset(s, slab);
        l->piece_len[slab] = comm_shard(l->slab_numel[slab], world_size, rank,
                                        &l->piece_offset[slab]);
        l->shard_pos[slab] = l->shard_len;
        l->shard_len += l->piece_len[slab];
    }
}

void shard_layout_free(shard_layout *l) {
    mem_free(l->slab_numel);
    mem_free(l->slab_offset);
    mem_free(l->piece_offset);
    mem_free(l->piece_len);
    mem_free(l->shard_pos);
    *l = (shard_layout){0};
}

size_t shard_largest_len(const gpt_shape *s, int world_size) {
    size_t largest = 0;
    for (int slab = 0; slab < gpt_num_slabs(s); slab++) {
        size_t offset;
        /* rank 0 always gets the larger piece when a slab does not divide */
        largest += comm_shard(gpt_slab_numel(s, slab), world_size, 0, &offset);
    }
    return largest;
}

void shard_reduce_scatter_in_place(comm *group, const shard_layout *l, float *whole) {
    for (int slab = 0; slab < l->num_slabs; slab++)
        comm_reduce_scatter(group, whole + l->slab_offset[slab], whole + shard_piece_begin(l, slab),
                            l->slab_numel[slab], COMM_F32, COMM_SUM);
}

void shard_allgather_in_place(comm *group, const shard_layout *l, precision p, void *whole) {
    for (int slab = 0; slab < l->num_slabs; slab++)
        comm_allgather(group, precision_at(p, whole, shard_piece_begin(l, slab)),
                       precision_at(p, whole, l->slab_offset[slab]), l->slab_numel[slab],
                       comm_dtype_of(p));
}

/* Where this rank's piece of slab lives in a whole vector or in a shard. */
static size_t piece_at(const shard_layout *l, int is_whole, int slab) {
    return is_whole ? shard_piece_begin(l, slab) : l->shard_pos[slab];
}

void shard_adamw(const shard_layout *l, float *params, int params_whole,
                 const shard_grads *grads, float *m, float *v, const adamw_config *cfg,
                 int step, const shard_compute *compute) {
    const precision gp = grads->precision;
    for (int slab = 0; slab < l->num_slabs; slab++) {
        float *piece = params + piece_at(l, params_whole, slab);
        const void *grad = precision_at(gp, grads->data, piece_at(l, grads->whole, slab));
        float *pm = m + l->shard_pos[slab], *pv = v + l->shard_pos[slab];
        const size_t n = l->piece_len[slab];
        if (compute)
            mixed_adamw_update_round(gp, piece, grad, grads->scale, pm, pv, n, cfg, step,
                                     compute->precision,
                                     precision_at(compute->precision, compute->data,
                                                  piece_at(l, compute->whole, slab)));
        else
            mixed_adamw_update(gp, piece, grad, grads->scale, pm, pv, n, cfg, step);
    }
}
