/* Chapter 9: Megatron sequence parallelism and selective recomputation.
 *   - TP + SP at tp 2 and 4 trains the whole model to the single-device baseline's loss,
 *     gradients and parameters (TP's tolerances), and moves exactly the formula's bytes:
 *     TP's all-reduces as reduce-scatters + all-gathers, plus SP's own additions;
 *   - negative control: a reduce-scatter replaced by a copy of the rank's own partial
 *     sum fails the comparison;
 *   - selective recomputation gives gradients bit for bit those of no recomputation;
 *   - activation bytes per layer per rank, measured through the allocator's tags, equal
 *     the re-derived Korthikanti expressions exactly for the six configurations. */
#include <check.h>
#include <math.h>
#include <stdio.h>

#include "activation_memory.h"
#include "baseline.h"
#include "check_run.h"
#include "small_model.h"
#include "compare.h"
#include "floats.h"
#include "sequence.h"
#include "tolerances.h"
#include "tp_train.h"


/* TP size `ranks` with opts in precision p, against the baseline, into o and x; tol:
 * TP's tolerances in p. */
static void train_against_baseline(int ranks, precision p, const tp_options *opts, int steps,
                                   strategy_outcome *o, tp_extra *x, run_tolerances *tol) {
    run_config cfg = sequence_model_config(ranks), base = cfg;
    cfg.steps = base.steps = steps;
    cfg.precision = base.precision = p;
    base.comm.ranks = 1;
    dataset *d = dataset_builtin();
    baseline_run *b = baseline_train(&base, d);
    *tol = tp_run_tolerances(&cfg, ranks, b);
    o->extra = x;
    ck_assert_int_eq(tp_launch(&cfg, d, ranks, opts, o), 0);
    compare_to_baseline(&o->result, b, o->loss, o->first_grads, o->final_params);
    baseline_free(b);
    dataset_free(d);
}

static void check_sp(int t, precision p) {
    strategy_outcome o = {0};
    tp_extra x;
    run_tolerances tol;
    train_against_baseline(t, p, &(tp_options){.sequence_parallel = 1}, TOL_STEPS, &o, &x,
                           &tol);
    const run_result *r = &o.result;
    const double worst = run_worst_fraction_of_tolerance(r, tol.grads, tol.loss, tol.params);
    const run_config cfg = sequence_model_config(t);
    const double added = tp_sequence_bytes_added(&cfg.model, p, cfg.batch, cfg.model.ctx, t);
    const double tp_only = tp_bytes_formula(&cfg.model, p, cfg.batch, cfg.model.ctx, t, 1, 0);
    printf("tp %d + sp, %s: max |diff| loss %.2e grads %.2e params %.2e (%.2f of the"
           " tolerance); drift %.1e; bytes %.0f = formula %.0f (TP's %.0f + SP's %.0f)\n", t,
           precision_name(p), r->diff_loss, r->diff_grads, r->diff_params, worst,
           x.replica_drift, r->bytes_sent_per_step, r->bytes_formula, tp_only, added);
    ck_assert_msg(worst <= 1, "tp %d + sp: %.2f of the tolerance", t, worst);
    ck_assert(x.replica_drift == 0.0);
    ck_assert_int_eq(x.sequence_parallel, 1);
    ck_assert_msg(r->bytes_sent_per_step == r->bytes_formula, "bytes %.0f, formula %.0f",
                  r->bytes_sent_per_step, r->bytes_formula);
    strategy_outcome_free(&o);
}

START_TEST(tp2_with_sp_matches_the_baseline) { check_sp(2, PRECISION_FP32); }
END_TEST
START_TEST(tp4_with_sp_matches_the_baseline) { check_sp(4, PRECISION_FP32); }
END_TEST
/* bf16: the vocab-parallel head in 16 bits, TP's bf16 tolerances */
START_TEST(tp2_with_sp_in_bf16_matches_the_baseline) { check_sp(2, PRECISION_BF16); }
END_TEST

/* TP 2 + SP x DP 2 on 4 ranks with 16-bit gradients (--grad-dtype = --precision): the
 * DP buckets all-reduce the 16-bit gradients, TP's 16-bit bounds widened by
 * tolerances_with_grads16 for 2 parts; the bytes equal the formula less the 2 B a
 * gradient 16 bits leave off. sp_copy: the negative control's g-bar, a copy. */
static void check_sp_grads16(precision p, int sp_copy, run_result *out) {
    run_config cfg = sequence_model_config(4), base = cfg;
    cfg.precision = cfg.grad_precision = base.precision = p;
    base.comm.ranks = 1;
    dataset *d = dataset_builtin();
    baseline_run *b = baseline_train(&base, d);
    const run_tolerances tol = tolerances_with_grads16(tp_run_tolerances(&cfg, 2, b), &cfg, 2,
                                                       baseline_largest_grad(b));
    tp_extra x;
    strategy_outcome o = {.extra = &x};
    const tp_options opts = {.sequence_parallel = 1, .sp_copy_not_reduce = sp_copy};
    ck_assert_int_eq(tp_launch(&cfg, d, 2, &opts, &o), 0);
    compare_to_baseline(&o.result, b, o.loss, o.first_grads, o.final_params);
    const run_result *r = &o.result;
    const double worst = run_worst_fraction_of_tolerance(r, tol.grads, tol.loss, tol.params);
    printf("tp 2 + sp x dp 2, %s with %s gradients%s: max |diff| loss %.2e grads %.2e params"
           " %.2e (%.2f of the tolerance); bytes %.0f = formula %.0f\n", precision_name(p),
           precision_name(p), sp_copy ? " (g-bar a copy)" : "", r->diff_loss, r->diff_grads,
           r->diff_params, worst, r->bytes_sent_per_step, r->bytes_formula);
    fflush(stdout);
    *out = *r;
    out->loss = NULL;
    if (!sp_copy) {
        ck_assert_msg(worst <= 1, "%.2f of the tolerance", worst);
        ck_assert(x.replica_drift == 0.0 && x.dp == 2);
        ck_assert_msg(r->bytes_sent_per_step == r->bytes_formula, "bytes %.0f, formula %.0f",
                      r->bytes_sent_per_step, r->bytes_formula);
    } else {
        ck_assert_msg(r->diff_grads > 2 * tol.grads, "grads differ by only %g (tolerance %g)",
                      r->diff_grads, tol.grads);
    }
    strategy_outcome_free(&o);
    baseline_free(b);
    dataset_free(d);
}

START_TEST(tp2_with_sp_and_16_bit_grads_matches_the_baseline) {
    run_result r;
    check_sp_grads16(PRECISION_BF16, 0, &r);
    check_sp_grads16(PRECISION_FP16, 0, &r);
    check_sp_grads16(PRECISION_BF16, 1, &r);   /* negative control */
}
END_TEST

START_TEST(sp_without_a_reduce_scatter_fails_the_comparison) {
    strategy_outcome o = {0};
    tp_extra x;
    run_tolerances tol;
    train_against_baseline(2, PRECISION_FP32,
                           &(tp_options){.sequence_parallel = 1, .sp_copy_not_reduce = 1}, 2,
                           &o, &x, &tol);
    printf("negative control, tp 2 + sp with g-bar a copy of the rank's own partial sum:"
           " loss differs by %.2e, grads by %.2e (%.0fx the tolerance)\n", o.result.diff_loss,
           o.result.diff_grads, o.result.diff_grads / TOL_GRADS);
    ck_assert_msg(o.result.diff_grads > 100 * TOL_GRADS, "grads differ by only %g",
                  o.result.diff_grads);
    strategy_outcome_free(&o);
}
END_TEST

/* TP 2 (with SP or not) trained with recomputation against the same without: the
 * recomputed probabilities are the same numbers, so gradients, loss and parameters are
 * identical bit for bit. */
static void check_recompute_is_exact(tp_options with) {
    run_config cfg = sequence_model_config(2);
    cfg.steps = 2;
    dataset *d = dataset_builtin();
    strategy_outcome kept = {0}, again = {0};
    tp_extra x;
    kept.extra = again.extra = &x;
    tp_options without = with;
    without.recompute_attention = without.checkpoint_activations = 0;
    ck_assert_int_eq(tp_launch(&cfg, d, 2, &without, &kept), 0);
    ck_assert_int_eq(tp_launch(&cfg, d, 2, &with, &again), 0);
    const size_t n = kept.num_params;
    const double grads = max_abs_diff(kept.first_grads, again.first_grads, n);
    const double params = max_abs_diff(kept.final_params, again.final_params, n);
    printf("tp 2%s, %s recomputation against none: max |diff| grads %.1e params %.1e loss"
           " %.1e\n", with.sequence_parallel ? " + sp" : "",
           with.recompute_attention ? "selective" : "full", grads, params,
           fabs(kept.loss[1] - again.loss[1]));
    ck_assert(grads == 0.0 && params == 0.0 && kept.loss[1] == again.loss[1]);
    strategy_outcome_free(&kept);
    strategy_outcome_free(&again);
    dataset_free(d);
}

START_TEST(selective_recomputation_gives_the_same_numbers) {
    check_recompute_is_exact((tp_options){.recompute_attention = 1});
    check_recompute_is_exact((tp_options){.recompute_attention = 1, .sequence_parallel = 1});
}
END_TEST
START_TEST(full_recomputation_gives_the_same_numbers) {
    check_recompute_is_exact((tp_options){.checkpoint_activations = 1, .sequence_parallel = 1});
}
END_TEST

/* The six configurations' bytes per layer, measured, against the re-derived ones. */
static void check_memory(precision p) {
    run_config cfg = sequence_model_config(4);
    cfg.precision = p;
    memory_report r;
    ck_assert_int_eq(memory_launches(&cfg, 4, &r), 0);
    for (int i = 0; i < MEMORY_SETUPS; i++) {
        printf("%s %-20s measured %8.0f B per layer, re-derived %8.0f\n", precision_name(p),
               memory_setup_names[i], r.measured[i], r.derived[i]);
        ck_assert_msg(r.measured[i] == r.derived[i], "%s: measured %.0f, re-derived %.0f",
                      memory_setup_names[i], r.measured[i], r.derived[i]);
    }
    /* negative control: the paper's own count, scaled to e bytes, is not this model's */
    const double paper_scaled = r.paper[0] * precision_bytes(p) / 2;
    printf("%s none: the paper's s b h (34 + 5 a s / h) at %zu B an element would be %.0f B,"
           " measured %.0f: the comparison tells them apart\n", precision_name(p),
           precision_bytes(p), paper_scaled, r.measured[0]);
    ck_assert(paper_scaled != r.measured[0]);
    /* what the paper says SP and selective recomputation do, here too */
    ck_assert(r.measured[2] < r.measured[1] && r.measured[3] < r.measured[1]);
    ck_assert(r.measured[4] < r.measured[2] && r.measured[4] < r.measured[3]);
    ck_assert(r.measured[5] < r.measured[4]);
}

START_TEST(activation_bytes_equal_the_re_derived_expressions) { check_memory(PRECISION_FP32); }
END_TEST
/* 2-byte activations, fp32 LayerNorm statistics: e = 2 in the same expressions */
START_TEST(bf16_activation_bytes_equal_the_re_derived_expressions) {
    check_memory(PRECISION_BF16);
}
END_TEST

int main(void) {
    Suite *suite = suite_create("chapter9");
    TCase *tc = tcase_create("sequence");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, tp2_with_sp_matches_the_baseline);
    tcase_add_test(tc, tp4_with_sp_matches_the_baseline);
    tcase_add_test(tc, tp2_with_sp_in_bf16_matches_the_baseline);
    tcase_add_test(tc, tp2_with_sp_and_16_bit_grads_matches_the_baseline);
    tcase_add_test(tc, sp_without_a_reduce_scatter_fails_the_comparison);
    tcase_add_test(tc, selective_recomputation_gives_the_same_numbers);
    tcase_add_test(tc, full_recomputation_gives_the_same_numbers);
    tcase_add_test(tc, activation_bytes_equal_the_re_derived_expressions);
    tcase_add_test(tc, bf16_activation_bytes_equal_the_re_derived_expressions);
    suite_add_tcase(suite, tc);
    return check_run(suite, 0);
}
