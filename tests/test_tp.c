/* The library's tensor parallelism (common/parallel/compose/tp_train.h) on thread ranks, through
 * its own launch helper and outcome, without any chapter: TP 2, TP 3 (a padded
 * vocabulary) and TP 2 x DP 2 against the single-device baseline, the bytes each rank
 * sends against the ring formula, and the negative control (f's backward all-reduce left
 * out) that the comparison and the replicas' drift must catch. */
#include <check.h>
#include <math.h>
#include <stdio.h>

#include "baseline.h"
#include "compare.h"
#include "tolerances.h"
#include "tp_train.h"
#include "check_run.h"

/* 12 heads divide by 2, 3 and 4; a 256-token vocabulary does not divide by 3. */
static run_config tiny_config(int ranks) {
    run_config cfg = run_config_default();
    cfg.model = (gpt_config){.vocab = 256, .ctx = 8, .layers = 2, .heads = 12, .dim = 24};
    cfg.batch = 4;
    cfg.steps = TOL_STEPS;
    cfg.quiet = 1;
    cfg.comm.ranks = ranks;
    cfg.comm.timeout_seconds = 30;
    return cfg;
}

/* Trains TP size t on `ranks` ranks, compares with the baseline into o. */
static void train_against_baseline(int ranks, int t, const tp_options *opts, int steps,
                                   strategy_outcome *o, tp_extra *x) {
    run_config cfg = tiny_config(ranks), base = cfg;
    cfg.steps = base.steps = steps;
    base.comm.ranks = 1;
    dataset *d = dataset_builtin();
    baseline_run *b = baseline_train(&base, d);
    o->extra = x;
    ck_assert_int_eq(tp_launch(&cfg, d, t, opts, o), 0);
    compare_to_baseline(&o->result, b, o->loss, o->first_grads, o->final_params);
    baseline_free(b);
    dataset_free(d);
}

static void check_tp(int ranks, int t) {
    strategy_outcome o = {0};
    tp_extra x;
    train_against_baseline(ranks, t, NULL, TOL_STEPS, &o, &x);
    const run_result *r = &o.result;
    const double worst = tp_worst_fraction_of_tolerance(r);
    const double bytes_error = r->bytes_formula > 0
                                   ? fabs(r->bytes_sent_per_step / r->bytes_formula - 1.0)
                                   : r->bytes_sent_per_step;
    printf("tp %d x dp %d: max |diff| loss %.2e grads %.2e params %.2e (%.2f of the"
           " tolerance); drift %.1e; bytes %.0f vs formula %.0f (error %.1e)\n", t,
           ranks / t, r->diff_loss, r->diff_grads, r->diff_params, worst, x.replica_drift,
           r->bytes_sent_per_step, r->bytes_formula, bytes_error);
    ck_assert_msg(worst <= 1, "tp %d x dp %d: %.2f of the tolerance", t, ranks / t, worst);
    ck_assert(x.replica_drift == 0.0);
    ck_assert_int_eq(x.tp, t);
    ck_assert_int_eq(x.dp, ranks / t);
    ck_assert_int_eq(x.vocab_local * t - 256, x.vocab_padding);
    /* uneven ring chunks: a few bytes per collective */
    ck_assert_msg(bytes_error <= 1e-3, "bytes %.0f, formula %.0f", r->bytes_sent_per_step,
                  r->bytes_formula);
    strategy_outcome_free(&o);
}

START_TEST(tp2_matches_the_baseline) { check_tp(2, 2); }
END_TEST
START_TEST(tp3_with_a_padded_vocabulary_matches_the_baseline) { check_tp(3, 3); }
END_TEST
START_TEST(tp2_times_dp2_matches_the_baseline) { check_tp(4, 2); }
END_TEST

START_TEST(tp_without_f_backward_fails_the_comparison) {
    strategy_outcome o = {0};
    tp_extra x;
    train_against_baseline(2, 2, &(tp_options){.drop_f_backward = 1}, 2, &o, &x);
    printf("negative control, tp 2 without f's backward all-reduce: grads differ by %.2e"
           " (%.0fx the tolerance), replicas drift %.2e\n", o.result.diff_grads,
           o.result.diff_grads / TOL_GRADS, x.replica_drift);
    ck_assert_msg(o.result.diff_grads > 100 * TOL_GRADS, "grads differ by only %g",
                  o.result.diff_grads);
    ck_assert(x.replica_drift > 0);
    strategy_outcome_free(&o);
}
END_TEST

START_TEST(the_largest_tp_size_divides_heads_and_ranks) {
    run_config cfg = tiny_config(4);
    ck_assert_int_eq(tp_largest_size(&cfg), 4);
    cfg.comm.ranks = 5;   /* 5 does not divide the 12 heads; 1 is no TP */
    ck_assert_int_eq(tp_largest_size(&cfg), 1);
}
END_TEST

int main(void) {
    Suite *suite = suite_create("tp");
    TCase *tc = tcase_create("tp");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, tp2_matches_the_baseline);
    tcase_add_test(tc, tp3_with_a_padded_vocabulary_matches_the_baseline);
    tcase_add_test(tc, tp2_times_dp2_matches_the_baseline);
    tcase_add_test(tc, tp_without_f_backward_fails_the_comparison);
    tcase_add_test(tc, the_largest_tp_size_divides_heads_and_ranks);
    suite_add_tcase(suite, tc);
    return check_run(suite, 0);
}
