/* TP's collective matmuls (--tp-overlap) on Open MPI processes (mpirun -np 1..4 with
 * CK_FORK=no): TP + SP over every process with 2 chunks, forward and backward, against
 * the same without them, within TP's tolerances (fp32 and bf16: backward's products per
 * chunk are shorter GEMMs than the plain layer's, which may round a row's last bit
 * otherwise, test_tp_overlap.c), and the negative controls (the chunks' order swapped,
 * in both passes and in backward alone) far outside. World rank 0's process judges (check_expect) and
 * every process waits for the verdict (check_agree); a world of 1 or 3 (SP needs tp > 1
 * dividing ctx 8) is skipped with a SKIP line. */
#include <check.h>
#include <math.h>
#include <stdio.h>

#include "check_run.h"
#include "floats.h"
#include "tolerances.h"
#include "baseline.h"
#include "tp_overlap.h"
#include "tp_train.h"

typedef struct {
    run_config cfg;
    const dataset *data;
    tp_options opts;
    strategy_outcome run;   /* world rank 0's, allocated before the ranks start */
} overlap_case;

static int train_rank(comm *world, void *p) {
    overlap_case *c = p;
    const int t = comm_size(world);
    mesh m;
    mesh_create(&m, world, (mesh_shape){.tp = t, .pp = 1, .dp = 1});
    strategy_outcome local, *run = strategy_outcome_for_rank(world, &c->run, &local);
    tp_train(world, &m, &c->cfg, &c->opts, c->data, run);
    mesh_free(&m);
    return 0;
}

/* One run of opts; its outcome (world rank 0's process: the buffers) into c->run. */
static void train(overlap_case *c, precision p, tp_options opts, const dataset *d) {
    c->cfg = run_config_default();
    c->cfg.model = (gpt_config){.vocab = 256, .ctx = 8, .layers = 2, .heads = 12, .dim = 24};
    c->cfg.batch = 2;
    c->cfg.steps = 3;
    c->cfg.quiet = 1;
    c->cfg.precision = p;
    c->data = d;
    c->opts = opts;
    strategy_outcome_alloc(&c->run, &c->cfg);
    comm_options o = comm_options_default();
    o.timeout_seconds = 60;
    ck_assert_int_eq(launch(&o, train_rank, c), 0);
}

/* control: TP_OVERLAP_RIGHT, or the swapped chunks (must differ far past the tolerance) */
static void check_overlap(precision p, tp_overlap_control control) {
    dataset *d = dataset_builtin();
    overlap_case plain = {0}, chunked = {0};
    train(&plain, p, (tp_options){.sequence_parallel = 1}, d);
    train(&chunked, p, (tp_options){.sequence_parallel = 1, .tp_overlap_chunks = 2,
                                    .tp_overlap_control = control}, d);
    check_verdict v = {0};
    if (process_hosts_rank0()) {
        const int W = check_world_size();
        baseline_run *b = baseline_train(&plain.cfg, d);
        run_tolerances tol = tp_run_tolerances(&plain.cfg, W, b);
        baseline_free(b);
        const size_t n = plain.run.num_params;
        const double grads = max_abs_diff(plain.run.first_grads, chunked.run.first_grads, n);
        const double params = max_abs_diff(plain.run.final_params, chunked.run.final_params, n);
        printf("mpi tp %d + sp, %s, 2 chunks%s against none: max |diff| grads %.2e params"
               " %.2e (tolerance %.0e, %.0e)\n", W, precision_name(p),
               control == TP_OVERLAP_SWAPPED            ? " (negative control: swapped)"
               : control == TP_OVERLAP_SWAPPED_BACKWARD ? " (negative control: backward's"
                                                          " chunks swapped)"
                                                        : "",
               grads,
               params, tol.grads, tol.params);
        fflush(stdout);
        if (control == TP_OVERLAP_RIGHT) {
            check_expect(&v, grads <= tol.grads);
            check_expect(&v, params <= tol.params);
        } else {
            check_expect(&v, grads > 100 * tol.grads);
        }
    }
    strategy_outcome_free(&plain.run);
    strategy_outcome_free(&chunked.run);
    dataset_free(d);
    check_agree(&v);
}

START_TEST(overlap_fp32_matches_no_overlap) { check_overlap(PRECISION_FP32, TP_OVERLAP_RIGHT); }
END_TEST
START_TEST(overlap_bf16_matches_no_overlap) { check_overlap(PRECISION_BF16, TP_OVERLAP_RIGHT); }
END_TEST
START_TEST(swapped_chunks_fail) { check_overlap(PRECISION_FP32, TP_OVERLAP_SWAPPED); }
END_TEST
START_TEST(backward_swapped_chunks_fail) {
    check_overlap(PRECISION_FP32, TP_OVERLAP_SWAPPED_BACKWARD);
}
END_TEST

int main(void) {
    Suite *suite = suite_create("mpi_tp_overlap");
    TCase *tc = tcase_create("mpi_tp_overlap");
    tcase_set_timeout(tc, 120);
    const int W = check_world_size(), fits = W == 2 || W == 4;
    const char *why = "SP needs a TP group of 2 or 4 (dividing ctx 8, heads 12, dim 24)";
    check_add_test_where(tc, overlap_fp32_matches_no_overlap, fits, why);
    check_add_test_where(tc, overlap_bf16_matches_no_overlap, fits, why);
    check_add_test_where(tc, swapped_chunks_fail, fits, why);
    check_add_test_where(tc, backward_swapped_chunks_fail, fits, why);
    suite_add_tcase(suite, tc);
    return check_run(suite, 1);
}
