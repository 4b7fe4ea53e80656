/* Chapter 8's accuracy part, run once (its model and text, 200 steps, fp32, bf16, fp16
 * with its loss scale and fp16 without one), holds two sets of claims.
 *
 * The chapter's lessons: fp16 without a scale loses gradient elements to underflow,
 * fp16 with its scale skips no step after the warm-up, and a bf16 accumulator stops
 * where fp32 goes on.
 *
 * The curves, with a stated band: rounding to 16 bits changes a run's trajectory, not
 * where it goes. From the first update on, a 16-bit run and the fp32 run see the same
 * batches with slightly different weights, so their per-step losses differ by about
 * the step-to-step spread of the loss itself (0.1 - 0.2 nat here), but the differences
 * average out: over windows of 20 steps the mean losses agree within BAND = 0.1 nat
 * (measured: 0.012 bf16, 0.001 fp16), and both runs learn as much (their last 20 steps'
 * mean within 0.05 nat of fp32's, far below what the 200 steps gain: more than 1.5
 * nats). The negative control keeps the master weights in bf16 (rounded after every
 * update): AdamW's steps of about lr = 1e-3 are below half of bf16's spacing on weights
 * of 0.5 and more (LayerNorm's, at 1), so those never move, and the run leaves the
 * band (measured: 0.22 nat). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "baseline.h"
#include "check_run.h"
#include "cli.h"
#include "mixed.h"

#define WINDOW 20
#define BAND 0.1
#define FINAL_BAND 0.05

enum { FP32, BF16, FP16_SCALED, FP16_UNSCALED };

static double window_mean(const float *loss, int first) {
    double sum = 0;
    for (int i = first; i < first + WINDOW; i++) sum += loss[i];
    return sum / WINDOW;
}

/* The largest gap between 20-step means of two curves of `steps` steps, and the gap of
 * the last window. */
static double worst_window_gap(const float *a, const float *b, int steps, double *last_gap) {
    double worst = 0;
    for (int w = 0; w + WINDOW <= steps; w += WINDOW) {
        const double gap = fabs(window_mean(a, w) - window_mean(b, w));
        worst = fmax(worst, gap);
        *last_gap = gap;
    }
    return worst;
}

static void check_lessons(const accuracy_report *r) {
    printf("fp16 without a scale: %.4f%% of fp32's gradients flush, %.4f%% came out 0, error"
           " %.2e against %.2e scaled; fp16 scaled: %d skipped, %d after the warm-up; bf16"
           " sum %g, fp32 %g\n", 100 * r->flush_unscaled, 100 * r->lost_to_zero,
           r->grad_error[FP16_UNSCALED], r->grad_error[FP16_SCALED], r->skipped[FP16_SCALED],
           r->skipped_after_warmup, r->sum_bf16, r->sum_fp32);
    ck_assert(r->flush_unscaled > 0 && r->lost_to_zero > 0);
    ck_assert(r->flush_scaled < r->flush_unscaled);
    ck_assert(r->grad_error[FP16_UNSCALED] > 3 * r->grad_error[FP16_SCALED]);
    ck_assert_int_eq(r->skipped_after_warmup, 0);
    ck_assert_int_eq(r->skipped[BF16], 0);   /* bf16: no scale, nothing to skip */
    ck_assert(r->sum_bf16 == 4);
    ck_assert(fabs(r->sum_fp32 - 100) < 0.01);
    for (int i = 1; i < ACCURACY_CASES; i++) ck_assert(isfinite(r->loss[i][r->steps - 1]));
}

static void check_bands(const accuracy_report *r, const float *masters16) {
    const float *fp32 = r->loss[FP32];
    const int steps = r->steps;
    const double learned = window_mean(fp32, 0) - window_mean(fp32, steps - WINDOW);
    printf("fp32: loss %.3f over the first %d steps, %.3f over the last (learned %.2f nat)\n",
           window_mean(fp32, 0), WINDOW, window_mean(fp32, steps - WINDOW), learned);
    ck_assert(learned > 1.5);
    for (int i = BF16; i <= FP16_SCALED; i++) {
        double last = 0;
        const double worst = worst_window_gap(r->loss[i], fp32, steps, &last);
        printf("%s: 20-step means within %.3f nat of fp32's (band %.2f), the last %.3f (band"
               " %.2f)\n", accuracy_cases[i].label, worst, BAND, last, FINAL_BAND);
        ck_assert(worst <= BAND);
        ck_assert(last <= FINAL_BAND);
    }
    double last = 0;
    const double worst = worst_window_gap(masters16, fp32, steps, &last);
    printf("negative control, bf16 with bf16 master weights: 20-step means up to %.3f nat"
           " from fp32's, the last %.3f\n", worst, last);
    ck_assert(worst > BAND || last > FINAL_BAND);
}

START_TEST(accuracy_lessons_and_curves) {
    run_config cfg = run_config_default();
    mixed_chapter_defaults(&cfg);
    cfg.quiet = 1;
    ck_assert_msg(cfg.data_path, "data/english.txt is not at hand (run from the repository)");
    dataset *d = dataset_from_config(&cfg);
    accuracy_report r = {0};
    accuracy_local(&cfg, d, 256, &r);
    run_config control = mixed_case_config(&cfg, &accuracy_cases[BF16], cfg.steps);
    control.test_16bit_masters = 1;
    baseline_run *masters16 = baseline_train(&control, d);
    check_lessons(&r);
    check_bands(&r, masters16->loss);
    baseline_free(masters16);
    accuracy_free(&r);
    dataset_free(d);
}
END_TEST

int main(void) {
    Suite *s = suite_create("chapter 8 curves");
    TCase *t = tcase_create("accuracy");
    tcase_set_timeout(t, 600);
    tcase_add_test(t, accuracy_lessons_and_curves);
    suite_add_tcase(s, t);
    return check_run(s, 0);
}
