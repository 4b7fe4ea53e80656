/* FP8 training (--precision fp8, fp8_linear.h): the FP8 linear against the bf16
 * product within FP8 rounding, the FP8 baseline near bf16, and DDP and ZeRO-3 equal to
 * the FP8 baseline, each with a control that must fail.
 *
 * Tolerances, derived:
 * - one linear: E4M3 keeps 3 mantissa bits, so a value the scale puts in the normal
 *   range rounds with relative error at most u8 = 2^-4, and a product of two rounded
 *   values with at most 2 u8 + u8^2; summed in fp32 (error ~K 2^-24, negligible) and
 *   rounded to bf16 once (at most 2^-9 relative): |out - x w^T| <= (2 u8 + u8^2)
 *   sum_k |x_k w_k| + 2^-9 |x w^T| per element, for inputs whose magnitudes in one
 *   block lie within 448 / 2^-6 of each other (here within 4x: none subnormal).
 * - the FP8 baseline against bf16: the criterion for loss curves, the mean loss
 *   within 1% of bf16's (DeepSeek-V3 reports 0.25% at scale).
 * - DDP and ZeRO-3 against the FP8 baseline: tolerances.h's mixed-precision ones
 *   (tolerances_for), derived there for bf16, and they hold for the same reason: with
 *   rowwise or blockwise scales a token's FP8 inputs depend on that token and the
 *   (whole, replicated or gathered) weight alone, so each rank's arithmetic per token
 *   is the baseline's. tensorwise and delayed scale by the amax of the whole batch, of
 *   which a rank holds a share: its max is all-reduced over the ranks (fp8_linear_group),
 *   so each rank's scale is the baseline's again; without the all-reduce tensorwise's
 *   DDP must exceed them (the control). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "fsdp_fp8.h"
#include "baseline.h"
#include "check_run.h"
#include "compare.h"
#include "fp8_linear.h"
#include "number_formats.h"
#include "small_model.h"
#include "strategy_runs.h"
#include "tolerances.h"

enum { N = 6, IC = 160, OC = 24 };   /* IC > 128: blockwise rescales a partial tile */

/* values of magnitude in [lo, 4 lo) with random signs, as bf16 */
static void fill(uint16_t *v, size_t n, double lo, unsigned *seed) {
    for (size_t i = 0; i < n; i++) {
        const double m = lo * (1.0 + 3.0 * rand_r(seed) / (double)RAND_MAX);
        v[i] = number_to_bf16((float)(rand_r(seed) & 1 ? m : -m));
    }
}

/* The largest |error| / bound over out's elements (> 1: outside FP8 rounding). */
static double worst_against_bound(const uint16_t *out, const uint16_t *x, const uint16_t *w,
                                  const uint16_t *b) {
    const double u8 = 0x1p-4, worst_product = 2 * u8 + u8 * u8;
    double worst = 0;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < OC; j++) {
            double ref = number_from_bf16(b[j]), mag = 0;
            for (int k = 0; k < IC; k++) {
                const double p = (double)number_from_bf16(x[i * IC + k]) *
                                 number_from_bf16(w[j * IC + k]);
                ref += p;
                mag += fabs(p);
            }
            const double bound = worst_product * mag + 0x1p-9 * fabs(ref);
            worst = fmax(worst, fabs(number_from_bf16(out[i * OC + j]) - ref) / bound);
        }
    return worst;
}

/* v's amax over its block of br x bc holding (i, k), in a [rows, cols] matrix */
static double block_amax(const uint16_t *v, int rows, int cols, int i, int k, int br,
                         int bc) {
    const int i0 = i / br * br, k0 = k / bc * bc;
    double a = 0;
    for (int r = i0; r < i0 + br && r < rows; r++)
        for (int c = k0; c < k0 + bc && c < cols; c++)
            a = fmax(a, fabs(number_from_bf16(v[r * cols + c])));
    return a;
}

/* v rounded to E4M3 by hand: scaled so its block's amax is 448, rounded, unscaled */
static double by_hand(const uint16_t *v, int rows, int cols, int i, int k, int br, int bc) {
    const double s = 448.0 / block_amax(v, rows, cols, i, k, br, bc);
    return fp8_decode(FP8_E4M3, fp8_encode(FP8_E4M3, (float)(number_from_bf16(v[i * cols + k]) * s))) / s;
}

/* The largest |out - by-hand FP8 product| in bf16 ulps of the product: half an ulp from
 * the rounding to bf16, and the fp32 sums (~K 2^-24 relative) may round it the other
 * way: at most 1. */
static double worst_against_by_hand(fp8_recipe r, const uint16_t *out, const uint16_t *x,
                                    const uint16_t *w, const uint16_t *b) {
    const int xr = r == FP8_TENSORWISE ? N : 1, xc = r == FP8_BLOCKWISE ? 128 : IC;
    const int wr = r == FP8_TENSORWISE ? OC : r == FP8_ROWWISE ? 1 : 128;
    const int wc = r == FP8_BLOCKWISE ? 128 : IC;
    double worst = 0;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < OC; j++) {
            double ref = number_from_bf16(b[j]);
            for (int k = 0; k < IC; k++)
                ref += by_hand(x, N, IC, i, k, xr, xc) * by_hand(w, OC, IC, j, k, wr, wc);
            const double ulp = ldexp(1.0, ilogb(fmax(fabs(ref), 0x1p-126)) - 7);   /* bf16's */
            worst = fmax(worst, fabs(number_from_bf16(out[i * OC + j]) - ref) / ulp);
        }
    return worst;
}

/* x at scale lo, the weights at 0.02 (an initialisation's), through the FP8 linear. */
static double linear_worst(fp8_recipe r, double lo, int unscaled, double *ulps) {
    static uint16_t x[N * IC], w[OC * IC], b[OC], out[N * OC];
    unsigned seed = 7;
    fill(x, N * IC, lo, &seed);
    fill(w, OC * IC, 0.02, &seed);
    fill(b, OC, 0.02 * lo, &seed);   /* of the products' size: the bias must not hide them */
    fp8_linear_use(&r);
    fp8_linear_test_unscaled(unscaled);
    fp8_linear_forward(out, x, w, b, N, IC, OC);
    fp8_linear_test_unscaled(0);
    fp8_linear_use(NULL);
    fp8_linear_release_thread();
    *ulps = worst_against_by_hand(r, out, x, w, b);
    return worst_against_bound(out, x, w, b);
}

START_TEST(an_fp8_linear_is_the_product_within_fp8_rounding) {
    const fp8_recipe recipes[] = {FP8_TENSORWISE, FP8_ROWWISE, FP8_BLOCKWISE};
    double ulps;
    for (int i = 0; i < 3; i++)
        for (int small = 0; small < 2; small++) {   /* activations of 1 and 2^-12 */
            const double worst = linear_worst(recipes[i], small ? 0x1p-12 : 1.0, 0, &ulps);
            printf("fp8 linear, %-10s x ~ %-6s worst |error| %.2f of the bound, %.2f bf16"
                   " ulp from by hand\n", fp8_recipe_name(recipes[i]), small ? "2^-12" : "1",
                   worst, ulps);
            ck_assert_msg(worst <= 1, "%s: %g of the bound", fp8_recipe_name(recipes[i]), worst);
            ck_assert_msg(ulps <= 1, "%s: %g ulp", fp8_recipe_name(recipes[i]), ulps);
        }
    /* control: the scales not applied, small activations flush to zero in E4M3 */
    const double control = linear_worst(FP8_BLOCKWISE, 0x1p-12, 1, &ulps);
    printf("control (scales not applied), x ~ 2^-12: %.3g of the bound, %.3g ulp\n", control,
           ulps);
    ck_assert_msg(control > 1 && ulps > 1, "unscaled FP8 passed: %g, %g ulp", control, ulps);
}
END_TEST

/* delayed, one site: a forward of x times `jump` (a power of 2), then x's own; out the
 * second's. */
static void delayed_after(double jump, uint16_t *out, const uint16_t *x, const uint16_t *w,
                          const uint16_t *b) {
    static uint16_t xj[N * IC], scratch[N * OC];
    for (int i = 0; i < N * IC; i++) xj[i] = number_to_bf16((float)(number_from_bf16(x[i]) * jump));
    const fp8_recipe delayed = FP8_DELAYED;
    fp8_linear_use(&delayed);   /* a fresh history */
    fp8_linear_site(3);
    fp8_linear_forward(scratch, xj, w, b, N, IC, OC);
    fp8_linear_forward(out, x, w, b, N, IC, OC);
    fp8_linear_use(NULL);
}

static int differing(const uint16_t *a, const uint16_t *b, int n) {
    int d = 0;
    for (int i = 0; i < n; i++) d += a[i] != b[i];
    return d;
}

/* Delayed scaling in the linear: a site's history sets the scale. After a forward of 8x
 * the input, the scale is 8x smaller; a power of 2 leaves every value's E4M3 rounding as
 * it was while none leaves the normal range (x in [1, 4): scaled into [14, 56)), so the
 * output is tensorwise's bit for bit, and so is a first forward (its own amax). After a
 * jump of 2^16 the values fall into the subnormals: outputs differ (the control). */
START_TEST(delayed_scaling_takes_the_amax_history) {
    static uint16_t x[N * IC], w[OC * IC], b[OC], tensorwise[N * OC], out[N * OC];
    unsigned seed = 11;
    fill(x, N * IC, 1.0, &seed);
    fill(w, OC * IC, 0.02, &seed);
    fill(b, OC, 0.02, &seed);
    const fp8_recipe t = FP8_TENSORWISE;
    fp8_linear_use(&t);
    fp8_linear_forward(tensorwise, x, w, b, N, IC, OC);
    delayed_after(1, out, x, w, b);
    const int same_amax = differing(out, tensorwise, N * OC);
    delayed_after(8, out, x, w, b);
    const int after_8x = differing(out, tensorwise, N * OC);
    delayed_after(65536, out, x, w, b);
    const int after_2_16 = differing(out, tensorwise, N * OC);
    fp8_linear_release_thread();
    printf("delayed against tensorwise: %d of %d outputs differ after the same amax, %d after"
           " an 8x one, %d after 2^16x (control)\n", same_amax, N * OC, after_8x, after_2_16);
    ck_assert_int_eq(same_amax, 0);
    ck_assert_int_eq(after_8x, 0);
    ck_assert_int_gt(after_2_16, N * OC / 2);
}
END_TEST

/* ZeRO-3's FP8 gather under delayed (fsdp_fp8.c) asks a weight's scale of its linear's
 * history, which records the whole weight's amax: a site's first scale is its own amax's,
 * later ones the history's largest; another site keeps a history of its own. */
START_TEST(a_gathered_delayed_weight_is_scaled_by_its_history) {
    const fp8_recipe delayed = FP8_DELAYED;
    fp8_linear_use(&delayed);
    const float max = fp8_info(FP8_E4M3)->max;
    const float first = fp8_linear_delayed_weight_scale(1, 2.0f);
    const float later = fp8_linear_delayed_weight_scale(1, 0.5f);
    const float other = fp8_linear_delayed_weight_scale(2, 0.5f);
    const float third = fp8_linear_delayed_weight_scale(1, 0.25f);
    fp8_linear_release_thread();
    fp8_linear_use(NULL);
    printf("delayed weight scales, site 1: %g, %g, %g; site 2: %g\n", first, later, third, other);
    ck_assert(first == max / 2.0f && later == max / 2.0f && third == max / 2.0f);
    ck_assert(other == max / 0.5f);
}
END_TEST

static run_config fp8_config(int ranks) {
    run_config cfg = uneven_model_config(ranks);
    cfg.batch = 4;   /* 1, 2 and 4 ranks divide it */
    cfg.precision = PRECISION_BF16;
    return cfg;
}

static double mean(const float *v, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += v[i];
    return s / n;
}

START_TEST(the_fp8_baseline_stays_within_one_percent_of_bf16) {
    dataset *d = dataset_builtin();
    run_config cfg = fp8_config(1);
    baseline_run *b16 = baseline_train(&cfg, d);
    const fp8_recipe recipes[] = {FP8_DELAYED, FP8_TENSORWISE, FP8_ROWWISE, FP8_BLOCKWISE};
    for (int i = 0; i < 4; i++) {
        fp8_linear_use(&recipes[i]);
        baseline_run *f = baseline_train(&cfg, d);
        const double m16 = mean(b16->loss, cfg.steps), m8 = mean(f->loss, cfg.steps);
        const double gap = fabs(m8 - m16) / m16;
        printf("fp8 %-10s baseline: mean loss %.5f, bf16 %.5f: gap %.2e (limit 1e-2)\n",
               fp8_recipe_name(recipes[i]), m8, m16, gap);
        ck_assert_msg(m8 != m16, "%s: the FP8 path did not run", fp8_recipe_name(recipes[i]));
        ck_assert_msg(gap <= 1e-2, "%s: gap %g", fp8_recipe_name(recipes[i]), gap);
        if (recipes[i] == FP8_DELAYED) {   /* a run starts with empty histories */
            baseline_run *again = baseline_train(&cfg, d);
            ck_assert_msg(mean(again->loss, cfg.steps) == m8, "delayed: a second run differs");
            baseline_free(again);
        }
        fp8_linear_use(NULL);
        baseline_free(f);
    }
    baseline_free(b16);
    dataset_free(d);
}
END_TEST

/* cfg's run (DDP, or ZeRO-3 when zero3) against b: the worst fraction of tolerance. */
static double against_fp8_baseline(const run_config *cfg, const dataset *d,
                                   const baseline_run *b, int zero3, const char *recipe) {
    run_result r;
    if (zero3) {
        strategy_outcome o = launch_zero(cfg, d, (zero_options){.stage = 3});
        compare_to_baseline(&o.result, b, o.loss, o.first_grads, o.final_params);
        r = o.result;
        zero_outcome_free(&o);
    } else {
        ddp_result *o = launch_ddp(cfg, d, ddp_options_default(), b);
        r = o->run.result;
        ddp_result_free(o);
    }
    printf("fp8 %-10s %s, %d ranks: max |diff| loss %.2e grads %.2e params %.2e\n", recipe,
           zero3 ? "zero3" : "ddp  ", cfg->comm.ranks, r.diff_loss, r.diff_grads,
           r.diff_params);
    return run_worst_fraction_of(&r, tolerances_for(cfg));
}

START_TEST(ddp_and_zero3_equal_the_fp8_baseline) {
    dataset *d = dataset_builtin();
    const fp8_recipe recipes[] = {FP8_DELAYED, FP8_TENSORWISE, FP8_ROWWISE, FP8_BLOCKWISE};
    for (int i = 0; i < 4; i++) {
        fp8_linear_use(&recipes[i]);
        run_config cfg = fp8_config(1);
        baseline_run *b = baseline_train(&cfg, d);
        const char *name = fp8_recipe_name(recipes[i]);
        for (int ranks = 2; ranks <= 4; ranks += 2) {
            cfg.comm.ranks = ranks;
            ck_assert_double_le(against_fp8_baseline(&cfg, d, b, 0, name), 1);
        }
        cfg.comm.ranks = 2;
        ck_assert_double_le(against_fp8_baseline(&cfg, d, b, 1, name), 1);
        baseline_free(b);
    }
    /* control: the per-tensor activation amax each rank's own, not all-reduced */
    const fp8_recipe tensorwise = FP8_TENSORWISE;
    fp8_linear_use(&tensorwise);
    run_config cfg = fp8_config(1);
    baseline_run *b = baseline_train(&cfg, d);
    cfg.comm.ranks = 2;
    fp8_linear_test_local_amax(1);
    const double control = against_fp8_baseline(&cfg, d, b, 0, "tensorwise");
    fp8_linear_test_local_amax(0);
    printf("control (tensorwise, amax not all-reduced): %.3g of the tolerance\n", control);
    ck_assert_msg(control > 1, "tensorwise DDP matched: %g", control);
    fp8_linear_use(NULL);
    baseline_free(b);
    dataset_free(d);
}
END_TEST

/* ZeRO-3 on 2 and 3 ranks gathering `recipe`'s FP8 weights against the FP8 baseline
 * within its tolerances, the all-gather and all-reduce bytes per step equal to their
 * formula. Returns the baseline (the caller frees it). */
static baseline_run *zero3_gathers_as_the_baseline(fp8_recipe recipe, const dataset *d) {
    fp8_linear_use(&recipe);
    run_config cfg = fp8_config(1);
    if (recipe == FP8_DELAYED) {   /* full-rate steps from the first: the weights' amaxes
                                      move, and the history's max is not the current one */
        cfg.adamw.lr = 1e-2f;
        cfg.adamw.warmup_steps = 0;
    }
    baseline_run *b = baseline_train(&cfg, d);
    const gpt_shape s = gpt_shape_make(&cfg.model, 1, 0);
    for (int ranks = 2; ranks <= 3; ranks++) {
        cfg.comm.ranks = ranks;
        strategy_outcome o = launch_zero(&cfg, d, (zero_options){.stage = 3});
        compare_to_baseline(&o.result, b, o.loss, o.first_grads, o.final_params);
        double f[2];
        fsdp_fp8_gather_bytes(&s, recipe, ranks, f);
        const double ag = o.comm_bytes[COMM_KIND_ALLGATHER], ar = o.comm_bytes[COMM_KIND_ALLREDUCE];
        const double worst = run_worst_fraction_of(&o.result, tolerances_for(&cfg));
        printf("fp8 %s zero3, %d ranks, FP8 weights gathered: %.2f of the tolerance;"
               " all-gather %.0f B/step (formula %.0f), all-reduce %.0f (formula %.0f)\n",
               fp8_recipe_name(recipe), ranks, worst, ag, f[0], ar, f[1]);
        ck_assert_double_le(worst, 1);
        ck_assert(ag == f[0] && ar == f[1]);
        zero_outcome_free(&o);
    }
    return b;
}

/* ZeRO-3 gathers FP8 weights (fsdp_fp8.h), blockwise and delayed (each weight's scale
 * from its linear's amax history, the amax all-reduced first), equal to the FP8
 * baseline; control: scales from the amaxes summed, not their max, miss the baseline. */
START_TEST(zero3_gathers_fp8_weights) {
    dataset *d = dataset_builtin();
    baseline_free(zero3_gathers_as_the_baseline(FP8_DELAYED, d));
    baseline_run *b = zero3_gathers_as_the_baseline(FP8_BLOCKWISE, d);
    run_config cfg = fp8_config(1);
    cfg.comm.ranks = 2;
    fsdp_fp8_test_local_amax(1);
    strategy_outcome o = launch_zero(&cfg, d, (zero_options){.stage = 3});
    fsdp_fp8_test_local_amax(0);
    compare_to_baseline(&o.result, b, o.loss, o.first_grads, o.final_params);
    const double control = run_worst_fraction_of(&o.result, tolerances_for(&cfg));
    printf("control (amaxes summed, not their max): %.3g of the tolerance\n", control);
    ck_assert(control > 1);
    zero_outcome_free(&o);
    fp8_linear_use(NULL);
    baseline_free(b);
    dataset_free(d);
}
END_TEST

int main(void) {
    Suite *s = suite_create("fp8 training");
    TCase *t = tcase_create("fp8");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, an_fp8_linear_is_the_product_within_fp8_rounding);
    tcase_add_test(t, delayed_scaling_takes_the_amax_history);
    tcase_add_test(t, the_fp8_baseline_stays_within_one_percent_of_bf16);
    tcase_add_test(t, ddp_and_zero3_equal_the_fp8_baseline);
    tcase_add_test(t, a_gathered_delayed_weight_is_scaled_by_its_history);
    tcase_add_test(t, zero3_gathers_fp8_weights);
    suite_add_tcase(s, t);
    return check_run(s, 0);
}
