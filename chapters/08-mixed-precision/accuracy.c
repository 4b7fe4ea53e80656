/* Part 4: accuracy. Loss curves of fp32, bf16, fp16 with its loss scale and fp16
 * without one on one rank; the largest parameter difference from fp32; what fp16
 * without a scale loses to underflow (one step of many tokens); the loss scale over
 * time; and the sum that goes wrong in a bf16 accumulator. */
#include "mixed.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "baseline.h"
#include "floats.h"
#include "loss_scale.h"

const precision_case accuracy_cases[ACCURACY_CASES] = {
    {"fp32", PRECISION_FP32, PRECISION_FP32, 0},
    {"bf16", PRECISION_BF16, PRECISION_FP32, 0},
    {"fp16 + loss scale", PRECISION_FP16, PRECISION_FP32, 0},
    {"fp16, no scale", PRECISION_FP16, PRECISION_FP32, 1},
};
enum { FP16_SCALED = 2, FP16_UNSCALED = 3 };

/* Steps whose gradients overflowed: the scale backed off after them. */
static void count_skips(const run_config *cfg, accuracy_report *r) {
    r->skipped_after_warmup = 0;
    for (int i = 0; i < r->steps; i++) {
        const float after = i + 1 < r->steps ? r->loss_scale[i + 1] : (float)r->final_scale;
        if (after < r->loss_scale[i] && i + 1 > cfg->adamw.warmup_steps)
            r->skipped_after_warmup++;
    }
}

static void curves(const run_config *cfg, const dataset *data, accuracy_report *r) {
    baseline_run *runs[ACCURACY_CASES];
    r->steps = cfg->steps;
    r->loss_scale = calloc((size_t)r->steps, sizeof(float));
    if (!r->loss_scale) abort();
    for (int i = 0; i < ACCURACY_CASES; i++) {
        run_config rc = mixed_case_config(cfg, &accuracy_cases[i], cfg->steps);
        if (i == FP16_SCALED) rc.loss_scale_trace = r->loss_scale;
        runs[i] = baseline_train(&rc, data);
        r->loss[i] = malloc((size_t)r->steps * sizeof(float));
        if (!r->loss[i]) abort();
        memcpy(r->loss[i], runs[i]->loss, (size_t)r->steps * sizeof(float));
        r->skipped[i] = runs[i]->result.skipped_steps;
        if (i == FP16_SCALED) r->final_scale = runs[i]->result.loss_scale;
    }
    for (int i = 0; i < ACCURACY_CASES; i++)
        r->max_param_diff[i] =
            max_abs_diff(runs[i]->final_params, runs[0]->final_params, runs[0]->num_params);
    for (int i = 0; i < ACCURACY_CASES; i++) baseline_free(runs[i]);
    count_skips(cfg, r);
}

/* One step of probe_batch sequences in each case: each token's share of d(mean loss)
 * is 1/tokens, so with many tokens fp16's backward values fall below its range. */
static void underflow_probe(const run_config *cfg, const dataset *data, int probe_batch,
                            accuracy_report *r) {
    baseline_run *runs[ACCURACY_CASES];
    r->probe_tokens = probe_batch * cfg->model.ctx;
    for (int i = 0; i < ACCURACY_CASES; i++) {
        run_config rc = mixed_case_config(cfg, &accuracy_cases[i], 1);
        rc.batch = probe_batch;
        runs[i] = baseline_train(&rc, data);
    }
    const float *g32 = runs[0]->first_grads;
    const size_t n = runs[0]->num_params;
    for (int i = 0; i < ACCURACY_CASES; i++) {
        double zeroed;
        r->grad_error[i] = relative_l2_diff(runs[i]->first_grads, g32, n, &zeroed);
        if (i == FP16_UNSCALED) r->lost_to_zero = zeroed;
    }
    r->flush_unscaled = fp16_flush_share(g32, n, 1);
    r->flush_scaled = fp16_flush_share(g32, n, loss_scale_defaults(PRECISION_FP16).init_scale);
    for (int i = 0; i < ACCURACY_CASES; i++) baseline_free(runs[i]);
}

void accuracy_bf16_sum(accuracy_report *r) {
    r->sum_terms = 10000;
    r->sum_term = 0.01;
    const float term = 0.01f;
    uint16_t acc16 = 0, term16;
    precision_f32_to_bf16(&term16, &term, 1);
    float term_in_bf16, acc = 0, wide = 0;
    precision_bf16_to_f32(&term_in_bf16, &term16, 1);
    for (int i = 0; i < r->sum_terms; i++) {
        float sum;
        precision_bf16_to_f32(&sum, &acc16, 1);
        sum += term_in_bf16;   /* exact in fp32, then rounded back to the accumulator */
        precision_f32_to_bf16(&acc16, &sum, 1);
        acc += term;
        wide += term_in_bf16;
    }
    float bf16_sum;
    precision_bf16_to_f32(&bf16_sum, &acc16, 1);
    r->sum_bf16 = bf16_sum;
    r->sum_fp32 = acc;
    r->sum_bf16_inputs_fp32 = wide;
}

void accuracy_local(const run_config *cfg, const dataset *data, int probe_batch,
                    accuracy_report *r) {
    curves(cfg, data, r);
    underflow_probe(cfg, data, probe_batch, r);
    accuracy_bf16_sum(r);
}

void accuracy_free(accuracy_report *r) {
    for (int i = 0; i < ACCURACY_CASES; i++) free(r->loss[i]);
    free(r->loss_scale);
    memset(r, 0, sizeof *r);
}
