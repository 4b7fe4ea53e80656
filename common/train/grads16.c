#include "grads16.h"

#include <stdio.h>
#include <stdlib.h>

#include "alloc.h"
#include "ops_mixed.h"

static float *grad_floats(size_t n) { return mem_alloc_on(MEM_DEVICE, MEM_GRADS, n * sizeof(float)); }

float *grads16_slab_widen(precision gp, const void *grad16, size_t n) {
    float *work = grad_floats(n);
    mixed_widen(gp, work, grad16, n);
    return work;
}

void grads16_slab_round(precision gp, void *grad16, float *work, size_t n) {
    mixed_round(gp, grad16, work, n);
    mem_free(work);
}

/* The 16-bit gradient of a slab inside the whole vector, and its length. */
static void *slab_of(const gpt_shape *s, precision gp, void *grads, int slab) {
    return precision_at(gp, grads, gpt_slab_offset(s, slab));
}

static const void *param_slab_of(const gpt_model *m, const void *params, int slab) {
    return precision_at(gpt_model_precision(m), params, gpt_slab_offset(gpt_model_shape(m), slab));
}

static void round_slab(const gpt_shape *s, precision gp, void *grads, int slab, float *work,
                       gpt_slab_ready_fn on_slab_ready, void *ctx) {
    grads16_slab_round(gp, slab_of(s, gp, grads, slab), work, gpt_slab_numel(s, slab));
    if (on_slab_ready) on_slab_ready(ctx, slab);
}

static float *widen_slab(const gpt_shape *s, precision gp, void *grads, int slab) {
    return grads16_slab_widen(gp, slab_of(s, gp, grads, slab), gpt_slab_numel(s, slab));
}

void gpt_backward_grads16(gpt_model *m, const void *params, precision gp, void *grads,
                          float dloss, gpt_slab_ready_fn on_slab_ready, void *ctx) {
    const gpt_shape *s = gpt_model_shape(m);
    if (!s->has_head || !s->has_embed || s->tp_size > 1 || gpt_head_slab(s) >= 0) {
        fprintf(stderr, "error: 16-bit gradients need a whole model (one stage, no TP)\n");
        abort();
    }
    const int embed = gpt_embed_slab(s), final = gpt_final_slab(s);
    float *embed_work = widen_slab(s, gp, grads, embed);
    float *final_work = widen_slab(s, gp, grads, final);
    /* the tied weight is the first rows of the embedding's slab */
    gpt_head_backward(m, param_slab_of(m, params, final), param_slab_of(m, params, embed),
                      final_work, embed_work, dloss);
    round_slab(s, gp, grads, final, final_work, on_slab_ready, ctx);
    for (int layer = s->layer_end - 1; layer >= s->layer_begin; layer--) {
        const int slab = gpt_block_slab(s, layer);
        float *work = widen_slab(s, gp, grads, slab);
        gpt_block_backward(m, layer, param_slab_of(m, params, slab), work);
        round_slab(s, gp, grads, slab, work, on_slab_ready, ctx);
    }
    gpt_embed_backward(m, embed_work);
    round_slab(s, gp, grads, embed, embed_work, on_slab_ready, ctx);
}

float *grads16_widen_for_optimizer(precision gp, const void *grads16, size_t n, float *reuse) {
    float *wide = reuse ? reuse : grad_floats(n);
    mixed_widen(gp, wide, grads16, n);
    return wide;
}
