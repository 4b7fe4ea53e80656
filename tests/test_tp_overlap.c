/* TP's collective matmuls (tp_overlap.h, --tp-overlap): sequence parallelism's
 * all-gather + column-parallel product and row-parallel product + reduce-scatter in
 * chunks, forward and backward, against the same run without chunks (fp32 and bf16, tp
 * 2 and 4, even and uneven chunks) and against the single-device baseline within TP's
 * tolerances; bf16's forward (step 1's loss) to the bit; the negative controls (a
 * chunk's product started before its data arrived, the chunks' order swapped, in both
 * passes or in backward alone) fail the comparison. */
#include <check.h>
#include <math.h>
#include <stdio.h>

#include "baseline.h"
#include "check_run.h"
#include "small_model.h"
#include "compare.h"
#include "floats.h"
#include "tolerances.h"
#include "tp_overlap.h"
#include "tp_train.h"


typedef struct {
    double loss, grads, params;   /* largest differences */
    double first_loss;            /* step 1's: the forward alone */
    double grads_tolerance, params_tolerance;   /* TP's */
} differences;

static differences outcome_differences(const strategy_outcome *a, const strategy_outcome *b,
                                       int steps) {
    differences d = {.first_loss = fabs(a->loss[0] - b->loss[0])};
    for (int s = 0; s < steps; s++) d.loss = fmax(d.loss, fabs(a->loss[s] - b->loss[s]));
    d.grads = max_abs_diff(a->first_grads, b->first_grads, a->num_params);
    d.params = max_abs_diff(a->final_params, b->final_params, a->num_params);
    return d;
}

/* TP + SP with `chunks` (control) against TP + SP without, and both against the
 * baseline; returns the overlapped run's worst fraction of TP's tolerances. */
static double overlap_against_plain(int t, precision p, int chunks, tp_overlap_control control,
                                    run_config cfg, differences *apart) {
    cfg.precision = p;
    run_config base = cfg;
    base.comm.ranks = 1;
    dataset *d = dataset_builtin();
    baseline_run *b = baseline_train(&base, d);
    const run_tolerances tol = tp_run_tolerances(&cfg, t, b);
    strategy_outcome plain = {0}, chunked = {0};
    tp_extra x;
    plain.extra = chunked.extra = &x;
    ck_assert_int_eq(tp_launch(&cfg, d, t, &(tp_options){.sequence_parallel = 1}, &plain), 0);
    const tp_options with = {.sequence_parallel = 1, .tp_overlap_chunks = chunks,
                             .tp_overlap_control = control};
    ck_assert_int_eq(tp_launch(&cfg, d, t, &with, &chunked), 0);
    *apart = outcome_differences(&plain, &chunked, cfg.steps);
    apart->grads_tolerance = tol.grads;
    apart->params_tolerance = tol.params;
    compare_to_baseline(&chunked.result, b, chunked.loss, chunked.first_grads,
                        chunked.final_params);
    const run_result *r = &chunked.result;
    const double worst = run_worst_fraction_of_tolerance(r, tol.grads, tol.loss, tol.params);
    printf("tp %d + sp, %s, %d chunks%s: against no overlap max |diff| loss %.2e grads %.2e"
           " params %.2e; against the baseline loss %.2e grads %.2e params %.2e (%.2f of"
           " TP's tolerance)\n", t, precision_name(p), chunks,
           control == TP_OVERLAP_EARLY     ? " (negative control: product before its data)"
           : control == TP_OVERLAP_SWAPPED ? " (negative control: chunks swapped)"
           : control == TP_OVERLAP_EARLY_BACKWARD
               ? " (negative control: backward's product before its data)"
           : control == TP_OVERLAP_SWAPPED_BACKWARD ? " (negative control: backward's chunks"
                                                      " swapped)"
                                                    : "",
           apart->loss, apart->grads, apart->params, r->diff_loss, r->diff_grads,
           r->diff_params, worst);
    strategy_outcome_free(&plain);
    strategy_outcome_free(&chunked);
    baseline_free(b);
    dataset_free(d);
    return worst;
}

/* Equal to the run without overlap within TP's tolerances, and in bf16 its forward
 * (step 1's loss) to the bit: a forward product's rows do not depend on how many share
 * a GEMM. Backward's dX products per chunk are GEMMs of a run of 2 or 4 rows where the
 * plain layer's is one of every row, and oneDNN's kernel for that orientation (dY @ W,
 * W not transposed) may sum such a short call's rows differently in the last fp32 bit
 * (measured: step 1's gradients equal here, the parameters after 5 steps one fp32 unit
 * apart, gone when backward runs whole). */
static void check_overlap(int t, precision p, int chunks) {
    differences apart;
    const double worst = overlap_against_plain(t, p, chunks, TP_OVERLAP_RIGHT,
                                               sequence_model_config(t), &apart);
    ck_assert_msg(worst <= 1, "tp %d, %d chunks: %.2f of the tolerance", t, chunks, worst);
    ck_assert_msg(apart.grads <= apart.grads_tolerance && apart.params <= apart.params_tolerance,
                  "tp %d, %d chunks: grads %.2e params %.2e from no overlap", t, chunks,
                  apart.grads, apart.params);
    if (p != PRECISION_FP32)
        ck_assert_msg(apart.first_loss == 0, "bf16 collective matmul's forward differs from"
                      " the plain layers: %.2e", apart.first_loss);
}

START_TEST(tp2_four_chunks_fp32) { check_overlap(2, PRECISION_FP32, 4); }
END_TEST
START_TEST(tp2_three_uneven_chunks_fp32) { check_overlap(2, PRECISION_FP32, 3); }
END_TEST
START_TEST(tp4_two_chunks_fp32) { check_overlap(4, PRECISION_FP32, 2); }
END_TEST
START_TEST(tp2_four_chunks_bf16) { check_overlap(2, PRECISION_BF16, 4); }
END_TEST
START_TEST(tp4_two_chunks_bf16) { check_overlap(4, PRECISION_BF16, 2); }
END_TEST

/* The controls on a slow modelled link (1 ms a message), so that a product started
 * before its chunk arrived reads what the buffer held before. */
static void check_control(tp_overlap_control control) {
    run_config cfg = sequence_model_config(2);
    cfg.steps = 2;
    cfg.comm.link = LINK_NVLINK;
    cfg.comm.link_scale = 500;
    differences apart;
    const double worst = overlap_against_plain(2, PRECISION_FP32, 4, control, cfg, &apart);
    printf("negative control: %.0fx TP's tolerance (must be > 1)\n", worst);
    ck_assert_msg(worst > 1, "the negative control passed: %.2f of the tolerance", worst);
}

START_TEST(product_before_its_data_fails) { check_control(TP_OVERLAP_EARLY); }
END_TEST
START_TEST(chunks_swapped_fail) { check_control(TP_OVERLAP_SWAPPED); }
END_TEST
START_TEST(backward_product_before_its_data_fails) { check_control(TP_OVERLAP_EARLY_BACKWARD); }
END_TEST
START_TEST(backward_chunks_swapped_fail) { check_control(TP_OVERLAP_SWAPPED_BACKWARD); }
END_TEST

START_TEST(chunk_counts_are_checked) {
    char why[160];
    ck_assert_ptr_null(tp_overlap_check(4, 8, 2, why, sizeof why));
    ck_assert_ptr_nonnull(tp_overlap_check(5, 8, 2, why, sizeof why));
    printf("5 chunks of 4 positions: %s\n", why);
    ck_assert_ptr_nonnull(tp_overlap_check(0, 8, 2, why, sizeof why));
}
END_TEST

int main(void) {
    Suite *s = suite_create("tp_overlap");
    TCase *tc = tcase_create("collective_matmul");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, chunk_counts_are_checked);
    tcase_add_test(tc, tp2_four_chunks_fp32);
    tcase_add_test(tc, tp2_three_uneven_chunks_fp32);
    tcase_add_test(tc, tp4_two_chunks_fp32);
    tcase_add_test(tc, tp2_four_chunks_bf16);
    tcase_add_test(tc, tp4_two_chunks_bf16);
    tcase_add_test(tc, product_before_its_data_fails);
    tcase_add_test(tc, chunks_swapped_fail);
    tcase_add_test(tc, backward_product_before_its_data_fails);
    tcase_add_test(tc, backward_chunks_swapped_fail);
    suite_add_tcase(s, tc);
    return check_run(s, 0);
}
