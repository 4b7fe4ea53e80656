/* Chapter 9's context-parallel part, as the chapter runs it (context_launches) on 4
 * thread ranks: the three runs against the baseline, bytes equal to their formulas,
 * the causal work's imbalance, and the long sequence's activations per rank against
 * one device's. The library's own cases and negative controls are in test_cp.c. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "baseline.h"
#include "check_run.h"
#include "compare.h"
#include "context.h"
#include "tolerances.h"

/* 2 layers, 4 heads of dim 32, batch 4, 3 steps on 4 thread ranks, in precision p (and
 * its gradients). */
static run_config part_config(int ctx, precision p) {
    run_config cfg = run_config_default();
    cfg.model = (gpt_config){.vocab = 256, .ctx = ctx, .layers = 2, .heads = 4, .dim = 32};
    cfg.batch = 4;
    cfg.steps = 3;
    cfg.quiet = 1;
    cfg.comm.ranks = 4;
    cfg.comm.timeout_seconds = 60;
    cfg.precision = cfg.grad_precision = p;
    return cfg;
}

START_TEST(context_part_matches_the_baseline_and_its_formulas) {
    run_config cfg = part_config(32, PRECISION_FP32);
    dataset *d = dataset_builtin();
    context_report r = {0};
    ck_assert_int_eq(context_launches(&cfg, d, &r), 0);
    context_print(&r);
    for (int i = 0; i < CONTEXT_RUNS; i++) {
        const context_run *c = &r.runs[i];
        ck_assert(c->ran);
        ck_assert(c->result.diff_loss <= TOL_LOSS);
        ck_assert(c->result.diff_grads <= TOL_GRADS);
        ck_assert(c->result.diff_params <= TOL_PARAMS);
        ck_assert(c->extra.cp_bytes_per_layer == c->extra.cp_bytes_per_layer_formula);
    }
    ck_assert(r.runs[0].extra.work_imbalance == 8.0 / 5);   /* 2P/(P+1) */
    ck_assert(r.runs[1].extra.work_imbalance == 1.0);
    /* Ulysses sends P times less than Megatron-SP on the same ranks would */
    ck_assert(r.runs[2].extra.cp_bytes_per_layer * 4 == r.sp_bytes_per_layer);
    /* the long sequence: one device holds B H s^2 probabilities and their gradient;
     * Ulysses H/P heads of them (1/P), ring none (it recomputes them per block) */
    const double ulysses = r.long_activations[2] / r.long_baseline_activations;
    const double ring = r.long_activations[1] / r.long_baseline_activations;
    printf("long sequence ctx %d: activations per rank / one device: ring %.3f, ulysses %.3f"
           " (1/P = 0.25)\n", r.long_ctx, ring, ulysses);
    ck_assert(r.long_ctx == 2048);
    ck_assert(ulysses > 0.2 && ulysses < 0.26);
    ck_assert(ring < 0.05);
    ck_assert(r.long_diff_loss[1] <= TOL_LOSS && r.long_diff_loss[2] <= TOL_LOSS);
    ck_assert(context_passed(&r));
    /* negative controls of the verdict: a run off by more than the tolerance, or a byte
     * off its formula, fails it */
    context_report off = r;
    off.runs[2].result.diff_grads = 10 * TOL_GRADS;
    ck_assert(!context_passed(&off));
    off = r;
    off.runs[0].extra.cp_bytes_per_layer += 1;
    ck_assert(!context_passed(&off));
    context_report_free(&r);
    dataset_free(d);
}
END_TEST

/* --precision bf16|fp16 with --grad-dtype the same, cp 2 x dp 2 on 4 ranks: the three
 * runs against one device in that precision (the part's tolerances: TP 2's 16-bit
 * bounds, widened for 4 ranks' 16-bit gradients), the CP bytes (fp32: the hook widens
 * q, k, v) equal to their formulas. Negative control: the ring's diagonal block
 * without its causal mask (test_unmasked_diagonal) fails the same bounds. */
static void check_part_in(precision p) {
    run_config cfg = part_config(16, p);
    dataset *d = dataset_builtin();
    context_report r = {.flags = {.cp = 2}};
    ck_assert_int_eq(context_launches(&cfg, d, &r), 0);
    ck_assert(r.cp == 2 && r.dp == 2 && r.precision == p && r.grad_precision == p);
    for (int i = 0; i < CONTEXT_RUNS; i++) {
        const run_result *x = &r.runs[i].result;
        printf("context %s with %s gradients, run %d: max |diff| loss %.2e (tol %.0e) grads"
               " %.2e (tol %.0e) params %.2e (tol %.0e); cp bytes/layer %.0f = formula %.0f\n",
               precision_name(p), precision_name(p), i, x->diff_loss, r.tol.loss,
               x->diff_grads, r.tol.grads, x->diff_params, r.tol.params,
               r.runs[i].extra.cp_bytes_per_layer, r.runs[i].extra.cp_bytes_per_layer_formula);
        ck_assert(r.runs[i].ran);
    }
    ck_assert(r.long_ran[1] && r.long_diff_loss[1] <= r.long_tol_loss);
    ck_assert(context_passed(&r));
    run_config base = cfg;
    base.comm.ranks = 1;
    baseline_run *b = baseline_train(&base, d);
    strategy_outcome out = {0};
    const cp_options bad = {.kind = CP_RING, .split = CP_CONTIGUOUS,
                            .test_unmasked_diagonal = 1};
    ck_assert_int_eq(cp_launch(&cfg, d, 2, &bad, &out), 0);
    strategy_outcome_compare(&out, b);
    const run_result *x = &out.result;
    const double worst = run_worst_fraction_of_tolerance(x, r.tol.grads, r.tol.loss,
                                                         r.tol.params);
    printf("negative control, %s ring with its diagonal block unmasked: loss %.2e grads %.2e"
           " params %.2e (%.1fx the tolerance)\n", precision_name(p), x->diff_loss,
           x->diff_grads, x->diff_params, worst);
    /* 1.4x on AMX, whose bf16 rows get (4 L + 1) u G where TP's bound is 4 L u G */
    ck_assert(worst > 1.25);
    strategy_outcome_free(&out);
    baseline_free(b);
    context_report_free(&r);
    dataset_free(d);
}

START_TEST(context_part_in_16_bits_matches_the_baseline) {
    check_part_in(PRECISION_BF16);
    check_part_in(PRECISION_FP16);
}
END_TEST

/* Unchecked flags (a run of every part): a run the sizes do not fit is skipped and says
 * why, the others run. Heads 2 on 4 ranks: Ulysses cannot split them. */
START_TEST(a_run_the_sizes_do_not_fit_is_skipped_with_its_reason) {
    run_config cfg = run_config_default();
    cfg.model = (gpt_config){.vocab = 256, .ctx = 16, .layers = 1, .heads = 2, .dim = 16};
    cfg.batch = 4;
    cfg.steps = 1;
    cfg.quiet = 1;
    cfg.comm.ranks = 4;
    dataset *d = dataset_builtin();
    context_report r = {0};
    ck_assert_int_eq(context_launches(&cfg, d, &r), 0);
    printf("ulysses skipped: %s\n", r.runs[2].skipped);
    ck_assert(r.runs[0].ran && r.runs[1].ran && !r.runs[2].ran);
    ck_assert(strstr(r.runs[2].skipped, "--cp 4 does not divide --heads 2"));
    ck_assert(r.long_ran[1] && !r.long_ran[2]);
    ck_assert(context_passed(&r));
    context_report_free(&r);
    dataset_free(d);
}
END_TEST

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);   /* lines survive a failing (forked) test */
    Suite *suite = suite_create("chapter9_context");
    TCase *part = tcase_create("context");
    tcase_set_timeout(part, 120);
    tcase_add_test(part, context_part_matches_the_baseline_and_its_formulas);
    tcase_add_test(part, a_run_the_sizes_do_not_fit_is_skipped_with_its_reason);
    tcase_add_test(part, context_part_in_16_bits_matches_the_baseline);
    suite_add_tcase(suite, part);
    return check_run(suite, 0);
}
