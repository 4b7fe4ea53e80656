/* The MoE layer in 16 bits (moe.h): its compute copy of the experts and the fp32
 * widenings its router and exchanges work in. */
#include <stddef.h>

#include "alloc.h"
#include "moe_internal.h"
#include "ops_mixed.h"

void moe_mixed_ensure(moe_layer *m) {
    if (m->experts16) return;
    const size_t N = m->N, C = m->s.dim, H = m->s.hidden, rows = m->max_rows ? m->max_rows : 1;
    const size_t b = precision_bytes(m->p);
    /* the compute copy of weights, as the model's 16-bit slabs are */
    m->experts16 = mem_alloc(MEM_PARAMS, moe_local_experts_numel(&m->s) * b + 1);
    m->ln2_32 = mem_alloc(MEM_ACTIVATIONS, N * C * sizeof(float));
    m->io32 = mem_alloc(MEM_ACTIVATIONS, N * C * sizeof(float));
    m->x16 = mem_alloc(MEM_ACTIVATIONS, rows * C * b);
    m->y16 = mem_alloc(MEM_ACTIVATIONS, rows * C * b);
    m->h16 = mem_alloc(MEM_ACTIVATIONS, rows * H * b);
}

void moe_mixed_free(moe_layer *m) {
    void *all[] = {m->experts16, m->ln2_32, m->io32, m->x16, m->y16, m->h16};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) mem_free(all[i]);
}

void moe_mixed_round_experts(moe_layer *m) {
    mixed_round(m->p, m->experts16, m->experts, moe_local_experts_numel(&m->s));
}

const void *moe_mixed_weight(const moe_layer *m, const float *t) {
    return precision_at(m->p, m->experts16, (size_t)(t - m->experts));
}
