#include "replica.h"

#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "device.h"
#include "grads16.h"
#include "ops.h"
#include "ops_mixed.h"

static float *device_floats(mem_tag tag, size_t n) {
    return mem_alloc_on(MEM_DEVICE, tag, n * sizeof(float));
}

void replica_init(replica *r, const gpt_shape *s, uint64_t seed, int with_optimizer) {
    memset(r, 0, sizeof *r);
    r->shape = *s;
    r->num_params = gpt_num_params(s);
    r->params = device_floats(MEM_PARAMS, r->num_params);
    r->grads = device_floats(MEM_GRADS, r->num_params);
    if (with_optimizer) {
        r->adam_m = device_floats(MEM_OPTIMIZER, r->num_params);
        r->adam_v = device_floats(MEM_OPTIMIZER, r->num_params);
    }
    float *host = malloc(r->num_params * sizeof(float));
    gpt_init_params(s, seed, 0, r->num_params, host);
    ops_upload(r->params, host, r->num_params * sizeof(float));
    free(host);
    r->compute = r->params;
}

void replica_set_precision(replica *r, precision p) {
    r->precision = p;
    if (p == PRECISION_FP32) return;
    /* the masters are optimizer state now; the 16-bit copy is what the model holds */
    float *master = device_floats(MEM_OPTIMIZER, r->num_params);
    vec_copy(master, r->params, r->num_params);
    mem_free(r->params);
    r->params = master;
    r->compute = mem_alloc_on(MEM_DEVICE, MEM_PARAMS, r->num_params * precision_bytes(p));
}

const void *replica_compute_params(replica *r) {
    if (r->precision != PRECISION_FP32 && !r->compute_current)   /* else AdamW wrote it */
        mixed_round(r->precision, r->compute, r->params, r->num_params);
    r->compute_current = 1;
    return r->compute;
}

void replica_set_grad_precision(replica *r, precision gp) {
    r->grad_precision = gp;
    if (gp == PRECISION_FP32) return;
    mem_free(r->grads);   /* AdamW widens the 16-bit ones as it reads them */
    r->grads = NULL;
    r->grads16 = mem_alloc_on(MEM_DEVICE, MEM_GRADS, r->num_params * precision_bytes(gp));
    r->grads16_unscale = 1.0f;
}

void replica_grads_zero(replica *r) {
    if (r->grads16) mixed_vec_zero(r->grad_precision, r->grads16, r->num_params);
    else vec_zero(r->grads, r->num_params);
}

void replica_backward(replica *r, gpt_model *m, const void *weights, float dloss,
                      gpt_slab_ready_fn on_slab_ready, void *ctx) {
    if (r->grads16)
        gpt_backward_grads16(m, weights, r->grad_precision, r->grads16, dloss, on_slab_ready,
                             ctx);
    else
        gpt_backward(m, weights, r->grads, dloss, on_slab_ready, ctx);
}

void replica_free(replica *r) {
    if (r->compute != r->params) mem_free(r->compute);
    mem_free(r->params);
    mem_free(r->grads);
    mem_free(r->grads16);
    mem_free(r->adam_m);
    mem_free(r->adam_v);
    memset(r, 0, sizeof *r);
}

void replica_checkpoint_state(replica *r, int writes, ckpt_state *out) {
    memset(out, 0, sizeof *out);
    out->parts[0] = (ckpt_part){.shape = r->shape, .params = r->params, .adam_m = r->adam_m,
                                .adam_v = r->adam_v, .writes = writes};
    out->count = 1;
    out->adam_steps[0] = &r->adam_step;
}

int replica_optimizer_grads(replica *r, grad_vector *vectors) {
    vectors[0] = r->grads16 ? grad_vector_16(r->grad_precision, r->grads16, r->num_params,
                                             &r->grads16_unscale)
                            : grad_vector_fp32(r->grads, r->num_params);
    return 1;
}

void replica_download_grads(const replica *r, float *host) {
    if (!r->grads16) {
        ops_download(host, r->grads, r->num_params * sizeof(float));
        return;
    }
    if (device_current() == DEVICE_CPU) {   /* device memory is host memory */
        grads16_widen_unscaled(r->grad_precision, host, r->grads16, r->grads16_unscale,
                               r->num_params);
        return;
    }
    /* a GPU's: widened there (its kernels cannot write host memory), then downloaded */
    const size_t bytes = r->num_params * sizeof(float);
    float *wide = mem_alloc_on(MEM_DEVICE, MEM_OTHER, bytes);
    grads16_widen_unscaled(r->grad_precision, wide, r->grads16, r->grads16_unscale,
                           r->num_params);
    ops_download(host, wide, bytes);
    mem_free(wide);
}

void replica_adamw(replica *r, const adamw_config *cfg) {
    r->adam_step++;
    const precision gp = r->grads16 ? r->grad_precision : PRECISION_FP32;
    const void *grads = r->grads16 ? r->grads16 : (const void *)r->grads;
    const float scale = r->grads16 ? r->grads16_unscale : 1.0f;
    if (r->precision != PRECISION_FP32)
        mixed_adamw_update_round(gp, r->params, grads, scale, r->adam_m, r->adam_v,
                                 r->num_params, cfg, r->adam_step, r->precision, r->compute);
    else
        mixed_adamw_update(gp, r->params, grads, scale, r->adam_m, r->adam_v, r->num_params,
                           cfg, r->adam_step);
    r->compute_current = r->precision != PRECISION_FP32;
    if (r->grads16) r->grads16_unscale = 1.0f;
    if (r->masters_in_16_bits && r->precision != PRECISION_FP32)   /* compute: rounded */
        mixed_widen(r->precision, r->params, r->compute, r->num_params);
}

void load_batch(gpt_model *m, const dataset *d, const run_config *cfg, int step,
                int first, int count) {
    const int T = cfg->model.ctx;
    int *tokens = gpt_host_batch(m);   /* the model's own staging: no allocation per step */
    dataset_batch(d, cfg->seed, step, first, count, T, tokens, tokens + count * T);
    gpt_set_batch(m, tokens, tokens + count * T);
}
