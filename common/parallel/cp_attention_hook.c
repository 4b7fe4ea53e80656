/* The CP group's attention in the model's blocks, each layer's saved state kept here
 * (cp_attention_hook.h). */
#include "cp_attention_hook.h"

#include "alloc.h"

struct cp_attention_hook {
    gpt_attention_hook hook;   /* its ctx: this struct */
    cp_attention *attention;
    int layers;
    float **saved;             /* [layers]: cp_attention_saved_numel floats each */
};

static void hook_forward(void *ctx, int layer, float *atty, const float *qkv) {
    cp_attention_hook *h = ctx;
    cp_attention_forward(h->attention, atty, h->saved[layer], qkv);   /* the only talk */
}

static void hook_backward(void *ctx, int layer, float *d_qkv, const float *d_atty,
                          const float *qkv, const float *atty) {
    cp_attention_hook *h = ctx;
    cp_attention_backward(h->attention, d_qkv, d_atty, qkv, atty, h->saved[layer]);
}

cp_attention_hook *cp_attention_hook_create(cp_attention *attention, int layers) {
    cp_attention_hook *h = mem_alloc(MEM_OTHER, sizeof *h);
    *h = (cp_attention_hook){.attention = attention, .layers = layers};
    h->hook = (gpt_attention_hook){.ctx = h, .forward = hook_forward,
                                   .backward = hook_backward};
    h->saved = mem_alloc(MEM_OTHER, (size_t)layers * sizeof *h->saved);
    const size_t numel = cp_attention_saved_numel(attention);
    for (int l = 0; l < layers; l++)
        h->saved[l] = mem_alloc(MEM_ACTIVATIONS, numel * sizeof(float));
    return h;
}

void cp_attention_hook_free(cp_attention_hook *h) {
    if (!h) return;
    for (int l = 0; l < h->layers; l++) mem_free(h->saved[l]);
    mem_free(h->saved);
    mem_free(h);
}

const gpt_attention_hook *cp_attention_hook_of(const cp_attention_hook *h) {
    return &h->hook;
}
