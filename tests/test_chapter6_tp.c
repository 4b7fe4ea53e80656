/* Chapter 6's TP count (plan_mesh.tp_count): the papers' split-everything count stays
 * the default, and this model's (PLAN_TP_THIS_MODEL) counts the trainer's rank.
 *
 * By hand: bench256 (l 4, h 256, a 4, V 256, s 64) on tp 2; a layer 12 h^2/2 + 7 h/2 +
 * 6 h against the papers' (12 h^2 + 13 h) / 2, and Narayanan's count unchanged at tp 1.
 * Recorded: chapter 11's figures for tp 2 + SP x pp 2 x dp 2 (8 ranks, 4 micro-batches,
 * ZeRO-0, 1F1B), measured with
 *   chapter11 --ranks 8 --preset bench256 --steps 2 --json --quiet --link none
 *             --precision fp32|bf16 --tp 2 --sp --cp 1 --pp 2 --dp-shard 2
 *             --dp-replicate 1 --zero 0 --micro 4 --schedule 1f1b
 * (bytes_per_group_kind, state_peak_largest_per_tag, state_largest_per_tag's
 * activations), held to the byte; --predict-chapters trains tp 2 + SP x dp 2 live
 * (test_chapter6). Negative controls: the papers' count and the count without SP's terms
 * miss the recorded figures. */
#include <check.h>
#include <math.h>
#include <stdio.h>

#include "check_run.h"
#include "predict.h"

static const plan_model bench256 = {.layers = 4, .hidden = 256, .heads = 4, .vocab = 256,
                                    .seq = 64};

START_TEST(a_tp_rank_by_hand) {
    const double h = 256;
    ck_assert(plan_this_model_layer_params(256, 2) == 12 * h * h / 2 + 7 * h / 2 + 6 * h);
    ck_assert(plan_this_model_layer_params(256, 1) == plan_layer_params(256));
    /* first stage of pp 2: 2 layers, 128 embedding rows, 64 positions; one stage adds
     * the final LayerNorm */
    const double layer = 12 * h * h / 2 + 7 * h / 2 + 6 * h;
    ck_assert(plan_this_model_params_per_gpu(&bench256, 2, 2) == 2 * layer + 128 * h + 64 * h);
    ck_assert(plan_this_model_params_per_gpu(&bench256, 2, 1) ==
              4 * layer + 128 * h + 64 * h + 2 * h);
    /* the default mesh counts as the papers do */
    const plan_mesh paper = {.tp = 2, .pp = 1, .dp = 1};
    ck_assert(plan_mesh_params_per_gpu(&bench256, &paper) == plan_params_per_gpu(&bench256, 2, 1));
    printf("tp 2 rank: this model's %.0f parameters, the papers' %.0f\n",
           plan_this_model_params_per_gpu(&bench256, 2, 1), plan_params_per_gpu(&bench256, 2, 1));
    ck_assert(plan_this_model_params_per_gpu(&bench256, 2, 1) == 1632256);
    ck_assert(plan_params_per_gpu(&bench256, 2, 1) == 1628672);
    /* the step's tp seconds send the count's bytes: the same latencies, this model's
     * extra bytes at NVLink's bandwidth (tp 2 in a node) */
    const plan_request r = predict_mesh_request(8, PRECISION_FP32);
    plan_mesh ours = plan_evaluate(&r, "mesh", (plan_mesh){.tp = 2, .pp = 2, .dp = 2}).mesh;
    plan_mesh papers = ours;
    ours.tp_count = PLAN_TP_THIS_MODEL;
    papers.tp_count = PLAN_TP_PAPER;
    const plan_precision p = plan_precision_for(&r);
    const double extra_bytes = plan_bytes_sent(&r.model, &ours, p).tp -
                               plan_bytes_sent(&r.model, &papers, p).tp;
    const double extra_seconds = plan_step_time(&r.model, &ours, &r.cluster, p).tp_comm -
                                 plan_step_time(&r.model, &papers, &r.cluster, p).tp_comm;
    const double expected = extra_bytes / plan_link_of(LINK_NVLINK).bandwidth;
    printf("tp seconds: this model's count %.3e s more than the papers' for %.0f B more"
           " (expected %.3e)\n", extra_seconds, extra_bytes, expected);
    ck_assert(extra_bytes > 0);
    ck_assert(fabs(extra_seconds - expected) <= 1e-9 * expected);
}
END_TEST

/* tp, pp, dp bytes; params, grads, optimizer, activations (chapter 11, see above) */
static const double measured_fp32[7] = {2927616, 131072, 3361792, 3361792, 3361792, 6723584,
                                        3118080};
static const double measured_bf16[7] = {1485824, 65536, 1680896, 1680896, 5042688, 10085376,
                                        1561600};

/* The figures of seven that the planner gets wrong on tp 2 + SP x pp 2 x dp 2. */
static int misses(precision dtype, plan_tp_count count, int sp, const double measured[7]) {
    const plan_request r = predict_mesh_request(8, dtype);
    plan_mesh mesh = plan_evaluate(&r, "mesh", (plan_mesh){.tp = 2, .pp = 2, .dp = 2}).mesh;
    ck_assert(mesh.sequence_parallel);
    mesh.tp_count = count;
    mesh.sequence_parallel = sp;
    const predict_mesh_figures p = predict_mesh_planned(&r, &mesh);
    const double planned[7] = {p.bytes[0], p.bytes[1], p.bytes[2], p.state.params,
                               p.state.grads, p.state.optimizer, p.state.activations};
    int wrong = 0;
    for (int i = 0; i < 7; i++) wrong += planned[i] != measured[i];
    printf("%s, %s, %s: tp %.0f (measured %.0f), params %.0f (%.0f), activations %.0f (%.0f):"
           " %d of 7 differ\n", precision_name(dtype),
           count == PLAN_TP_THIS_MODEL ? "this model's count" : "the papers' count",
           sp ? "SP" : "SP's terms left out", planned[0], measured[0], planned[3], measured[3],
           planned[6], measured[6], wrong);
    return wrong;
}

START_TEST(tp_sp_pp_dp_as_chapter_11_measured_it) {
    ck_assert_int_eq(misses(PRECISION_FP32, PLAN_TP_THIS_MODEL, 1, measured_fp32), 0);
    ck_assert_int_eq(misses(PRECISION_BF16, PLAN_TP_THIS_MODEL, 1, measured_bf16), 0);
    /* negative controls: every bias and LayerNorm split, no head's all-reduces (tp, dp
     * and the three states); the regathers, LayerNorm gradients and scratch left out */
    ck_assert_int_eq(misses(PRECISION_FP32, PLAN_TP_PAPER, 1, measured_fp32), 5);
    ck_assert_int_eq(misses(PRECISION_BF16, PLAN_TP_PAPER, 1, measured_bf16), 5);
    ck_assert_int_ge(misses(PRECISION_FP32, PLAN_TP_THIS_MODEL, 0, measured_fp32), 2);
}
END_TEST

int main(void) {
    Suite *suite = suite_create("chapter6_tp");
    TCase *by_hand = tcase_create("by hand"), *recorded = tcase_create("recorded");
    tcase_add_test(by_hand, a_tp_rank_by_hand);
    suite_add_tcase(suite, by_hand);
    tcase_add_test(recorded, tp_sp_pp_dp_as_chapter_11_measured_it);   /* chapter 11's */
    suite_add_tcase(suite, recorded);
    return check_run(suite, 0);
}
