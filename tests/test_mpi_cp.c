/* Context parallelism on Open MPI processes (mpirun -np 1..4, CK_FORK=no): the world is
 * the CP group. Ring attention (contiguous and balanced) and Ulysses against the
 * baseline, and each layer's bytes against the formula (MPI counts send/recv and
 * all-to-all bytes by their textbook volume, which is what the formulas say). ctx 24
 * splits into 2P pieces and heads 12 into P for every P up to 4. Judged in world rank
 * 0's process (check_expect); every process waits for the verdict (check_agree).
 *
 * Tolerances as in test_cp.c (tolerances.h): loss 1e-5, step-1 gradients 1e-6,
 * parameters after 3 AdamW steps 1e-4. */
#include <check.h>
#include <stdio.h>

#include "baseline.h"
#include "check_run.h"
#include "cp_train.h"
#include "tolerances.h"

static void check_training(cp_options opts) {
    const int W = check_world_size();
    run_config cfg = run_config_default();
    cfg.model = (gpt_config){.vocab = 256, .ctx = 24, .layers = 2, .heads = 12, .dim = 24};
    cfg.batch = 4;
    cfg.steps = 3;
    cfg.quiet = 1;
    cfg.comm.timeout_seconds = 60;
    dataset *d = dataset_builtin();
    baseline_run *b = process_hosts_rank0() ? baseline_train(&cfg, d) : NULL;
    cp_extra extra = {0};
    strategy_outcome out = {.extra = &extra};
    ck_assert_int_eq(cp_launch(&cfg, d, W, &opts, &out), 0);
    check_verdict v = {0};
    if (b) {
        strategy_outcome_compare(&out, b);
        const run_result *r = &out.result;
        printf("mpi cp %d %s, 3 steps: max diff loss %.2e (tol %.0e), grads of step 1 %.2e"
               " (tol %.0e), params %.2e (tol %.0e); bytes per layer %.0f (formula %.0f)\n", W,
               opts.kind == CP_RING ? cp_split_name(opts.split) : "ulysses", r->diff_loss, TOL_LOSS,
               r->diff_grads, TOL_GRADS, r->diff_params, TOL_PARAMS, extra.cp_bytes_per_layer,
               extra.cp_bytes_per_layer_formula);
        fflush(stdout);
        check_expect(&v, r->diff_loss <= TOL_LOSS);
        check_expect(&v, r->diff_grads <= TOL_GRADS);
        check_expect(&v, r->diff_params <= TOL_PARAMS);
        check_expect(&v, extra.cp_bytes_per_layer == extra.cp_bytes_per_layer_formula);
        baseline_free(b);
    }
    strategy_outcome_free(&out);
    dataset_free(d);
    check_agree(&v);
}

START_TEST(ring_over_all_processes_matches_the_baseline) {
    check_training((cp_options){.kind = CP_RING, .split = CP_CONTIGUOUS});
}
END_TEST
START_TEST(balanced_ring_over_all_processes_matches_the_baseline) {
    check_training((cp_options){.kind = CP_RING, .split = CP_BALANCED});
}
END_TEST
START_TEST(ulysses_over_all_processes_matches_the_baseline) {
    check_training((cp_options){.kind = CP_ULYSSES});
}
END_TEST

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    Suite *suite = suite_create("mpi_cp");
    TCase *training = tcase_create("training");
    tcase_set_timeout(training, 120);
    tcase_add_test(training, ring_over_all_processes_matches_the_baseline);
    tcase_add_test(training, balanced_ring_over_all_processes_matches_the_baseline);
    tcase_add_test(training, ulysses_over_all_processes_matches_the_baseline);
    suite_add_tcase(suite, training);
    return check_run(suite, 1);
}
