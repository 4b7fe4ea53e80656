/* FP8's hybrid format (--fp8-format hybrid, fp8_linear.h): the linears' backward
 * products on E5M2 output gradients and E4M3 weights and inputs, against a by-hand
 * reference, and DDP equal to the hybrid FP8 baseline; each with a control that fails.
 *
 * Bounds, derived:
 * - the backward products by hand: each operand rounded as the recipe says (scale =
 *   format max / block amax, encode, decode, unscale), the products summed in double.
 *   dinp is rounded to bf16 once: within 1 bf16 ulp (half from the rounding, and the
 *   fp32 sums, ~K 2^-24 relative, may round it the other way), as test_fp8_training's
 *   forward. dweight is the fp32 sum of N products: |diff| <= N 2^-24 sum |terms|.
 *   The same reference with E4M3 for dY must miss by far (E5M2 keeps 2 mantissa
 *   bits): the control that the gradient's format is the one asserted.
 * - delayed: dY's scale from a history of its own, not the activation's (the same
 *   by-hand bound, with dY far below the activations).
 * - DDP against the hybrid baseline: tolerances.h's mixed-precision ones, as
 *   test_fp8_training's; the per-tensor recipes all-reduce dY's amax as the forward's
 *   activations, and without that all-reduce tensorwise DDP must exceed them. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "baseline.h"
#include "check_run.h"
#include "compare.h"
#include "fp8_linear.h"
#include "number_formats.h"
#include "ops_mixed.h"
#include "small_model.h"
#include "strategy_runs.h"
#include "tolerances.h"

enum { N = 8, IC = 40, OC = 24 };

/* values of magnitude in [lo, 4 lo) with random signs, as bf16 */
static void fill(uint16_t *v, size_t n, double lo, unsigned *seed) {
    for (size_t i = 0; i < n; i++) {
        const double m = lo * (1.0 + 3.0 * rand_r(seed) / (double)RAND_MAX);
        v[i] = number_to_bf16((float)(rand_r(seed) & 1 ? m : -m));
    }
}

/* v [rows, cols] rounded by hand to format f, one scale a row (row) or a tensor */
static void by_hand(double *out, const uint16_t *v, int rows, int cols, fp8_format f,
                    int row) {
    double amax = 0;
    for (int i = 0; i < rows * cols; i++) amax = fmax(amax, fabs(number_from_bf16(v[i])));
    for (int i = 0; i < rows; i++) {
        double a = 0;
        for (int k = 0; k < cols && row; k++) a = fmax(a, fabs(number_from_bf16(v[i * cols + k])));
        const double s = fp8_info(f)->max / (row ? a : amax);
        for (int k = 0; k < cols; k++) {
            const float x = (float)(number_from_bf16(v[i * cols + k]) * s);
            out[i * cols + k] = fp8_decode(f, fp8_encode(f, x)) / s;
        }
    }
}

typedef struct { double dinp_ulps, dweight_bounds; } hand_diff;

/* The backward's outputs against the by-hand products, dY rounded to grad_format. */
static hand_diff against_by_hand(int row, fp8_format grad_format, const uint16_t *dinp,
                                 const float *dweight, const uint16_t *dy,
                                 const uint16_t *x, const uint16_t *w) {
    static double g[N * OC], wq[OC * IC], xq[N * IC];
    by_hand(g, dy, N, OC, grad_format, row);
    by_hand(wq, w, OC, IC, FP8_E4M3, row);
    by_hand(xq, x, N, IC, FP8_E4M3, row);
    hand_diff d = {0, 0};
    for (int i = 0; i < N; i++)
        for (int k = 0; k < IC; k++) {   /* dinp [N, IC] = dY W */
            double ref = 0;
            for (int j = 0; j < OC; j++) ref += g[i * OC + j] * wq[j * IC + k];
            const double ulp = ldexp(1.0, ilogb(fmax(fabs(ref), 0x1p-126)) - 7);
            d.dinp_ulps = fmax(d.dinp_ulps, fabs(number_from_bf16(dinp[i * IC + k]) - ref) / ulp);
        }
    for (int j = 0; j < OC; j++)
        for (int k = 0; k < IC; k++) {   /* dweight [OC, IC] = dY^T X */
            double ref = 0, mag = 0;
            for (int i = 0; i < N; i++) {
                ref += g[i * OC + j] * xq[i * IC + k];
                mag += fabs(g[i * OC + j] * xq[i * IC + k]);
            }
            const double bound = N * 0x1p-24 * mag;
            d.dweight_bounds = fmax(d.dweight_bounds, fabs(dweight[j * IC + k] - ref) / bound);
        }
    return d;
}

/* One linear's backward in bf16 with FP8 on under recipe r and format f, as `site`
 * (FP8_NO_SITE: the LM head's, bf16 whatever the format). */
static void backward(fp8_recipe r, fp8_training_format f, int site, uint16_t *dinp,
                     float *dweight, const uint16_t *dy, const uint16_t *x, const uint16_t *w) {
    fp8_linear_format(f);
    fp8_linear_use(&r);
    fp8_linear_site(site);
    memset(dweight, 0, OC * IC * sizeof *dweight);
    mixed_linear_backward(PRECISION_BF16, dinp, dweight, NULL, dy, x, w, N, IC, OC);
    fp8_linear_use(NULL);
    fp8_linear_format(FP8_FORMAT_E4M3);
    fp8_linear_release_thread();
}

START_TEST(hybrid_backward_is_the_e5m2_product_by_hand) {
    static uint16_t dy[N * OC], x[N * IC], w[OC * IC], dinp[N * IC], dinp8[N * IC];
    static float dw[OC * IC], dw8[OC * IC];
    unsigned seed = 11;
    fill(dy, N * OC, 0x1p-20, &seed);   /* gradients: small, as a loss's are */
    fill(x, N * IC, 1.0, &seed);
    fill(w, OC * IC, 0.02, &seed);
    const fp8_recipe recipes[] = {FP8_TENSORWISE, FP8_ROWWISE};
    for (int i = 0; i < 2; i++) {
        const int row = recipes[i] == FP8_ROWWISE;
        backward(recipes[i], FP8_FORMAT_HYBRID, 0, dinp, dw, dy, x, w);
        const hand_diff d = against_by_hand(row, FP8_E5M2, dinp, dw, dy, x, w);
        const hand_diff c = against_by_hand(row, FP8_E4M3, dinp, dw, dy, x, w);
        backward(recipes[i], FP8_FORMAT_E4M3, 0, dinp8, dw8, dy, x, w);
        int differ = 0;
        for (int k = 0; k < OC * IC; k++) differ += dw[k] != dw8[k];
        backward(recipes[i], FP8_FORMAT_HYBRID, FP8_NO_SITE, dinp, dw, dy, x, w);
        ck_assert_msg(memcmp(dw, dw8, sizeof dw) == 0 && memcmp(dinp, dinp8, sizeof dinp) == 0,
                      "the head's backward (FP8_NO_SITE) is not bf16's under hybrid");
        printf("hybrid %-10s backward vs by hand (E5M2 dY): dinp %.2f bf16 ulp (limit 1),"
               " dweight %.3f of its bound; control, E4M3 dY by hand: %.3g ulp, %.3g;"
               " e4m3's (bf16) dweight differs in %d of %d\n", fp8_recipe_name(recipes[i]),
               d.dinp_ulps, d.dweight_bounds, c.dinp_ulps, c.dweight_bounds, differ, OC * IC);
        ck_assert_double_le(d.dinp_ulps, 1);
        ck_assert_double_le(d.dweight_bounds, 1);
        ck_assert_double_gt(c.dinp_ulps, 2);
        ck_assert_double_gt(c.dweight_bounds, 2);
        ck_assert_int_gt(differ, OC * IC / 2);
    }
}
END_TEST

/* delayed: dY has a history of its own per linear. After a forward has recorded the
 * activation's amax (~4), a first backward with dY ~ 2^-40 scales dY from its own amax,
 * as by hand; scaled from the activation's history (57344 / 4) it would fall below
 * E5M2's subnormals (2^-16) and dinp would be 0, far outside the bound. */
START_TEST(delayed_gradients_keep_their_own_history) {
    static uint16_t dy[N * OC], x[N * IC], w[OC * IC], out[N * OC], dinp[N * IC];
    static float dw[OC * IC];
    unsigned seed = 5;
    fill(dy, N * OC, 0x1p-40, &seed);
    fill(x, N * IC, 1.0, &seed);
    fill(w, OC * IC, 0.02, &seed);
    const fp8_recipe delayed = FP8_DELAYED;
    fp8_linear_format(FP8_FORMAT_HYBRID);
    fp8_linear_use(&delayed);
    fp8_linear_site(0);
    fp8_linear_forward(out, x, w, NULL, N, IC, OC);
    memset(dw, 0, sizeof dw);
    mixed_linear_backward(PRECISION_BF16, dinp, dw, NULL, dy, x, w, N, IC, OC);
    fp8_linear_use(NULL);
    fp8_linear_format(FP8_FORMAT_E4M3);
    fp8_linear_release_thread();
    const hand_diff d = against_by_hand(0, FP8_E5M2, dinp, dw, dy, x, w);
    printf("hybrid delayed, dY ~ 2^-40 after a forward: dinp %.2f bf16 ulp, dweight %.3f of"
           " its bound\n", d.dinp_ulps, d.dweight_bounds);
    ck_assert_double_le(d.dinp_ulps, 1);
    ck_assert_double_le(d.dweight_bounds, 1);
}
END_TEST

/* cfg's DDP run against b: the worst fraction of tolerance. */
static double ddp_against(const run_config *cfg, const dataset *d, const baseline_run *b,
                          const char *what) {
    ddp_result *o = launch_ddp(cfg, d, ddp_options_default(), b);
    const run_result r = o->run.result;
    ddp_result_free(o);
    printf("fp8 hybrid %-10s ddp, %d ranks: max |diff| loss %.2e grads %.2e params %.2e\n",
           what, cfg->comm.ranks, r.diff_loss, r.diff_grads, r.diff_params);
    return run_worst_fraction_of(&r, tolerances_for(cfg));
}

/* cfg's ZeRO-3 run (FP8 weights gathered: fsdp_fp8.h) against b: the worst fraction of
 * tolerance. Under delayed the backward's E4M3 W takes its scale from the history the
 * gather recorded for that linear. */
static double zero3_against(const run_config *cfg, const dataset *d, const baseline_run *b,
                            const char *what) {
    strategy_outcome o = launch_zero(cfg, d, (zero_options){.stage = 3});
    compare_to_baseline(&o.result, b, o.loss, o.first_grads, o.final_params);
    const run_result r = o.result;
    zero_outcome_free(&o);
    printf("fp8 hybrid %-10s zero3, %d ranks: max |diff| loss %.2e grads %.2e params %.2e\n",
           what, cfg->comm.ranks, r.diff_loss, r.diff_grads, r.diff_params);
    return run_worst_fraction_of(&r, tolerances_for(cfg));
}

/* 32 rows a rank: OpenBLAS's blockings then differ between a rank's rows and the
 * whole batch's (what backward's dinp must not depend on; fp8_linear.c) */
static run_config hybrid_config(void) {
    run_config cfg = uneven_model_config(1);
    cfg.model = (gpt_config){.vocab = 256, .ctx = 16, .layers = 2, .heads = 2, .dim = 64};
    cfg.batch = 4;
    cfg.steps = 3;
    cfg.precision = PRECISION_BF16;
    return cfg;
}

START_TEST(hybrid_ddp_equals_the_hybrid_baseline) {
    dataset *d = dataset_builtin();
    run_config cfg = hybrid_config();
    const fp8_recipe recipes[] = {FP8_DELAYED, FP8_TENSORWISE, FP8_BLOCKWISE};
    for (int i = 0; i < 3; i++) {
        fp8_linear_use(&recipes[i]);
        baseline_run *e4m3 = baseline_train(&cfg, d);
        fp8_linear_format(FP8_FORMAT_HYBRID);
        baseline_run *b = baseline_train(&cfg, d);
        ck_assert_msg(b->loss[cfg.steps - 1] != e4m3->loss[cfg.steps - 1],
                      "%s: hybrid's backward did not run", fp8_recipe_name(recipes[i]));
        cfg.comm.ranks = 2;
        ck_assert_double_le(ddp_against(&cfg, d, b, fp8_recipe_name(recipes[i])), 1);
        if (recipes[i] == FP8_DELAYED)
            ck_assert_double_le(zero3_against(&cfg, d, b, fp8_recipe_name(recipes[i])), 1);
        if (recipes[i] == FP8_TENSORWISE) {   /* control: dY's amax each rank's own */
            fp8_linear_test_local_grad_amax(1);
            const double control = ddp_against(&cfg, d, b, "control");
            fp8_linear_test_local_grad_amax(0);
            printf("control (tensorwise, dY's amax not all-reduced): %.3g of the tolerance\n",
                   control);
            ck_assert_msg(control > 1, "tensorwise hybrid DDP matched: %g", control);
        }
        cfg.comm.ranks = 1;
        fp8_linear_format(FP8_FORMAT_E4M3);
        fp8_linear_use(NULL);
        baseline_free(b);
        baseline_free(e4m3);
    }
    dataset_free(d);
}
END_TEST

int main(void) {
    Suite *s = suite_create("fp8 hybrid");
    TCase *t = tcase_create("hybrid");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, hybrid_backward_is_the_e5m2_product_by_hand);
    tcase_add_test(t, delayed_gradients_keep_their_own_history);
    tcase_add_test(t, hybrid_ddp_equals_the_hybrid_baseline);
    suite_add_tcase(s, t);
    return check_run(s, 0);
}
