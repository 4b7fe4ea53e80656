/* The 16-bit gradients' side of the optimizer (ops_mixed.h): each reads a chunk at a
 * time through the thread's scratch, so no fp32 copy of a vector is ever held. */
#include "ops_mixed.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "ops_cpu.h"
#include "ops_mixed_internal.h"
#include "ops_mixed_table.h"
#include "device.h"

#define CHUNK MIXED_CHUNK_FLOATS

static size_t chunk_len(size_t n, size_t i) { return n - i < CHUNK ? n - i : CHUNK; }

/* Bytes of n elements of p, for the traffic an op reports. */
static double bytes_of(precision p, double n) { return n * (double)precision_bytes(p); }

/* Each chunk widened and summed in double, as grads_finite sums an fp32 vector: inf or
 * NaN makes the sum so, while no chunk of finite values can overflow a double. */
int mixed_vec_finite(precision p, const void *x, size_t n) {
    if (p == PRECISION_FP32) return isfinite(vec_sum(x, n));
    const int w = mixed_begin(OP_VECTOR, bytes_of(p, n));
    const mixed_ops_table *gpu = device_mixed_ops();
    if (gpu) {
        const int on_gpu = gpu->vec_finite(p, x, n);
        mixed_end(w, OP_VECTOR);
        return on_gpu;
    }
    float *xs = mixed_scratch(CHUNK);
    int finite = 1;
    for (size_t i = 0; i < n && finite; i += CHUNK) {
        const size_t len = chunk_len(n, i);
        precision_from16(p, xs, precision_at(p, x, i), len);
        finite = isfinite(cpu_vec_sum(xs, len));
    }
    mixed_end(w, OP_VECTOR);
    return finite;
}

/* AdamW a chunk at a time: the gradient widened and scaled in the scratch g where it is
 * not fp32 at scale 1, then the update; compute (of cp, NULL: none) takes the updated
 * chunk rounded while it is still in cache. AdamW and the rounding are element by
 * element, so this is bit for bit widening the whole vector, updating it whole and
 * rounding it whole. */
static void adamw_chunks(precision gp, float *params, const void *grads, float grad_scale,
                         float *m, float *v, size_t n, const adamw_config *scheduled,
                         int step, precision cp, void *compute) {
    float *g = mixed_scratch(CHUNK);
    for (size_t i = 0; i < n; i += CHUNK) {
        const size_t len = chunk_len(n, i);
        const float *gi = g;
        if (gp == PRECISION_FP32 && grad_scale == 1.0f) gi = (const float *)grads + i;
        else if (gp == PRECISION_FP32) memcpy(g, (const float *)grads + i, len * sizeof(float));
        else precision_from16(gp, g, precision_at(gp, grads, i), len);
        if (grad_scale != 1.0f) cpu_vec_scale(g, grad_scale, len);
        cpu_adamw_update(params + i, gi, m + i, v + i, len, scheduled, step);
        if (compute) precision_to16(cp, precision_at(cp, compute, i), params + i, len);
    }
}

void mixed_adamw_update(precision p, float *params, const void *grads, float grad_scale,
                        float *m, float *v, size_t n, const adamw_config *cfg, int step) {
    if (p == PRECISION_FP32 && grad_scale == 1.0f) {
        adamw_update(params, grads, m, v, n, cfg, step);
        return;
    }
    const int w = mixed_begin(OP_ADAMW, 4.0 * 6.0 * n + bytes_of(p, n));
    const adamw_config scheduled = adamw_scheduled(cfg, step);
    MIXED_ON_GPU(w, OP_ADAMW, adamw_update, p, params, grads, grad_scale, m, v, n, &scheduled,
                 step);
    adamw_chunks(p, params, grads, grad_scale, m, v, n, &scheduled, step, PRECISION_FP32, NULL);
    mixed_end(w, OP_ADAMW);
}

void mixed_adamw_update_round(precision gp, float *params, const void *grads,
                              float grad_scale, float *m, float *v, size_t n,
                              const adamw_config *cfg, int step, precision cp, void *compute) {
    if (cp == PRECISION_FP32 || device_mixed_ops()) {   /* the GPU: two passes, as before */
        mixed_adamw_update(gp, params, grads, grad_scale, m, v, n, cfg, step);
        mixed_round(cp, compute, params, n);
        return;
    }
    const int w = mixed_begin(OP_ADAMW, 4.0 * 6.0 * n + bytes_of(gp, n) + bytes_of(cp, n));
    const adamw_config scheduled = adamw_scheduled(cfg, step);
    adamw_chunks(gp, params, grads, grad_scale, m, v, n, &scheduled, step, cp, compute);
    mixed_end(w, OP_ADAMW);
}

/* Chunk by chunk through the scratch: chunk [i, i + len) lands in bytes [2i, 2i + 2len)
 * of x, below the fp32 values not yet read (from byte 4(i + len) on). */
void *mixed_round_in_place(precision p, float *x, size_t n) {
    if (p == PRECISION_FP32) return x;
    const int w = mixed_begin(OP_VECTOR, 4.0 * n + bytes_of(p, n));
    const mixed_ops_table *gpu = device_mixed_ops();
    if (gpu) {
        gpu->round_in_place(p, x, n);
        mixed_end(w, OP_VECTOR);
        return x;
    }
    uint16_t *rounded = (uint16_t *)mixed_scratch(CHUNK);
    for (size_t i = 0; i < n; i += CHUNK) {
        const size_t len = chunk_len(n, i);
        precision_to16(p, rounded, x + i, len);
        memcpy(precision_at(p, x, i), rounded, len * sizeof(uint16_t));
    }
    mixed_end(w, OP_VECTOR);
    return x;
}
