/* Part 6d: delayed scaling when the amax jumps. Transformer Engine's delayed recipe
 * scales this step's tensor from the amax of past steps, known before the tensor is;
 * when one step's activations jump past that history they saturate at the format's max.
 * Current scaling (the tensor's own amax) does not, and a margin (a scale 2^margin
 * smaller, headroom above the history) absorbs a jump up to 2^margin, at the price of
 * using less of the grid every step. One product (fc2 of the last block) over
 * FP8_SPIKE_STEPS batches, the activations multiplied by FP8_SPIKE_FACTOR at one of them;
 * the weight is scaled currently in all three (it does not jump). */
#include "mixed.h"

#include <stdlib.h>

/* The delayed states first see FP8_HISTORY batches (their history), then the measured
 * ones, after (b)'s batches. */
#define FIRST_STEP (FP8_TRAIN_STEPS + FP8_HISTORY + 1)

static float amax_of(const float *x, int M, int K) {
    float a;
    fp8_block_amax(x, M, K, M, K, &a);
    return a;
}

/* The three runs' errors at one step: current, delayed with margins 0 and 4. */
static void step_errors(const float *x, const fp8_matrix *qw, const float *ref, int M, int K,
                        fp8_delayed delayed[2], double error[FP8_SPIKE_RUNS]) {
    fp8_matrix qx = fp8_matrix_make(FP8_E4M3, M, K, M, K);
    fp8_quantize(&qx, x);
    error[0] = fp8_product_error(&qx, qw, ref);
    for (int d = 0; d < 2; d++) {
        fp8_quantize_delayed(&qx, x, &delayed[d]);
        error[1 + d] = fp8_product_error(&qx, qw, ref);
    }
    fp8_matrix_free(&qx);
}

void fp8_spike(const fp8_source *src, const float *w, fp8_report *r) {
    const int M = r->M, N = r->N, K = r->K;
    const size_t n = (size_t)M * K;
    float *x = malloc(n * sizeof(float)), *ref = malloc((size_t)M * N * sizeof(float));
    if (!x || !ref) abort();
    fp8_delayed delayed[2];
    if (fp8_delayed_init(&delayed[0], FP8_HISTORY, 0) ||
        fp8_delayed_init(&delayed[1], FP8_HISTORY, FP8_SPIKE_MARGIN))
        abort();
    for (int s = 0; s < FP8_HISTORY; s++) {   /* the history before */
        fp8_activations_at(src, FIRST_STEP - FP8_HISTORY + s, x);
        const float a = amax_of(x, M, K);
        for (int d = 0; d < 2; d++) fp8_delayed_record(&delayed[d], a);
    }
    fp8_matrix qw = fp8_matrix_make(FP8_E4M3, N, K, N, K);
    fp8_quantize(&qw, w);
    for (int s = 0; s < FP8_SPIKE_STEPS; s++) {
        fp8_activations_at(src, FIRST_STEP + s, x);
        if (s == FP8_SPIKE_AT)
            for (size_t i = 0; i < n; i++) x[i] *= FP8_SPIKE_FACTOR;
        r->spike_amax[s] = amax_of(x, M, K);
        fp8_reference(ref, x, w, M, N, K);
        double e[FP8_SPIKE_RUNS];
        step_errors(x, &qw, ref, M, K, delayed, e);
        for (int k = 0; k < FP8_SPIKE_RUNS; k++) r->spike_error[k][s] = e[k];
    }
    fp8_matrix_free(&qw);
    for (int d = 0; d < 2; d++) fp8_delayed_free(&delayed[d]);
    free(x);
    free(ref);
}
