#include "grads16.h"

#include "alloc.h"
#include "ops.h"
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

/* One backward's slabs: widened from the 16-bit gradient when backward opens them,
 * rounded back (and told to on_slab_ready) when it closes them. */
typedef struct {
    const gpt_shape *shape;
    precision gp;
    void *grads;
    gpt_slab_ready_fn on_slab_ready;
    void *ctx;
} slab_walk;

static void *slab_of(const slab_walk *w, int slab) {
    return precision_at(w->gp, w->grads, gpt_slab_offset(w->shape, slab));
}

static float *open_slab(void *arg, int slab) {
    const slab_walk *w = arg;
    return grads16_slab_widen(w->gp, slab_of(w, slab), gpt_slab_numel(w->shape, slab));
}

static void close_slab(void *arg, int slab, float *work) {
    const slab_walk *w = arg;
    grads16_slab_round(w->gp, slab_of(w, slab), work, gpt_slab_numel(w->shape, slab));
    if (w->on_slab_ready) w->on_slab_ready(w->ctx, slab);
}

void gpt_backward_grads16(gpt_model *m, const void *params, precision gp, void *grads,
                          float dloss, gpt_slab_ready_fn on_slab_ready, void *ctx) {
    slab_walk w = {.shape = gpt_model_shape(m), .gp = gp, .grads = grads,
                   .on_slab_ready = on_slab_ready, .ctx = ctx};
    gpt_backward_by_slab(m, params, dloss, open_slab, close_slab, &w);
}

void grads16_widen_unscaled(precision gp, float *dst, const void *grads16, float unscale,
                            size_t n) {
    mixed_widen(gp, dst, grads16, n);
    if (unscale != 1.0f) vec_scale(dst, unscale, n);
}
