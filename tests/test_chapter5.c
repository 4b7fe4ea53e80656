/* Chapter 5 against the single-device baseline: TP x PP x DP meshes (1,1,4), (2,2,1),
 * (2,1,2), (1,2,2), (2,2,2) and a three-stage (1,3,2) train the baseline's model
 * (gradients of step 1, loss per step, parameters after 3 steps); ZeRO-1 across dp and
 * other schedules on (2,2,2); ZeRO-2 and ZeRO-3 across dp on (2,2,2) and (2,1,2), with
 * their own negative controls and the per-rank states adding up over dp; every rank's bytes on its tp, pp, dp and embedding groups
 * equal their formulas; leaving out any one of the four kinds of communication fails the
 * comparison (negative controls); model state per rank equals the as-stored formula.
 * Tolerances as every chapter: gradients 1e-6, loss 1e-5, parameters 1e-4; bytes 1e-3
 * relative (a ring's uneven chunks). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "check_run.h"
#include "small_model.h"
#include "strategy_runs.h"

static run_config small_config(int ranks) { return small_model_config(6, ranks); }

static mesh_result *train(mesh_shape shape, pipeline_options opts, const dataset *d,
                          baseline_run **baseline) {
    run_config cfg = small_config(mesh_world(&shape));
    *baseline = baseline_train(&cfg, d);
    return launch_mesh(&cfg, d, shape, opts, *baseline);
}

static void check_mesh(mesh_shape shape, pipeline_options opts) {
    dataset *d = dataset_builtin();
    baseline_run *b;
    mesh_result *o = train(shape, opts, d, &b);
    const run_result *r = &o->run.result;
    printf("tp %d x pp %d x dp %d, %s m=%d zero %d: max |diff| loss %.2e grads %.2e params "
           "%.2e; bytes vs formula %.1e; tied copies %.1e\n", shape.tp, shape.pp, shape.dp,
           pp_schedule_name(opts.schedule), opts.micro, opts.zero_stage, r->diff_loss,
           r->diff_grads, r->diff_params, o->x.worst_bytes_error, o->x.tied_drift);
    ck_assert_msg(r->diff_grads <= MESH_TOL_GRADS, "grads differ by %g", r->diff_grads);
    ck_assert_msg(r->diff_loss <= MESH_TOL_LOSS, "loss differs by %g", r->diff_loss);
    ck_assert_msg(r->diff_params <= MESH_TOL_PARAMS, "params differ by %g", r->diff_params);
    check_mesh_formulas(o, shape, 1e-3);
    mesh_result_free(o);
    baseline_free(b);
    dataset_free(d);
}

static pipeline_options one_f_one_b(int micro) {
    return (pipeline_options){.schedule = PP_1F1B, .micro = micro, .chunks = 1};
}

START_TEST(dp_only_1_1_4) { check_mesh((mesh_shape){.tp = 1, .pp = 1, .dp = 4, .cp = 1}, one_f_one_b(2)); }
END_TEST
START_TEST(tp_pp_2_2_1) { check_mesh((mesh_shape){.tp = 2, .pp = 2, .dp = 1, .cp = 1}, one_f_one_b(4)); }
END_TEST
START_TEST(tp_dp_2_1_2) { check_mesh((mesh_shape){.tp = 2, .pp = 1, .dp = 2, .cp = 1}, one_f_one_b(2)); }
END_TEST
START_TEST(pp_dp_1_2_2) { check_mesh((mesh_shape){.tp = 1, .pp = 2, .dp = 2, .cp = 1}, one_f_one_b(4)); }
END_TEST
START_TEST(three_d_2_2_2) { check_mesh((mesh_shape){.tp = 2, .pp = 2, .dp = 2, .cp = 1}, one_f_one_b(4)); }
END_TEST
START_TEST(three_stages_1_3_2) { check_mesh((mesh_shape){.tp = 1, .pp = 3, .dp = 2, .cp = 1}, one_f_one_b(4)); }
END_TEST
START_TEST(zero1_and_other_schedules_on_2_2_2) {
    pipeline_options z = one_f_one_b(4);
    z.zero_stage = 1;
    check_mesh((mesh_shape){.tp = 2, .pp = 2, .dp = 2, .cp = 1}, z);
    check_mesh((mesh_shape){.tp = 2, .pp = 2, .dp = 2, .cp = 1}, (pipeline_options){.schedule = PP_ZB_H1, .micro = 4,
                                                          .chunks = 1});
    check_mesh((mesh_shape){.tp = 2, .pp = 2, .dp = 2, .cp = 1}, (pipeline_options){.schedule = PP_INTERLEAVED,
                                                          .micro = 2, .chunks = 2});
    check_mesh((mesh_shape){.tp = 2, .pp = 2, .dp = 2, .cp = 1}, (pipeline_options){.schedule = PP_ZB_V, .micro = 4,
                                                          .chunks = 2});
}
END_TEST

/* ZeRO-2 and ZeRO-3 across dp, inside TP and PP: each dp group shards its own stage's
 * TP slice (gradients; at 3 parameters too, gathered once per step) */
START_TEST(zero2_and_zero3_on_2_2_2_and_2_1_2) {
    const mesh_shape shapes[] = {{.tp = 2, .pp = 2, .dp = 2, .cp = 1}, {.tp = 2, .pp = 1, .dp = 2, .cp = 1}};
    for (int i = 0; i < 2; i++)
        for (int zero = 2; zero <= 3; zero++) {
            pipeline_options opts = one_f_one_b(shapes[i].pp > 1 ? 4 : 2);
            opts.zero_stage = zero;
            check_mesh(shapes[i], opts);
        }
    pipeline_options interleaved = {.schedule = PP_INTERLEAVED, .micro = 2, .chunks = 2,
                                     .zero_stage = 3};
    check_mesh((mesh_shape){.tp = 2, .pp = 2, .dp = 2, .cp = 1}, interleaved);
}
END_TEST

/* Negative controls of the dp piece at each ZeRO stage: gradients not reduce-scattered
 * (every stage), updated pieces not all-gathered (1 and 2). */
START_TEST(zero_without_its_dp_collectives_fails) {
    const struct { int zero; pipeline_fault fault; const char *name; } cases[] = {
        {2, PIPELINE_FAULT_SKIP_DP_REDUCE, "ZeRO-2 without the reduce-scatter"},
        {3, PIPELINE_FAULT_SKIP_DP_REDUCE, "ZeRO-3 without the reduce-scatter"},
        {1, PIPELINE_FAULT_SKIP_DP_PARAM_GATHER, "ZeRO-1 without the parameter all-gather"},
        {2, PIPELINE_FAULT_SKIP_DP_PARAM_GATHER, "ZeRO-2 without the parameter all-gather"},
    };
    dataset *d = dataset_builtin();
    for (int i = 0; i < 4; i++) {
        const mesh_shape shape = i % 2 ? (mesh_shape){.tp = 2, .pp = 1, .dp = 2, .cp = 1} : (mesh_shape){.tp = 2, .pp = 2, .dp = 2, .cp = 1};
        pipeline_options opts = one_f_one_b(shape.pp > 1 ? 4 : 2);
        opts.zero_stage = cases[i].zero;
        opts.fault = cases[i].fault;
        baseline_run *b;
        mesh_result *o = train(shape, opts, d, &b);
        const double worst = mesh_worst_fraction_of_tolerance(&o->run.result);
        printf("%d x %d x %d %s: grads differ by %.2e, params by %.2e (%.0fx the"
               " tolerance)\n", shape.tp, shape.pp, shape.dp, cases[i].name,
               o->run.result.diff_grads, o->run.result.diff_params, worst);
        /* the comparison with the baseline must fail */
        ck_assert_msg(worst > 1, "%s: within the tolerances (%.2f of them)", cases[i].name,
                      worst);
        mesh_result_free(o);
        baseline_free(b);
    }
    dataset_free(d);
}
END_TEST

/* The model states per rank are the ZeRO paper's, per TP slice and stage: over the dp
 * ranks of one (tp, pp) position the pieces add up to the stage slice exactly. */
START_TEST(zero_state_formulas_add_up_over_dp) {
    run_config cfg = small_config(8);
    const mesh_shape shape = {.tp = 2, .pp = 2, .dp = 2, .cp = 1};
    for (int zero = 0; zero <= 3; zero++) {
        pipeline_options opts = one_f_one_b(4);
        opts.zero_stage = zero;
        double sum[3] = {0};
        mesh_rank_traffic t[2];
        for (int dp = 0; dp < 2; dp++) {
            mesh_traffic_formula(&cfg, shape, (mesh_coord){.tp = 1, .pp = 1, .dp = dp, .cp = 0}, &opts, &t[dp]);
            for (int i = 0; i < 3; i++) sum[i] += t[dp].state_formula[i];
        }
        gpt_shape stage = gpt_shape_make(&cfg.model, 2, 1);
        gpt_shape_split_vocab(&stage);
        gpt_shape_split_stages(&stage, 2, 1);
        const double P = 4.0 * (double)gpt_num_params(&stage);
        const double expect[3] = {zero >= 3 ? P : 2 * P, zero >= 2 ? P : 2 * P,
                                  zero >= 1 ? 2 * P : 4 * P};
        for (int i = 0; i < 3; i++)
            ck_assert_msg(sum[i] == expect[i], "zero %d state %d: %.0f over dp, expected %.0f",
                          zero, i, sum[i], expect[i]);
        /* and the dp bytes are 2 (d-1)/d x the slice at every stage: with d = 2, P */
        ck_assert_double_eq_tol(t[0].formula[PIPELINE_DP], P, 1e-9);
    }
}
END_TEST

START_TEST(leaving_out_any_communication_fails) {
    const pipeline_fault faults[] = {PIPELINE_FAULT_DROP_F_BACKWARD,
                                     PIPELINE_FAULT_DROP_INPUT_GRAD,
                                     PIPELINE_FAULT_SKIP_DP_REDUCE,
                                     PIPELINE_FAULT_SKIP_TIED_REDUCE};
    const char *names[] = {"tp: f's backward all-reduce", "pp: a d(input) as zeros",
                           "dp: no gradient reduction", "embedding: no tied reduction"};
    dataset *d = dataset_builtin();
    for (int i = 0; i < 4; i++) {
        pipeline_options opts = one_f_one_b(4);
        opts.fault = faults[i];
        baseline_run *b;
        mesh_result *o = train((mesh_shape){.tp = 2, .pp = 2, .dp = 2, .cp = 1}, opts, d, &b);
        printf("2 x 2 x 2 without %s: grads differ by %.2e, params by %.2e\n", names[i],
               o->run.result.diff_grads, o->run.result.diff_params);
        ck_assert_msg(o->run.result.diff_grads > 100 * MESH_TOL_GRADS ||
                          o->run.result.diff_params > 100 * MESH_TOL_PARAMS,
                      "%s: grads differ by only %g", names[i], o->run.result.diff_grads);
        mesh_result_free(o);
        baseline_free(b);
    }
    dataset_free(d);
}
END_TEST

START_TEST(formulas_by_hand) {
    /* tp 2 x pp 2 x dp 2, 6 layers (3 per stage), batch 8, ctx 8, dim 16, m 4: per
     * micro-batch b = 1 sequence, b s h = 128 floats */
    run_config cfg = small_config(8);
    pipeline_options opts = one_f_one_b(4);
    mesh_rank_traffic t;
    mesh_traffic_formula(&cfg, (mesh_shape){.tp = 2, .pp = 2, .dp = 2, .cp = 1}, (mesh_coord){.tp = 0, .pp = 0, .dp = 0, .cp = 0}, &opts, &t);
    /* TP: 4 micro x ring 1 x (4 x 3 blocks + 1 embedding) x 128 floats x 4 B */
    ck_assert_double_eq_tol(t.formula[PIPELINE_TP], 4 * 1.0 * (12 + 1) * 128 * 4, 1e-9);
    /* PP: stage 0 sends 4 activations of 128 floats */
    ck_assert_double_eq_tol(t.formula[PIPELINE_PP], 4 * 128 * 4, 1e-9);
    /* embedding: ring(2) = 1 x this TP rank's 128 rows of wte x 16 x 4 B */
    ck_assert_double_eq_tol(t.formula[PIPELINE_EMBEDDING], 128 * 16 * 4, 1e-9);
    mesh_traffic_formula(&cfg, (mesh_shape){.tp = 2, .pp = 2, .dp = 2, .cp = 1}, (mesh_coord){.tp = 1, .pp = 1, .dp = 1, .cp = 0}, &opts, &t);
    /* last stage: 3 blocks, the head's f and the loss's 3 b s numbers */
    ck_assert_double_eq_tol(t.formula[PIPELINE_TP], 4 * (12 * 128 + 128 + 3 * 8) * 4.0, 1e-9);
    ck_assert_double_eq_tol(t.formula[PIPELINE_PP], 4 * 128 * 4, 1e-9);   /* gradients back */
    /* cp 2 x pp 2 (dp 1: b = 2 sequences a micro-batch), ring: every micro-batch's
     * attention in each of the stage's 3 blocks sends 3P - 2 = 4 blocks of K and V (2
     * chunks of b s/cp h = 2 x 4 x 16 floats each): 4 micro x 3 x 4 x 2 x 128 x 4 B */
    mesh_traffic_formula(&cfg, (mesh_shape){.tp = 1, .pp = 2, .dp = 1, .cp = 2}, (mesh_coord){.tp = 0, .pp = 0, .dp = 0, .cp = 0}, &opts, &t);
    ck_assert_double_eq_tol(t.formula[PIPELINE_CP], 4 * 3 * 4 * 2 * 128 * 4.0, 1e-9);
}
END_TEST

int main(void) {
    Suite *s = suite_create("chapter5");
    TCase *tc = tcase_create("3d");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, formulas_by_hand);
    tcase_add_test(tc, dp_only_1_1_4);
    tcase_add_test(tc, tp_pp_2_2_1);
    tcase_add_test(tc, tp_dp_2_1_2);
    tcase_add_test(tc, pp_dp_1_2_2);
    tcase_add_test(tc, three_d_2_2_2);
    tcase_add_test(tc, three_stages_1_3_2);
    tcase_add_test(tc, zero1_and_other_schedules_on_2_2_2);
    tcase_add_test(tc, leaving_out_any_communication_fails);
    tcase_add_test(tc, zero_state_formulas_add_up_over_dp);
    tcase_add_test(tc, zero2_and_zero3_on_2_2_2_and_2_1_2);
    tcase_add_test(tc, zero_without_its_dp_collectives_fails);
    suite_add_tcase(s, tc);
    return check_run(s, 0);
}
