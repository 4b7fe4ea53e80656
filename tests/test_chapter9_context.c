/* Chapter 9's context-parallel part, as the chapter runs it (context_launches) on 4
 * thread ranks: the three runs against the baseline, bytes equal to their formulas,
 * the causal work's imbalance, and the long sequence's activations per rank against
 * one device's. The library's own cases and negative controls are in test_cp.c. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "check_run.h"
#include "context.h"
#include "tolerances.h"

START_TEST(context_part_matches_the_baseline_and_its_formulas) {
    run_config cfg = run_config_default();
    cfg.model = (gpt_config){.vocab = 256, .ctx = 32, .layers = 2, .heads = 4, .dim = 32};
    cfg.batch = 4;
    cfg.steps = 3;
    cfg.quiet = 1;
    cfg.comm.ranks = 4;
    cfg.comm.timeout_seconds = 60;
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
    suite_add_tcase(suite, part);
    return check_run(suite, 0);
}
