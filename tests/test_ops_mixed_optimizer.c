/* The optimizer's 16-bit ops (ops_mixed.h, ops_mixed_optimizer.c), each against what it
 * replaces, bit for bit, on sizes that cross its chunks (2.5 chunks and an odd tail):
 * mixed_adamw_update against widening the whole gradient, vec_scale and adamw_update
 * (three steps, the second still in the warm-up's ramp); mixed_adamw_update_round's
 * 16-bit copy against mixed_round of its fp32 result, on three lengths (2.5 chunks and an
 * odd tail, one element short of a chunk, one past it), with a copy written before the
 * update seen to fail; mixed_round_in_place against
 * mixed_round into a separate buffer; mixed_vec_finite against an inf or NaN in the last
 * chunk and the middle one. Each holds one chunk of scratch (64 KiB), not the vector's
 * 2.5: the scratch is outside the accounting allocator's tags, so a whole-vector copy
 * there would hide from every peak. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_run.h"
#include "ops_mixed_internal.h"
#include "ops.h"
#include "ops_mixed.h"
#include "precision.h"
#include "rng.h"

enum { N = 2 * 16384 + 8192 + 3 };

static float *random_floats(uint64_t seed, double lo, double hi) {
    float *x = malloc(N * sizeof(float));
    ck_assert_ptr_nonnull(x);
    for (size_t i = 0; i < N; i++) x[i] = (float)(lo + (hi - lo) * rng_uniform(seed, 0, i));
    return x;
}

/* The thread's scratch is at most one chunk. */
static void scratch_is_one_chunk(const char *what) {
    const size_t bytes = ops_mixed_scratch_bytes();
    ck_assert_msg(bytes <= MIXED_CHUNK_FLOATS * sizeof(float), "%s: %zu B of scratch for a"
                  " vector of %d elements", what, bytes, N);
}

static float *copy_of(const float *x) { return memcpy(malloc(N * sizeof(float)), x, N * sizeof(float)); }

static void same_bits(const char *what, precision p, const float *got, const float *want) {
    if (memcmp(got, want, N * sizeof(float)) == 0) return;   /* else: the first that differs */
    for (size_t i = 0; i < N; i++)
        ck_assert_msg(memcmp(&got[i], &want[i], sizeof(float)) == 0,
                      "%s (%s): element %zu is %a, the reference %a", what, precision_name(p),
                      i, (double)got[i], (double)want[i]);
}

/* Three AdamW steps each way from the same state, with the gradient scaled by `scale`. */
static void check_adamw(precision p, float scale) {
    const adamw_config cfg = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                              .weight_decay = 0.1f, .warmup_steps = 3};
    float *g32 = random_floats(1, -1e3, 1e3);   /* like a scaled fp16 gradient */
    uint16_t *g16 = malloc(N * sizeof(uint16_t));
    const void *grads = g16;
    if (p == PRECISION_FP32) {
        grads = copy_of(g32);
    } else {
        precision_to16(p, g16, g32, N);
        precision_from16(p, g32, g16, N);
    }
    float *params = random_floats(2, -1, 1), *m = random_floats(3, -1e-2, 1e-2);
    float *v = random_floats(4, 0, 1e-3);
    float *want_params = copy_of(params), *want_m = copy_of(m), *want_v = copy_of(v);
    vec_scale(g32, scale, N);   /* the whole widened gradient, unscaled in place */
    for (int step = 1; step <= 3; step++) {
        mixed_adamw_update(p, params, grads, scale, m, v, N, &cfg, step);
        adamw_update(want_params, g32, want_m, want_v, N, &cfg, step);
    }
    same_bits("adamw params", p, params, want_params);
    same_bits("adamw m", p, m, want_m);
    same_bits("adamw v", p, v, want_v);
    scratch_is_one_chunk("mixed_adamw_update");
    printf("  mixed_adamw_update %s, scale %g: the whole-vector update's bits\n",
           precision_name(p), (double)scale);
    if (grads != g16) free((void *)grads);
    free(g32), free(g16), free(params), free(m), free(v);
    free(want_params), free(want_m), free(want_v);
}

START_TEST(adamw_streams_the_whole_vectors_bits) {
    for (int p = 0; p < PRECISION_COUNT; p++) {
        check_adamw((precision)p, 1.0f);
        check_adamw((precision)p, 0x1p-16f);
    }
}
END_TEST

/* The fused pass against the update followed by mixed_round, on n <= N elements: the
 * masters, m and v bit for bit, and the 16-bit copy byte for byte. before: the
 * negative control, the copy rounded from the masters before the update (what a pass
 * that writes it too early would hold); returns whether every byte matched. */
static int adamw_round_matches(precision gp, precision cp, float scale, size_t n, int before) {
    const adamw_config cfg = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                              .weight_decay = 0.1f, .warmup_steps = 2};
    float *g32 = random_floats(7, -1e3, 1e3);
    uint16_t *g16 = malloc(N * sizeof(uint16_t));
    if (gp != PRECISION_FP32) precision_to16(gp, g16, g32, N);
    const void *grads = gp == PRECISION_FP32 ? (const void *)g32 : g16;
    float *params = random_floats(8, -1, 1), *m = random_floats(9, -1e-2, 1e-2);
    float *v = random_floats(10, 0, 1e-3);
    float *want_params = copy_of(params), *want_m = copy_of(m), *want_v = copy_of(v);
    uint16_t *got = calloc(N, sizeof(uint16_t)), *want = calloc(N, sizeof(uint16_t));
    for (int step = 1; step <= 2; step++) {
        mixed_adamw_update_round(gp, params, grads, scale, m, v, n, &cfg, step, cp, got);
        if (before) mixed_round(cp, want, want_params, n);
        mixed_adamw_update(gp, want_params, grads, scale, want_m, want_v, n, &cfg, step);
        if (!before) mixed_round(cp, want, want_params, n);
    }
    same_bits("adamw_round params", cp, params, want_params);
    same_bits("adamw_round m", cp, m, want_m);
    same_bits("adamw_round v", cp, v, want_v);
    scratch_is_one_chunk("mixed_adamw_update_round");
    size_t differ = 0;
    double largest = 0;
    for (size_t i = 0; i < N; i++) {
        float a, b;
        precision_from16(cp, &a, &got[i], 1);
        precision_from16(cp, &b, &want[i], 1);
        differ += got[i] != want[i];
        largest = fmax(largest, fabs((double)a - (double)b));
    }
    if (!before)
        printf("  mixed_adamw_update_round %s gradients -> %s copy, scale %g, %zu elements:"
               " %zu values differ from rounding the update, by at most %g\n",
               precision_name(gp), precision_name(cp), (double)scale, n, differ, largest);
    else
        printf("  (negative control, %s: %zu values differ, by at most %g)\n",
               precision_name(cp), differ, largest);
    free(g32), free(g16), free(params), free(m), free(v), free(got), free(want);
    free(want_params), free(want_m), free(want_v);
    return differ == 0;
}

START_TEST(adamw_round_writes_the_rounded_update) {
    const size_t lengths[] = {N, MIXED_CHUNK_FLOATS - 1, MIXED_CHUNK_FLOATS + 1};
    for (int cp = PRECISION_BF16; cp < PRECISION_COUNT; cp++)
        for (size_t k = 0; k < sizeof lengths / sizeof lengths[0]; k++) {
            /* fp32 gradients (fp32 at scale 1: no widening), then 16-bit ones unscaled */
            ck_assert(adamw_round_matches(PRECISION_FP32, (precision)cp, 1.0f, lengths[k], 0));
            ck_assert(adamw_round_matches(PRECISION_FP32, (precision)cp, 0.5f, lengths[k], 0));
            ck_assert(adamw_round_matches((precision)cp, (precision)cp, 0x1p-10f, lengths[k], 0));
        }
}
END_TEST

/* The negative control: a copy made from the masters before the update differs. */
START_TEST(adamw_round_before_the_update_is_seen) {
    for (int cp = PRECISION_BF16; cp < PRECISION_COUNT; cp++) {
        ck_assert_msg(!adamw_round_matches((precision)cp, (precision)cp, 1.0f, N, 1),
                      "%s: a copy rounded before the update passed",
                      precision_name((precision)cp));
        printf("  mixed_adamw_update_round %s: a copy rounded before the update is seen\n",
               precision_name((precision)cp));
    }
}
END_TEST

START_TEST(round_in_place_writes_what_round_writes) {
    for (int p = PRECISION_BF16; p < PRECISION_COUNT; p++) {
        float *x = random_floats(5, -10, 10);
        uint16_t *want = malloc(N * sizeof(uint16_t));
        mixed_round((precision)p, want, x, N);
        const void *got = mixed_round_in_place((precision)p, x, N);
        ck_assert_ptr_eq(got, x);
        scratch_is_one_chunk("mixed_round_in_place");
        ck_assert_msg(memcmp(got, want, N * sizeof(uint16_t)) == 0, "%s: rounded in place"
                      " differs from mixed_round", precision_name((precision)p));
        printf("  mixed_round_in_place %s: mixed_round's bits\n", precision_name((precision)p));
        free(x), free(want);
    }
}
END_TEST

START_TEST(finite_sees_inf_and_nan_in_any_chunk) {
    const size_t at[] = {N - 1, 16384 + 5};
    for (int p = 0; p < PRECISION_COUNT; p++) {
        float *x = random_floats(6, -1e4, 1e4);
        void *xp = x;
        uint16_t *x16 = malloc(N * sizeof(uint16_t));
        if (p != PRECISION_FP32) precision_to16((precision)p, x16, x, N), xp = x16;
        ck_assert(mixed_vec_finite((precision)p, xp, N));
        scratch_is_one_chunk("mixed_vec_finite");
        for (int k = 0; k < 2; k++) {
            const float bad = k == 0 ? INFINITY : NAN;
            if (p == PRECISION_FP32) x[at[k]] = bad;
            else precision_to16((precision)p, x16 + at[k], &bad, 1);
            ck_assert_msg(!mixed_vec_finite((precision)p, xp, N), "%s: %s at %zu not seen",
                          precision_name((precision)p), k == 0 ? "inf" : "NaN", at[k]);
        }
        free(x), free(x16);
    }
}
END_TEST

int main(void) {
    Suite *s = suite_create("the optimizer's 16-bit ops");
    TCase *t = tcase_create("bits");
    tcase_add_test(t, adamw_streams_the_whole_vectors_bits);
    tcase_add_test(t, adamw_round_writes_the_rounded_update);
    tcase_add_test(t, adamw_round_before_the_update_is_seen);
    tcase_add_test(t, round_in_place_writes_what_round_writes);
    tcase_add_test(t, finite_sees_inf_and_nan_in_any_chunk);
    suite_add_tcase(s, t);
    return check_run(s, 0);
}
