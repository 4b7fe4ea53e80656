/* The CP group's attention in the model's blocks, each (slot, layer)'s saved state kept
 * here (cp_attention_hook.h). */
#include "cp_attention_hook.h"

#include <string.h>

#include "alloc.h"
#include "ops_mixed.h"

struct cp_attention_hook {
    gpt_attention_hook hook;   /* its ctx: this struct */
    cp_attention *attention;
    int layers, slots;
    float **saved;             /* [slots x layers]: cp_attention_saved_numel floats each,
                                  allocated at the (slot, layer)'s first forward */
    /* 16 bits: the fp32 widenings the attention computes on, allocated at first use */
    float *qkv32, *out32, *dout32, *dqkv32;   /* [N, 3C], [N, C], [N, C], [N, 3C] */
};

/* The saved state of (slot, layer), the slot table grown to hold slot if it is new. */
static float *saved_of(cp_attention_hook *h, int slot, int layer) {
    if (slot >= h->slots) {
        const size_t had = (size_t)h->slots * h->layers, now = (size_t)(slot + 1) * h->layers;
        float **grown = mem_alloc(MEM_OTHER, now * sizeof *grown);
        if (had) memcpy(grown, h->saved, had * sizeof *grown);
        memset(grown + had, 0, (now - had) * sizeof *grown);
        mem_free(h->saved);
        h->saved = grown;
        h->slots = slot + 1;
    }
    float **s = &h->saved[(size_t)slot * h->layers + layer];
    if (!*s) *s = mem_alloc(MEM_ACTIVATIONS, cp_attention_saved_numel(h->attention) * 4);
    return *s;
}

/* The fp32 buffers a 16-bit model's activations are widened into. */
static void ensure_widenings(cp_attention_hook *h) {
    if (h->qkv32) return;
    const size_t N = cp_attention_rows(h->attention), C = cp_attention_channels(h->attention);
    h->qkv32 = mem_alloc(MEM_ACTIVATIONS, N * 3 * C * sizeof(float));
    h->out32 = mem_alloc(MEM_ACTIVATIONS, N * C * sizeof(float));
    h->dout32 = mem_alloc(MEM_ACTIVATIONS, N * C * sizeof(float));
    h->dqkv32 = mem_alloc(MEM_ACTIVATIONS, N * 3 * C * sizeof(float));
}

/* In 16 bits the attention works on the widened (exact) values in fp32, its scores,
 * softmax and sums as the 16-bit attention op computes them (ops_mixed.h), and its
 * output is rounded once. */
static void hook_forward(void *ctx, int slot, int layer, precision p, void *atty,
                         const void *qkv) {
    cp_attention_hook *h = ctx;
    float *saved = saved_of(h, slot, layer);
    if (p == PRECISION_FP32) {
        cp_attention_forward(h->attention, atty, saved, qkv);   /* the only talk */
        return;
    }
    ensure_widenings(h);
    const size_t N = cp_attention_rows(h->attention), C = cp_attention_channels(h->attention);
    mixed_widen(p, h->qkv32, qkv, N * 3 * C);
    cp_attention_forward(h->attention, h->out32, saved, h->qkv32);
    mixed_round(p, atty, h->out32, N * C);
}

static void hook_backward(void *ctx, int slot, int layer, precision p, void *d_qkv,
                          const void *d_atty, const void *qkv, const void *atty) {
    cp_attention_hook *h = ctx;
    const float *saved = saved_of(h, slot, layer);
    if (p == PRECISION_FP32) {
        cp_attention_backward(h->attention, d_qkv, d_atty, qkv, atty, saved);
        return;
    }
    ensure_widenings(h);
    const size_t N = cp_attention_rows(h->attention), C = cp_attention_channels(h->attention);
    mixed_widen(p, h->qkv32, qkv, N * 3 * C);
    mixed_widen(p, h->out32, atty, N * C);
    mixed_widen(p, h->dout32, d_atty, N * C);
    cp_attention_backward(h->attention, h->dqkv32, h->dout32, h->qkv32, h->out32, saved);
    mixed_round(p, d_qkv, h->dqkv32, N * 3 * C);
}

cp_attention_hook *cp_attention_hook_create(cp_attention *attention, int layers) {
    cp_attention_hook *h = mem_alloc(MEM_OTHER, sizeof *h);
    *h = (cp_attention_hook){.attention = attention, .layers = layers};
    h->hook = (gpt_attention_hook){.ctx = h, .forward = hook_forward,
                                   .backward = hook_backward};
    return h;
}

void cp_attention_hook_free(cp_attention_hook *h) {
    if (!h) return;
    for (size_t i = 0; i < (size_t)h->slots * h->layers; i++) mem_free(h->saved[i]);
    void *rest[] = {h->saved, h->qkv32, h->out32, h->dout32, h->dqkv32};
    for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++) mem_free(rest[i]);
    mem_free(h);
}

const gpt_attention_hook *cp_attention_hook_of(const cp_attention_hook *h) {
    return &h->hook;
}
