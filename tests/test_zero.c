/* The library's ZeRO (common/parallel/dp/zero_train.h) on thread ranks, through its own
 * launch helper and outcome, without any chapter: every stage against the single-device
 * baseline, the model-state bytes against the stored formula, and a negative control per
 * stage (a reduction or gather left out) that the comparison must catch. Also the
 * outcome's contract: world rank 0's buffers are the caller's. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "baseline.h"
#include "compare.h"
#include "tolerances.h"
#include "zero_train.h"
#include "check_run.h"

/* Slabs that do not divide by 3 (embedding 256*25 + 7*25, blocks 12*625 + 13*25, final
 * LayerNorm 50) and a batch of 5, uneven on 2 and 3 ranks. */
static run_config tiny_config(int ranks) {
    run_config cfg = run_config_default();
    cfg.model = (gpt_config){.vocab = 256, .ctx = 7, .layers = 2, .heads = 5, .dim = 25};
    cfg.batch = 5;
    cfg.steps = TOL_STEPS;
    cfg.quiet = 1;
    cfg.comm.ranks = ranks;
    cfg.comm.timeout_seconds = 30;
    return cfg;
}

/* One stage's run, compared with b; returns the worst difference over its tolerance. */
static double run_against(const run_config *cfg, const dataset *d, const baseline_run *b,
                          zero_options opts, strategy_outcome *o, zero_extra *x) {
    o->extra = x;
    ck_assert_int_eq(zero_launch(cfg, d, &opts, o), 0);
    ck_assert_ptr_nonnull(o->first_grads);
    compare_to_baseline(&o->result, b, o->loss, o->first_grads, o->final_params);
    return zero_worst_fraction_of_tolerance(&o->result, &(run_tolerances){TOL_GRADS, TOL_LOSS, TOL_PARAMS}, 1);
}

START_TEST(every_stage_matches_the_baseline_and_its_state_formula) {
    dataset *d = dataset_builtin();
    for (int ranks = 2; ranks <= 3; ranks++) {
        run_config cfg = tiny_config(ranks), base = cfg;
        base.comm.ranks = 1;
        baseline_run *b = baseline_train(&base, d);
        for (int stage = 0; stage < ZERO_STAGES; stage++) {
            strategy_outcome o = {0};
            zero_extra x;
            double worst = run_against(&cfg, d, b, (zero_options){.stage = stage}, &o, &x);
            const double P = (double)o.num_params;
            const state_bytes f = zero_stored_bytes(stage, P, ranks, PRECISION_FP32);
            const double measured = o.state[0] + o.state[1] + o.state[2];
            printf("zero%d on %d ranks: max |diff| loss %.2e grads %.2e params %.2e (%.2f of"
                   " the tolerance); state %.0f B, formula %.0f B\n", stage, ranks,
                   o.result.diff_loss, o.result.diff_grads, o.result.diff_params, worst,
                   measured, state_total(f));
            ck_assert_msg(worst <= 1, "zero%d on %d ranks: %.2f of the tolerance", stage,
                          ranks, worst);
            ck_assert_int_eq(x.opts.stage, stage);
            ck_assert_int_eq(o.world_size, ranks);
            /* exactly: what is whole is 4P, what is sharded 4 x the largest rank's piece
             * (uneven shards: up to one element per slab beyond P/N) */
            const double whole = 4.0 * P, shard = 4.0 * (double)x.shard_len_largest;
            ck_assert(o.state[0] == (stage <= 2 ? whole : shard));
            ck_assert(o.state[1] == (stage <= 1 ? whole : shard));
            ck_assert(o.state[2] == 2 * (stage == 0 ? whole : shard));
            ck_assert(measured >= state_total(f));
            strategy_outcome_free(&o);
        }
        baseline_free(b);
    }
    dataset_free(d);
}
END_TEST

/* Negative controls: each leaves out one collective, and the comparison must fail. */
START_TEST(a_stage_without_its_reduction_or_gather_fails_the_comparison) {
    dataset *d = dataset_builtin();
    run_config cfg = tiny_config(2), base = cfg;
    base.comm.ranks = 1;
    baseline_run *b = baseline_train(&base, d);
    const struct { int stage; zero_fault fault; } cases[] = {
        {0, ZERO_FAULT_SKIP_GRAD_REDUCE}, {1, ZERO_FAULT_SKIP_PARAM_ALLGATHER},
        {2, ZERO_FAULT_SKIP_PARAM_ALLGATHER}, {3, ZERO_FAULT_SKIP_GRAD_REDUCE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        strategy_outcome o = {0};
        zero_extra x;
        const zero_options opts = {.stage = cases[i].stage, .fault = cases[i].fault};
        double worst = run_against(&cfg, d, b, opts, &o, &x);
        printf("negative control zero%d fault %d: max |diff| grads %.2e params %.2e (%.0fx"
               " the tolerance)\n", cases[i].stage, cases[i].fault, o.result.diff_grads,
               o.result.diff_params, worst);
        ck_assert_msg(worst > 10, "zero%d with fault %d went unnoticed", cases[i].stage,
                      cases[i].fault);
        strategy_outcome_free(&o);
    }
    baseline_free(b);
    dataset_free(d);
}
END_TEST

int main(void) {
    Suite *suite = suite_create("zero");
    TCase *tc = tcase_create("zero");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, every_stage_matches_the_baseline_and_its_state_formula);
    tcase_add_test(tc, a_stage_without_its_reduction_or_gather_fails_the_comparison);
    suite_add_tcase(suite, tc);
    return check_run(suite, 0);
}
