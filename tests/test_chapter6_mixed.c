/* Chapter 6 in its precisions: the planner's bytes per parameter, per activation and per
 * message in bf16 / fp16 (the ZeRO paper's 2 + 2 + 12), fp8 (ZeRO-3's gathered weights at
 * 1 byte plus a scale a 128 x 128 block) and fp32 (4 + 4 + 8), each
 * against a case computed by hand here, and --predict-chapters --precision bf16 against
 * the chapters' own 16-bit runs (2 + 4 + 12: fp32 gradients), to the byte. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../chapters/06-choose/planner.h"
#include "check_run.h"
#include "plan_cp.h"
#include "predict.h"

#define EXACT(value, expected)                                                              \
    do {                                                                                    \
        const double v_ = (value), e_ = (expected);                                         \
        ck_assert_msg(fabs(v_ - e_) <= 1e-9 * fabs(e_), "%s = %.17g, by hand %.17g", #value, \
                      v_, e_);                                                              \
    } while (0)

static int same_precision(plan_precision a, plan_precision b) {
    return a.params == b.params && a.grads == b.grads && a.optimizer == b.optimizer &&
           a.activation == b.activation;
}

/* ---- model states --------------------------------------------------------------------- */

START_TEST(each_precision_keeps_its_state_bytes) {
    ck_assert(same_precision(plan_precision_of(PRECISION_BF16), (plan_precision){2, 2, 12, 2, 0}));
    ck_assert(same_precision(plan_precision_of(PRECISION_FP16), (plan_precision){2, 2, 12, 2, 0}));
    ck_assert(same_precision(plan_precision_of(PRECISION_FP32), (plan_precision){4, 4, 8, 4, 0}));
    /* 1e9 parameters on dp 4. bf16, ZeRO-1: 2 + 2 + 12 / 4 = 7 GB; fp32: 4 + 4 + 8 / 4 =
     * 10 GB; fp32 ZeRO-2: 4 + 4/4 + 8/4 = 7 GB; ZeRO-3: 16 / 4 = 4 GB in either; the
     * chapters' own mixed precision, ZeRO-1: 2 + 4 + 12 / 4 = 9 GB */
    const plan_bytes bf16_1 = plan_states_bytes(1e9, 1, 4, PLAN_MIXED_ADAM);
    EXACT(bf16_1.params, 2e9);
    EXACT(bf16_1.grads, 2e9);
    EXACT(bf16_1.optimizer, 3e9);
    const plan_bytes fp32_1 = plan_states_bytes(1e9, 1, 4, PLAN_FP32_ADAM);
    EXACT(fp32_1.params, 4e9);
    EXACT(fp32_1.grads, 4e9);
    EXACT(fp32_1.optimizer, 2e9);
    EXACT(plan_total(plan_states_bytes(1e9, 2, 4, PLAN_FP32_ADAM)), 7e9);
    EXACT(plan_total(plan_states_bytes(1e9, 3, 4, PLAN_FP32_ADAM)), 4e9);
    EXACT(plan_total(plan_states_bytes(1e9, 3, 4, PLAN_MIXED_ADAM)), 4e9);
    EXACT(plan_total(plan_states_bytes(1e9, 1, 4, PLAN_MIXED_FP32_GRADS)), 9e9);
    printf("states of 1e9 parameters on dp 4, ZeRO-1: bf16 %.3g, fp32 %.3g, 2 + 4 + 12 %.3g"
           " bytes (by hand 7e9, 1e10, 9e9)\n", plan_total(bf16_1), plan_total(fp32_1),
           plan_total(plan_states_bytes(1e9, 1, 4, PLAN_MIXED_FP32_GRADS)));
}
END_TEST

START_TEST(seventy_billion_is_16_bytes_a_parameter_in_either_precision) {
    /* the course: "140 GB in FP16 for parameters alone"; 16 B a parameter is 1.12 TB of
     * states; fp32 holds the same 16 B, split 4 + 4 + 8: 280 GB of parameters */
    const plan_bytes mixed = plan_states_bytes(70e9, 0, 1, PLAN_MIXED_ADAM);
    const plan_bytes fp32 = plan_states_bytes(70e9, 0, 1, PLAN_FP32_ADAM);
    EXACT(mixed.params, 140e9);
    EXACT(mixed.grads, 140e9);
    EXACT(mixed.optimizer, 840e9);
    EXACT(plan_total(mixed), 1.12e12);
    EXACT(fp32.params, 280e9);
    EXACT(fp32.grads, 280e9);
    EXACT(fp32.optimizer, 560e9);
    EXACT(plan_total(fp32), 1.12e12);
    /* the planner's DDP row of the README's 70B on 64 GPUs: 69.8e9 parameters */
    plan_request r = {.model = plan_shape_for_params(70e9, 51200, 2048),
                      .cluster = {.gpus = 64, .gpus_per_node = 8, .between_nodes = LINK_IB,
                                  .flops_per_gpu = 0.4 * 989e12},
                      .gpu_bytes = 80e9, .micro_batch = 1, .global_batch = 512, .recompute = 2,
                      .dtype = PRECISION_BF16};
    const plan_row bf16_ddp = plan_evaluate(&r, "ddp", (plan_mesh){.tp = 1, .pp = 1, .dp = 64});
    r.dtype = PRECISION_FP32;
    const plan_row fp32_ddp = plan_evaluate(&r, "ddp", (plan_mesh){.tp = 1, .pp = 1, .dp = 64});
    const double P = plan_params(&r.model);
    printf("70B (%.4g parameters), DDP: bf16 params %.2f GB of %.2f TB states; fp32 params"
           " %.2f GB of %.2f TB\n", P, bf16_ddp.memory.params / 1e9,
           (plan_total(bf16_ddp.memory) - bf16_ddp.memory.activations) / 1e12,
           fp32_ddp.memory.params / 1e9,
           (plan_total(fp32_ddp.memory) - fp32_ddp.memory.activations) / 1e12);
    EXACT(bf16_ddp.memory.params, 2 * P);
    EXACT(bf16_ddp.memory.optimizer, 12 * P);
    EXACT(fp32_ddp.memory.params, 4 * P);
    EXACT(fp32_ddp.memory.optimizer, 8 * P);
}
END_TEST

/* ---- activations and messages -------------------------------------------------------- */

/* l 2, h 64, a 4, V 100, s 16 (test_chapter6's hand-computed shape) */
static const plan_model HAND = {.layers = 2, .hidden = 64, .heads = 4, .vocab = 100, .seq = 16};

START_TEST(fp32_activations_are_twice_the_16_bit_ones_but_the_logits) {
    /* b 2, one micro-batch, no recomputation: s b h = 2048; a layer 2048 (34 + 5 x 4 x 16
     * / 64) = 79872 bytes of 2-byte elements, 2 layers 159744; the head's 2 s b h = 4096
     * and fp32 logits 4 s b V = 12800. bf16: 176640. fp32 doubles all but the logits,
     * already fp32: 2 (159744 + 4096) + 12800 = 340480. */
    const plan_mesh mesh = {.tp = 1, .pp = 1, .dp = 1, .micro_batch = 2, .global_batch = 2,
                            .recompute = RECOMPUTE_NONE};
    const double bf16 = plan_activations_in(&HAND, &mesh, PLAN_MIXED_ADAM);
    const double fp32 = plan_activations_in(&HAND, &mesh, PLAN_FP32_ADAM);
    printf("activations: bf16 %.0f, fp32 %.0f bytes (by hand 176640, 340480)\n", bf16, fp32);
    EXACT(bf16, 176640);
    EXACT(plan_activations_per_gpu(&HAND, &mesh), 176640);
    EXACT(fp32, 340480);
    EXACT(plan_memory_per_gpu(&HAND, &mesh, PLAN_FP32_ADAM).activations, 340480);
    EXACT(plan_memory_per_gpu(&HAND, &mesh, PLAN_MIXED_ADAM).activations, 176640);
}
END_TEST

/* Two GPUs in one node: NVLink, 2 us and 900 GB/s. */
static const plan_cluster PAIR = {.gpus = 2, .gpus_per_node = 2, .between_nodes = LINK_IB,
                                  .flops_per_gpu = 1e12};

START_TEST(messages_move_the_bytes_of_their_precision) {
    /* TP 2, B = b = 1: 2 layers x 4 all-reduces of s b h = 1024 activations, each
     * 2 (alpha + (1/2) bytes / beta): bf16 2048 bytes, fp32 4096 */
    const plan_mesh tp = {.tp = 2, .pp = 1, .dp = 1, .micro_batch = 1, .global_batch = 1,
                          .recompute = RECOMPUTE_NONE, .sequence_parallel = 1};
    const double tp_bf16 = plan_step_time(&HAND, &tp, &PAIR, PLAN_MIXED_ADAM).tp_comm;
    const double tp_fp32 = plan_step_time(&HAND, &tp, &PAIR, PLAN_FP32_ADAM).tp_comm;
    EXACT(tp_bf16, 8 * (4e-6 + 2048 / 900e9));
    EXACT(tp_fp32, 8 * (4e-6 + 4096 / 900e9));
    /* ZeRO-3 on dp 2, one micro-batch: per layer (of 2) P / 2 = 107392 / 2 = 53696
     * elements gathered twice as weights and reduce-scattered once as gradients, each
     * alpha + (1/2) bytes / beta. The paper's 2 + 2: 3 x 2 bytes; fp32 gradients
     * (2 + 4): 2 x 2 + 4; fp32: 3 x 4. */
    const plan_mesh fsdp = {.tp = 1, .pp = 1, .dp = 2, .zero_stage = 3, .micro_batch = 1,
                            .global_batch = 2, .recompute = RECOMPUTE_NONE};
    const double e = 53696;
    EXACT(plan_params_per_gpu(&HAND, 1, 1), 2 * e);
    const double by_hand[3] = {2 * (6e-6 + 0.5 * 6 * e / 900e9), 2 * (6e-6 + 0.5 * 8 * e / 900e9),
                               2 * (6e-6 + 0.5 * 12 * e / 900e9)};
    const plan_precision kinds[3] = {PLAN_MIXED_ADAM, PLAN_MIXED_FP32_GRADS, PLAN_FP32_ADAM};
    for (int k = 0; k < 3; k++) {
        const double dp = plan_step_time(&HAND, &fsdp, &PAIR, kinds[k]).dp_comm;
        printf("ZeRO-3 messages, %g + %g bytes: %.6g s (by hand %.6g)\n", kinds[k].params,
               kinds[k].grads, dp, by_hand[k]);
        EXACT(dp, by_hand[k]);
    }
    /* --precision fp8: ZeRO-3 gathers 1-byte weights plus a 4-byte scale a 128 x 128
     * block (PLAN_FP8_GATHERED), its gradients stay 2 bytes: 2 x (1 + 4/16384) + 2; the
     * gathered layer held at that size too. The control: the bf16 plan's bytes differ. */
    plan_precision fp8 = PLAN_MIXED_ADAM;
    fp8.gathered = PLAN_FP8_GATHERED;
    const double g8 = 1 + 4.0 / 16384, fp8_by_hand = 2 * (6e-6 + 0.5 * (2 * g8 + 2) * e / 900e9);
    const double fp8_dp = plan_step_time(&HAND, &fsdp, &PAIR, fp8).dp_comm;
    printf("ZeRO-3 messages in fp8: %.6g s (by hand %.6g; bf16 %.6g)\n", fp8_dp, fp8_by_hand,
           by_hand[0]);
    EXACT(fp8_dp, fp8_by_hand);
    ck_assert(fabs(by_hand[0] - fp8_by_hand) > 1e-6 * fp8_by_hand);   /* EXACT tells them apart */
    const plan_bytes held8 = plan_model_states(&HAND, &fsdp, fp8);
    const plan_bytes held16 = plan_model_states(&HAND, &fsdp, PLAN_MIXED_ADAM);
    EXACT(held16.params - held8.params, (2 - g8) * plan_layer_params(HAND.hidden));
    /* DDP all-reduces gradients alone: 2 layers x 2 (alpha + (1/2) e g / beta) */
    const plan_mesh ddp = {.tp = 1, .pp = 1, .dp = 2, .micro_batch = 1, .global_batch = 2,
                           .recompute = RECOMPUTE_NONE};
    EXACT(plan_step_time(&HAND, &ddp, &PAIR, PLAN_MIXED_FP32_GRADS).dp_comm,
          2 * 2 * (2e-6 + 0.5 * 4 * e / 900e9));
}
END_TEST

START_TEST(fp32_peak_is_h100s_fp32_over_its_bf16_dense) {
    /* NVIDIA's H100 SXM datasheet: 67 TFLOPS fp32, 989 bf16 dense */
    EXACT(989 * PLAN_FP32_PEAK_FRACTION, 67);
}
END_TEST

/* ---- against the chapters' 16-bit runs ------------------------------------------------ */

/* The chapter programs of this build (build/X/tests/test_chapter6_mixed -> build/X), or
 * the plain build's, build/cpu, for variants that build only tests. */
static void programs_dir(char *dir, size_t size) {
    const ssize_t len = readlink("/proc/self/exe", dir, size - 1);
    ck_assert(len > 0);
    dir[len] = 0;
    for (int up = 0; up < 2; up++) *strrchr(dir, '/') = 0;
    int all_built = 1;
    for (int n = 1; n <= 6; n++) {   /* chapters 1-5, and 11 for the planner's mesh */
        char program[1100];
        snprintf(program, sizeof program, "%s/chapter%d", dir, n < 6 ? n : 11);
        all_built = all_built && access(program, X_OK) == 0;
    }
    if (all_built) return;
    *strrchr(dir, '/') = 0;
    snprintf(dir + strlen(dir), size - strlen(dir), "/cpu");
    printf("chapter programs: not built in this variant, using %s\n", dir);
}

/* one step, as in test_chapter6: the figures compared are the same after more */
static const predict_options BF16_RUNS = {.steps = 1, .link_scale = 1, .dtype = PRECISION_BF16};

/* The ring CP mesh's cp bytes in bf16: K/V blocks in 16 bits, dK/dV in fp32. Controls:
 * every block in 16 bits, and every block in fp32 (the wire before K/V went 16-bit). */
static void ring_blocks_travel_in_their_precisions(const predict_mesh_run *run) {
    const plan_request r = predict_mesh_request(run->ranks, PRECISION_BF16);
    const plan_mesh *m = &run->mesh;
    const double per_layer_16 = plan_cp_chunks_per_layer(m) * plan_cp_chunk_bytes(&r.model, m, 2);
    const double all_16 = per_layer_16 * plan_layers_per_stage(&r.model, m->pp) *
                          plan_micro_batches(m);
    const double measured = run->measured.bytes[4];
    printf("ring CP in bf16: cp bytes %.0f measured, %.0f planned; every block in 16 bits"
           " %.0f, in fp32 %.0f (controls)\n", measured,
           predict_mesh_planned(&r, m).bytes[4], all_16, 2 * all_16);
    ck_assert(measured > 0 && measured == predict_mesh_planned(&r, m).bytes[4]);
    ck_assert(measured != all_16 && measured != 2 * all_16);
}

/* The MoE mesh in bf16: the dense part's 16-bit weights and gradients beside the fp32
 * routers and experts (and the experts' 16-bit copy), equal to the byte; control: the
 * dense model's count on the same mesh. */
static void the_moe_mesh_in_bf16(const predict_mesh_run *run) {
    const plan_request r = predict_mesh_moe_request(run->ranks, PRECISION_BF16);
    const plan_request dense = predict_mesh_request(run->ranks, PRECISION_BF16);
    const predict_mesh_figures right = predict_mesh_planned(&r, &run->mesh);
    const predict_mesh_figures wrong = predict_mesh_planned(&dense, &run->mesh);
    double error;
    printf("MoE mesh in bf16: params %.0f = %.0f measured, grads %.0f = %.0f; the dense"
           " model's count %.0f, %.0f (control)\n", right.state.params,
           run->measured.state.params, right.state.grads, run->measured.state.grads,
           wrong.state.params, wrong.state.grads);
    ck_assert(run->ranks == 4 && run->measured.bytes[6] > 0);
    ck_assert_int_eq(predict_mesh_compare(&right, &run->measured, &error), 0);
    ck_assert_int_eq(predict_mesh_compare(&wrong, &run->measured, &error), 6);
}

START_TEST(bf16_predictions_match_the_chapters_runs) {
    char dir[1024];
    programs_dir(dir, sizeof dir);
    double worst;
    int mismatches;
    predict_mesh_run mesh_run[PREDICT_MESH_RUNS];
    predict_options o = BF16_RUNS;
    o.mesh_run = mesh_run;
    const int status = predict_chapters_in(dir, &o, &worst, &mismatches);
    printf("predict-chapters --precision bf16: %d model-state figures differ (tolerance 0"
           " bytes), activations at most %.3f%% off (tolerance 0 bytes)\n", mismatches,
           100 * worst);
    ck_assert_msg(status != 2, "chapters 1-5 and 11 must be built first (make chapter1 ..."
                  " chapter5 chapter11)");
    ck_assert_int_eq(mismatches, 0);
    ck_assert(worst == 0);
    ck_assert_int_eq(status, 0);
    ring_blocks_travel_in_their_precisions(&mesh_run[PREDICT_MESH_CP]);
    the_moe_mesh_in_bf16(&mesh_run[PREDICT_MESH_MOE]);
}
END_TEST

START_TEST(fp32_formulas_miss_a_bf16_run) {
    char dir[1024];
    programs_dir(dir, sizeof dir);
    char *json = run_chapter_json(dir, 2, 2, &BF16_RUNS);
    ck_assert_ptr_nonnull(json);
    const gpt_config bench = {.vocab = 256, .ctx = 64, .layers = 4, .heads = 4, .dim = 256};
    const chapter_strategy zero1 = {2, "zero1", 1, 1, 0, 0};
    chapter_figures measured;
    ck_assert(chapter_json_figures(json, "zero1", &measured));
    const chapter_figures as_fp32 =
        predict_chapter_run(&bench, 8, 2, &zero1, 50, 2, LINK_NONE, 1, PRECISION_FP32);
    const chapter_figures as_bf16 =
        predict_chapter_run(&bench, 8, 2, &zero1, 50, 2, LINK_NONE, 1, PRECISION_BF16);
    printf("negative control: bf16 zero1 measured params %.0f, optimizer %.0f; fp32's formulas"
           " %.0f, %.0f; bf16's %.0f, %.0f\n", measured.params, measured.optimizer,
           as_fp32.params, as_fp32.optimizer, as_bf16.params, as_bf16.optimizer);
    ck_assert(as_fp32.params != measured.params && as_fp32.optimizer != measured.optimizer);
    ck_assert(as_bf16.params == measured.params && as_bf16.optimizer == measured.optimizer);
    free(json);
}
END_TEST

int main(void) {
    Suite *suite = suite_create("chapter6_mixed");
    TCase *formulas = tcase_create("formulas");
    tcase_add_test(formulas, each_precision_keeps_its_state_bytes);
    tcase_add_test(formulas, seventy_billion_is_16_bytes_a_parameter_in_either_precision);
    tcase_add_test(formulas, fp32_activations_are_twice_the_16_bit_ones_but_the_logits);
    tcase_add_test(formulas, messages_move_the_bytes_of_their_precision);
    tcase_add_test(formulas, fp32_peak_is_h100s_fp32_over_its_bf16_dense);
    suite_add_tcase(suite, formulas);
    TCase *runs = tcase_create("runs");
    tcase_set_timeout(runs, 600);
    tcase_add_test(runs, bf16_predictions_match_the_chapters_runs);
    tcase_add_test(runs, fp32_formulas_miss_a_bf16_run);
    suite_add_tcase(suite, runs);
    return check_run(suite, 0);
}
