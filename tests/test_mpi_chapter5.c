/* Chapter 5 on Open MPI processes: the mesh that -np gives (1: 1 x 1 x 1, 2: 1 x 2 x 1,
 * 4: 2 x 2 x 1, 8: 2 x 2 x 2) trains the baseline's model, with ZeRO-1 across dp where
 * there is dp, and every rank's bytes on each group kind equal their formulas; the
 * negative control drops the TP f backward. ZeRO-2 and ZeRO-3 across dp on (2,2,2) at 8
 * processes and on (2,1,2) at 4, every rank's model state equal to its formula, and a
 * ZeRO-3 without its gradient reduce-scatter failing. bf16 with bf16 gradients at ZeRO
 * 1 and 3 on those meshes, and without the 16-bit dp reduction failing. World rank 0's
 * process judges (check_expect), every process waits for its verdict (check_agree). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "check_run.h"
#include "small_model.h"
#include "strategy_runs.h"
#include "tolerances.h"
#include "tp_train.h"

static mesh_shape mesh_for(int world) {
    switch (world) {
    case 2: return (mesh_shape){.tp = 1, .pp = 2, .dp = 1, .cp = 1};
    case 4: return (mesh_shape){.tp = 2, .pp = 2, .dp = 1, .cp = 1};
    case 8: return (mesh_shape){.tp = 2, .pp = 2, .dp = 2, .cp = 1};
    default: return (mesh_shape){.tp = 1, .pp = world, .dp = 1, .cp = 1};
    }
}

static run_config small_config(void) {
    run_config cfg = small_model_config(6, check_world_size());
    cfg.comm.timeout_seconds = 60;
    return cfg;
}

/* The mesh with dp for ZeRO-2 and -3: (2,2,2) at 8 processes, (2,1,2) at 4. */
static mesh_shape zero_mesh_for(int world) {
    return world == 8 ? (mesh_shape){.tp = 2, .pp = 2, .dp = 2, .cp = 1} : (mesh_shape){.tp = 2, .pp = 1, .dp = 2, .cp = 1};
}

/* p: the precision of the run and of its gradients (fp32, or 16 bits with --grad-dtype
 * in the same), against the baseline in the same. */
static void run_in(mesh_shape shape, pipeline_options opts, int expect_match, precision p) {
    dataset *d = dataset_builtin();
    run_config cfg = small_config();
    cfg.precision = cfg.grad_precision = p;
    baseline_run *b = process_hosts_rank0() ? baseline_train(&cfg, d) : NULL;
    check_verdict v = {0};
    mesh_result *o = launch_mesh(&cfg, d, shape, opts, b);
    if (b) {
        const run_result *r = &o->run.result;
        double state_error = 0;
        for (int w = 0; w < mesh_world(&shape); w++)
            for (int i = 0; i < 3; i++)
                state_error = fmax(state_error,
                                   fabs(o->x.ranks[w].state[i] - o->x.ranks[w].state_formula[i]));
        /* 16-bit gradients: test_chapter5_mixed's bounds */
        const run_tolerances t =
            p == PRECISION_FP32
                ? (run_tolerances){MESH_TOL_GRADS, MESH_TOL_LOSS, MESH_TOL_PARAMS}
                : tolerances_with_grads16(tp_run_tolerances(&cfg, shape.tp, b), &cfg, shape.dp,
                                          baseline_largest_grad(b));
        printf("mpi %s tp %d x pp %d x dp %d, zero %d%s: max |diff| loss %.2e grads %.2e params "
               "%.2e (bounds %.1e %.1e %.1e); bytes vs formula %.1e; state vs formula %.0f B\n",
               precision_name(p), shape.tp, shape.pp, shape.dp, opts.zero_stage,
               expect_match ? "" : ", with a fault", r->diff_loss, r->diff_grads, r->diff_params,
               t.loss, t.grads, t.params, o->x.worst_bytes_error, state_error);
        if (expect_match) {
            check_expect(&v, r->diff_grads <= t.grads);
            check_expect(&v, r->diff_loss <= t.loss);
            check_expect(&v, r->diff_params <= t.params);
            check_expect(&v, o->x.worst_bytes_error <= 1e-3);
            check_expect(&v, state_error == 0);
        } else {
            check_expect(&v, r->diff_grads > (p == PRECISION_FP32 ? 100 : 3) * t.grads);
        }
    }
    mesh_result_free(o);
    check_agree(&v);
    baseline_free(b);
    dataset_free(d);
}

static void run_on(mesh_shape shape, pipeline_options opts, int expect_match) {
    run_in(shape, opts, expect_match, PRECISION_FP32);
}

static void run_case(pipeline_options opts, int expect_match) {
    run_on(mesh_for(check_world_size()), opts, expect_match);
}

START_TEST(the_mesh_matches_the_baseline) {
    pipeline_options opts = {.schedule = PP_1F1B, .micro = 4, .chunks = 1,
                             .zero_stage = mesh_for(check_world_size()).dp > 1};
    run_case(opts, 1);
}
END_TEST

START_TEST(zero2_and_zero3_match_the_baseline) {
    for (int zero = 2; zero <= 3; zero++)
        run_on(zero_mesh_for(check_world_size()),
               (pipeline_options){.schedule = PP_1F1B, .micro = 4, .chunks = 1,
                                  .zero_stage = zero}, 1);
}
END_TEST

START_TEST(zero3_without_its_reduce_scatter_fails) {
    run_on(zero_mesh_for(check_world_size()),
           (pipeline_options){.schedule = PP_1F1B, .micro = 4, .chunks = 1, .zero_stage = 3,
                              .fault = PIPELINE_FAULT_SKIP_DP_REDUCE}, 0);
}
END_TEST

START_TEST(without_f_backward_it_fails) {
    run_case((pipeline_options){.schedule = PP_1F1B, .micro = 4, .chunks = 1,
                                .fault = PIPELINE_FAULT_DROP_F_BACKWARD}, 0);
}
END_TEST

/* bf16 with bf16 gradients, reduced in 16 bits over dp, at ZeRO 1 and 3; and without
 * that reduction. */
START_TEST(sixteen_bit_gradients_match_the_baseline) {
    for (int zero = 1; zero <= 3; zero += 2)
        run_in(zero_mesh_for(check_world_size()),
               (pipeline_options){.schedule = PP_1F1B, .micro = 4, .chunks = 1,
                                  .zero_stage = zero}, 1, PRECISION_BF16);
    run_in(zero_mesh_for(check_world_size()),
           (pipeline_options){.schedule = PP_1F1B, .micro = 4, .chunks = 1, .zero_stage = 1,
                              .fault = PIPELINE_FAULT_SKIP_DP_REDUCE}, 0, PRECISION_BF16);
}
END_TEST

int main(void) {
    Suite *s = suite_create("mpi_chapter5");
    TCase *tc = tcase_create("3d");
    const int W = check_world_size();
    check_add_test_where(tc, the_mesh_matches_the_baseline, W == 1 || W == 2 || W == 4 || W == 8,
                         "no mesh of this chapter for this -np");
    check_add_test_where(tc, without_f_backward_it_fails, W == 4 || W == 8,
                         "the mesh has no tensor parallelism at this -np");
    check_add_test_where(tc, zero2_and_zero3_match_the_baseline, W == 4 || W == 8,
                         "ZeRO-2/3 run on (2,1,2) at 4 processes and (2,2,2) at 8");
    check_add_test_where(tc, zero3_without_its_reduce_scatter_fails, W == 4 || W == 8,
                         "ZeRO-2/3 run on (2,1,2) at 4 processes and (2,2,2) at 8");
    check_add_test_where(tc, sixteen_bit_gradients_match_the_baseline, W == 4 || W == 8,
                         "16-bit gradients run on (2,1,2) at 4 processes and (2,2,2) at 8");
    suite_add_tcase(s, tc);
    return check_run(s, 1);
}
