/* Chapter 2 on Open MPI processes (mpirun -np 1..4): every stage against the
 * single-device baseline, a negative control, the model-state bytes against the
 * formula, and the modelled bytes against ring theory. World rank 0's process judges
 * (check_expect), every process waits for its verdict (check_agree). Tests that need
 * more ranks than mpirun gave are skipped with a SKIP line. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "baseline.h"
#include "compare.h"
#include "estimate.h"
#include "tables.h"
#include "tolerances.h"
#include "small_model.h"
#include "strategy_runs.h"
#include "zero_train.h"
#include "check_run.h"

/* The same uneven model as test_chapter2.c: no slab divides by 3 or 4, 5 sequences. */
static run_config tiny_config(void) {
    run_config cfg = uneven_model_config(check_world_size());
    cfg.comm.timeout_seconds = 60;
    return cfg;
}

START_TEST(every_stage_matches_the_baseline) {
    const int N = check_world_size();
    dataset *d = dataset_builtin();
    run_config cfg = tiny_config();
    baseline_run *b = process_hosts_rank0() ? baseline_train(&cfg, d) : NULL;
    check_verdict v = {0};
    for (int variant = 0; variant < 5; variant++) {
        zero_options opts = {.stage = variant < 4 ? variant : 3, .prefetch = variant == 4};
        strategy_outcome o = launch_zero(&cfg, d, opts);
        if (process_hosts_rank0()) {
            compare_to_baseline(&o.result, b, o.loss, o.first_grads, o.final_params);
            printf("mpi stage %d%s, %d ranks: max |diff| loss %.2e (tol %.0e) grads %.2e"
                   " (tol %.0e) params %.2e (tol %.0e)\n", opts.stage,
                   opts.prefetch ? " +prefetch" : "", N, o.result.diff_loss, TOL_LOSS,
                   o.result.diff_grads, TOL_GRADS, o.result.diff_params, TOL_PARAMS);
            check_expect(&v, o.result.diff_loss <= TOL_LOSS);
            check_expect(&v, o.result.diff_grads <= TOL_GRADS);
            check_expect(&v, o.result.diff_params <= TOL_PARAMS);
        }
        zero_outcome_free(&o);
    }
    baseline_free(b);
    dataset_free(d);
    check_agree(&v);
}
END_TEST

START_TEST(negative_control_fails) {
    const int N = check_world_size();
    dataset *d = dataset_builtin();
    run_config cfg = tiny_config();
    baseline_run *b = process_hosts_rank0() ? baseline_train(&cfg, d) : NULL;
    zero_options opts = {.stage = 1, .fault = ZERO_FAULT_SKIP_PARAM_ALLGATHER};
    strategy_outcome o = launch_zero(&cfg, d, opts);
    check_verdict v = {0};
    if (process_hosts_rank0()) {
        compare_to_baseline(&o.result, b, o.loss, o.first_grads, o.final_params);
        double worst = zero_worst_fraction_of_tolerance(&o.result, &(run_tolerances){TOL_GRADS, TOL_LOSS, TOL_PARAMS}, 1);
        printf("mpi negative control (stage 1 without the parameter all-gather), %d ranks:"
               " max |diff| params %.2e = %.0fx the tolerance\n", N, o.result.diff_params,
               worst);
        check_expect(&v, worst > 10);
    }
    zero_outcome_free(&o);
    baseline_free(b);
    dataset_free(d);
    check_agree(&v);
}
END_TEST

START_TEST(model_state_and_bytes_match_the_formulas) {
    const int N = check_world_size();
    dataset *d = dataset_builtin();
    run_config cfg = tiny_config();
    cfg.steps = 2;
    gpt_shape s = gpt_shape_make(&cfg.model, 1, 0);
    const size_t P = gpt_num_params(&s);
    check_verdict v = {0};
    for (int stage = 0; stage <= 3; stage++) {
        strategy_outcome o = launch_zero(&cfg, d, (zero_options){.stage = stage});
        if (process_hosts_rank0()) {
            double measured = o.state[0] + o.state[1] + o.state[2];
            double formula = stage_stored_formula(stage, P, N, PRECISION_FP32);
            double padding = stage_padding_bytes(&o, P);
            comm_plan plan = zero_comm_plan(&s, stage, PRECISION_FP32);
            double sent = 0, theory = 0;
            for (int k = 0; k < COMM_NKINDS; k++) {
                check_expect(&v, o.comm_calls[k] == plan.calls[k]);
                sent += o.comm_bytes[k];
                theory += ring_bytes(plan.elements[k], N);
            }
            printf("mpi stage %d, %d ranks: model state %.0f B = formula %.0f + uneven %.0f;"
                   " sent %.0f B/step, ring theory %.0f\n", stage, N, measured, formula,
                   padding, sent, theory);
            check_expect(&v, fabs(measured - (formula + padding)) < 1e-6);
            check_expect(&v, fabs(sent - theory) <= 8.0 * gpt_num_slabs(&s) * 3);
        }
        zero_outcome_free(&o);
    }
    dataset_free(d);
    check_agree(&v);
}
END_TEST

int main(void) {
    Suite *suite = suite_create("mpi_chapter2");
    TCase *tc = tcase_create("zero");
    tcase_add_test(tc, every_stage_matches_the_baseline);
    check_add_test_where(tc, negative_control_fails, check_world_size() >= 2,
                         "needs 2 or more ranks (one rank has nothing to all-gather)");
    tcase_add_test(tc, model_state_and_bytes_match_the_formulas);
    suite_add_tcase(suite, tc);
    return check_run(suite, 1);
}
