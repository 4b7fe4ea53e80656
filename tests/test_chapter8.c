/* Chapter 8: the bytes per parameter measured by tag equal the formulas exactly (4 + 4 + 8
 * in fp32, 2 + 4 + 12 with fp32 gradients, 2 + 2 + 12 with 16-bit ones), and so does
 * the gradients' peak (16-bit ones: what is held and backward's two fp32 working slabs,
 * no widened copy for AdamW); ZeRO's stages
 * in bf16 with bf16 gradients equal the paper's Table 1 with K = 12 (plus the uneven
 * shards' padding, which is 0 where every slab divides by N); the wire's bytes equal
 * the formulas; and the training loop records the loss scale of every step. (The
 * accuracy part's lessons and loss curves: test_chapter8_curves.)
 *
 * Negative controls: the fp32-gradient case holds 2 bytes a parameter more than the
 * 16-bit one (the two formulas are told apart); at 3 ranks the slabs do not divide and
 * the padding is counted, not assumed 0. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baseline.h"
#include "check_run.h"
#include "cli.h"
#include "mixed.h"

static run_config small_config(int ranks) {
    run_config cfg = run_config_default();
    mixed_chapter_defaults(&cfg);
    cfg.model.dim = 64;
    cfg.comm.ranks = ranks;
    cfg.quiet = 1;
    return cfg;
}

/* One rank of a smaller model: dim, 2 heads, ctx. */
static run_config narrow_config(int dim, int ctx) {
    run_config cfg = small_config(1);
    cfg.model.dim = dim;
    cfg.model.heads = 2;
    cfg.model.ctx = ctx;
    return cfg;
}

static void check_bytes_at(int ranks) {
    const run_config cfg = small_config(ranks);
    dataset *d = dataset_builtin();
    bytes_report r = {0};
    ck_assert_int_eq(bytes_launches(&cfg, d, &r), 0);
    const double P = (double)r.num_params;
    for (int i = 0; i < BYTES_CASES; i++) {
        double f[3];
        bytes_formula_per_param(&bytes_cases[i], f);
        printf("N=%d %-16s measured %.0f + %.0f + %.0f, formula (%.0f + %.0f + %.0f) x P\n",
               ranks, bytes_cases[i].label, r.state[i][0], r.state[i][1], r.state[i][2],
               f[0], f[1], f[2]);
        for (int t = 0; t < 3; t++) ck_assert(r.state[i][t] == f[t] * P);
        const double peak = bytes_grads_peak(&bytes_cases[i], &cfg.model);
        printf("N=%d %-16s grads peak %.0f, formula %.0f\n", ranks, bytes_cases[i].label,
               r.grads_peak[i], peak);
        ck_assert(r.grads_peak[i] == peak);
    }
    ck_assert(r.state[1][1] == r.state[2][1] + 2 * P);   /* fp32 against 16-bit grads */
    double padding = 0;
    for (int s = 0; s < ZERO_STAGES; s++) {
        const double paper = bytes_paper_k12(s, r.num_params, ranks);
        printf("N=%d zero%d bf16 %.0f = paper %.0f + uneven %.0f; fp32 %.0f\n", ranks, s,
               r.zero_state[1][s], paper, r.zero_padding[1][s], r.zero_state[0][s]);
        ck_assert(r.zero_state[1][s] == paper + r.zero_padding[1][s]);
        ck_assert(r.zero_state[0][s] ==
                  bytes_fp32_stored(s, r.num_params, ranks) + r.zero_padding[0][s]);
        padding += r.zero_padding[1][s];
    }
    if (ranks == 2) ck_assert(padding == 0);   /* every slab divides by 2 */
    if (ranks == 3) ck_assert(padding > 0);    /* and not by 3: counted */
    dataset_free(d);
}

START_TEST(bytes_per_parameter_equal_the_formulas) {
    check_bytes_at(2);
    check_bytes_at(3);
}
END_TEST

START_TEST(wire_bytes_equal_the_formulas) {
    const run_config cfg = small_config(2);
    dataset *d = dataset_builtin();
    wire_report r = {0};
    ck_assert_int_eq(wire_launches(&cfg, d, 3, &r), 0);
    for (int s = 0; s < WIRE_STRATEGIES; s++)
        for (int c = 0; c < WIRE_CASES; c++) {
            if (!r.ran[s][c]) continue;
            printf("%s %s: sent %.0f, formula %.0f\n", wire_strategy_names[s],
                   wire_cases[c].label, r.sent[s][c], r.formula[s][c]);
            ck_assert(fabs(r.sent[s][c] - r.formula[s][c]) <= 1e-9 * r.formula[s][c]);
        }
    ck_assert(r.sent[0][2] * 2 == r.sent[0][0]);   /* DDP: bf16 gradients, half the bytes */
    ck_assert(r.sent[1][1] < r.sent[1][0]);        /* FSDP: 16-bit weights gathered */
    dataset_free(d);
}
END_TEST

/* The overflow of test_overflow_step halves the scale the next step uses. */
START_TEST(loss_scale_trace_records_every_step) {
    run_config cfg = narrow_config(16, 8);
    cfg.steps = 6;
    cfg.precision = PRECISION_FP16;
    cfg.test_overflow_step = 3;
    float trace[6] = {0};
    cfg.loss_scale_trace = trace;
    dataset *d = dataset_builtin();
    baseline_run *b = baseline_train(&cfg, d);
    const float want[6] = {65536, 65536, 65536, 32768, 32768, 32768};
    for (int i = 0; i < 6; i++) {
        printf("step %d: loss scale %g (expected %g)\n", i + 1, (double)trace[i],
               (double)want[i]);
        ck_assert(trace[i] == want[i]);
    }
    ck_assert_int_eq(b->result.skipped_steps, 1);
    baseline_free(b);
    dataset_free(d);
}
END_TEST

/* Part fp8 (b, d): one product's error on the small model's real activations. E4M3 within
 * a few per cent of fp32 with every recipe and bf16 well below it; outlier channels 100x
 * the rest leave it where it was (E4M3's range absorbs them); at 1e5x per-tensor scaling
 * fails (the other channels sink into the subnormals) and 1 x 128 tiles do not: that
 * failure is asserted, it is the chapter's lesson. A jump of the activations' amax (x10
 * at one batch) saturates delayed scaling at that batch alone, and not with a margin. */
START_TEST(fp8_errors_per_recipe) {
    const run_config cfg = small_config(1);
    dataset *d = dataset_builtin();
    fp8_report r = {0};
    fp8_local(&cfg, d, &r);
    enum { BF16, DELAYED, TENSORWISE, ROWWISE, BLOCKWISE, E5M2 };
    for (int row = 0; row < FP8_ERROR_ROWS; row++) {
        printf("fp8 %-22s", fp8_error_rows[row].label);
        for (int c = 0; c < FP8_ERROR_CASES; c++) printf(" %.4f", r.error[row][c]);
        printf("\n");
    }
    for (int row = DELAYED; row <= E5M2; row++) {
        ck_assert(r.error[row][0] < 0.03);
        ck_assert(r.error[BF16][0] < r.error[row][0] / 4);
        ck_assert(r.error[row][1] < 1.2 * r.error[row][0]);   /* x100: absorbed */
    }
    ck_assert(r.error[TENSORWISE][3] > 5 * r.error[TENSORWISE][0]);   /* x1e5: fails */
    ck_assert(r.error[BLOCKWISE][3] < r.error[TENSORWISE][3] / 2);
    ck_assert(r.error[E5M2][3] < 1.2 * r.error[E5M2][0]);   /* E5M2's range holds it */
    /* d: the jump saturates delayed scaling without a margin, and only it */
    for (int s = 0; s < FP8_SPIKE_STEPS; s++) {
        const double current = r.spike_error[0][s];
        printf("fp8 spike batch %2d: amax %.2f current %.4f delayed %.4f margin %.4f\n", s + 1,
               r.spike_amax[s], current, r.spike_error[1][s], r.spike_error[2][s]);
        ck_assert(r.spike_error[2][s] < 1.2 * current);
        if (s == FP8_SPIKE_AT) ck_assert(r.spike_error[1][s] > 10 * current);
        else ck_assert(r.spike_error[1][s] < 1.2 * current);
    }
    dataset_free(d);
}
END_TEST

/* Part fp8 (c): 300 steps on the chapter's text (a model of dim 48, ctx 16, batch 4: a few
 * seconds a run): every recipe's mean loss within 1% of bf16's (the criterion;
 * DeepSeek-V3 reports 0.25% at scale), and the designed failure, outlier channels 1e7x
 * the rest with per-tensor scaling, outside it. Measured: recipes -0.05 .. +0.10%,
 * per-tensor with outliers +10.4% (1 x 128 tiles with them +6.1%: at this width the
 * tile is the whole row, so it fails too and nothing is asserted of it). bf16 from three
 * other initial weights on the same batches measures the run-to-run spread (here up to
 * 0.98%; 8.1% on the chapter's default model, whose README shows the recipes' gaps inside
 * it): the designed failure lies beyond it too. */
START_TEST(fp8_curves_stay_within_one_percent_of_bf16) {
    run_config cfg = narrow_config(48, 16);
    cfg.batch = 4;
    char err[512];
    ck_assert_msg(cfg.data_path, "data/english.txt is missing");
    dataset *d = dataset_load(cfg.data_path, cfg.model.ctx, err, sizeof err);
    ck_assert_msg(d, "%s", err);
    fp8_report r = {0};
    fp8_curves(&cfg, d, FP8_CURVE_STEPS, &r);
    for (int i = 0; i < FP8_CURVE_ROWS; i++) {
        const fp8_curve_row *row = &fp8_curve_rows[i];
        printf("fp8 curve %-26s mean loss %.5f, gap to bf16 %+.3f%%\n", row->label,
               r.curve_mean[i], 100 * r.curve_gap[i]);
        ck_assert(isfinite(r.curve_mean[i]));
        if (row->fp8 && row->outliers == 1)
            ck_assert_msg(fabs(r.curve_gap[i]) <= FP8_CURVE_LIMIT, "%s", row->label);
        if (row->fp8 && row->outliers != 1 && row->recipe == FP8_TENSORWISE) {
            ck_assert_msg(r.curve_gap[i] > FP8_CURVE_LIMIT, "%s did not fail", row->label);
            ck_assert_msg(r.curve_gap[i] > r.curve_spread, "%s within the spread", row->label);
        }
    }
    printf("fp8 curves: bf16 from other initial weights, the spread %.3f%%\n",
           100 * r.curve_spread);
    ck_assert(r.curve_spread > 0 && r.curve_spread < 1);   /* measured: the runs differ */
    ck_assert(r.curve_mean[FP8_CURVE_BF16] < r.curve[FP8_CURVE_BF16][0] - 1);   /* it learned */
    fp8_curves_free(&r);
    dataset_free(d);
}
END_TEST

/* Part fp8 (c), the formats: one step's gradients against fp32's on a small model, every
 * recipe; hybrid (E5M2 output gradients in the backward) further from fp32 than e4m3
 * (the backward in bf16), and e4m3 further than bf16. */
START_TEST(fp8_hybrid_gradients_are_further_from_fp32) {
    run_config cfg = narrow_config(48, 16);
    cfg.batch = 4;
    dataset *d = dataset_builtin();
    fp8_report r = {0};
    fp8_gradient_errors(&cfg, d, &r);
    for (int recipe = 0; recipe < FP8_RECIPES; recipe++) {
        printf("fp8 step-1 gradients %-10s: e4m3 %.4f, hybrid %.4f, bf16 %.4f\n",
               fp8_recipe_name((fp8_recipe)recipe), r.grad_error[recipe][0],
               r.grad_error[recipe][1], r.grad_error_bf16);
        ck_assert(r.grad_error[recipe][1] > r.grad_error[recipe][0]);
        ck_assert(r.grad_error[recipe][0] > r.grad_error_bf16);
    }
    dataset_free(d);
}
END_TEST

/* Part fp8 (e): the bytes by hand for 2 layers of dim 64 (12 x 64^2 weights a block in the
 * linears; scales: 4 tensors, 9 x 64 rows, or 2 + 1 + 2 + 2 blocks of 128 x 128 a block),
 * and ZeRO-3's gathers at 2 bytes a weight equal the library's bf16 plan. */
START_TEST(fp8_bytes_by_hand) {
    const run_config cfg = small_config(4);
    fp8_report r = {0};
    fp8_bytes(&cfg, &r);
    const double linear = 2 * 12 * 64.0 * 64, other = r.P - linear;
    ck_assert(r.linear == linear);
    const double scales[3] = {2 * 4, 2 * 9 * 64, 2 * 7};
    for (int i = 0; i < 3; i++) {
        printf("fp8 bytes row %d: %.0f scales, weights %.0f B, all-gather %.0f B\n", i + 2,
               r.scales[i + 2], r.weight_bytes[i + 2], r.gather_bytes[i + 2]);
        ck_assert(r.scales[i + 2] == scales[i]);
        ck_assert(r.weight_bytes[i + 2] == linear + 4 * scales[i] + 2 * other);
    }
    ck_assert(r.weight_bytes[0] == 4 * r.P && r.weight_bytes[1] == 2 * r.P);
    const gpt_shape s = gpt_shape_make(&cfg.model, 1, 0);
    const comm_plan b16 = zero_comm_plan(&s, 3, PRECISION_BF16);
    const double plan = plan_ring_bytes(&b16, COMM_KIND_ALLGATHER, 4);
    printf("ZeRO-3 all-gather at 2 B a weight: %.0f, bf16 plan %.0f; fp8 blockwise %.0f\n",
           fp8_gather_bytes(&s, 4, 2, 0), plan, r.gather_bytes[4]);
    ck_assert(fabs(fp8_gather_bytes(&s, 4, 2, 0) - plan) < 1e-6 * plan);
    ck_assert(r.gather_bytes[1] == plan);
    /* negative control: 1-byte weights are not the plan's bytes */
    ck_assert(fabs(fp8_gather_bytes(&s, 4, 1, 0) - plan) > 0.1 * plan);
}
END_TEST

/* Part 3 says whether this CPU multiplies bf16 itself. Where matmul16 widens bf16 to
 * fp32, and its kernel's name says so ("fp32 from bf16"), it must not say native: a
 * search of that name for "bf16" once did, and the verdict then read "This CPU
 * multiplies bf16 natively (gemm:jit, ... fp32 from bf16 ...)". */
START_TEST(speed_calls_bf16_native_only_where_it_is) {
    speed_report r = {.shapes = {{.M = 512, .N = 768, .K = 256, .what = "qkv"}}};
    speed_kernels(&r);
    const int widened = strstr(r.kernel16[PRECISION_BF16], "fp32 from bf16") != NULL;
    printf("bf16 products on %s: %s\n", r.kernel16[PRECISION_BF16],
           r.native_bf16 ? "native" : "widened to fp32");
    ck_assert_int_eq(r.native_bf16, !widened);
}
END_TEST

int main(void) {
    Suite *s = suite_create("chapter 8");
    TCase *t = tcase_create("mixed precision measured");
    tcase_set_timeout(t, 600);
    tcase_add_test(t, bytes_per_parameter_equal_the_formulas);
    tcase_add_test(t, wire_bytes_equal_the_formulas);
    tcase_add_test(t, loss_scale_trace_records_every_step);
    tcase_add_test(t, fp8_errors_per_recipe);
    tcase_add_test(t, fp8_bytes_by_hand);
    tcase_add_test(t, speed_calls_bf16_native_only_where_it_is);
    suite_add_tcase(s, t);
    TCase *formats = tcase_create("fp8 formats");
    tcase_set_timeout(formats, 600);
    tcase_add_test(formats, fp8_hybrid_gradients_are_further_from_fp32);
    suite_add_tcase(s, formats);
    TCase *curves = tcase_create("fp8 curves");
    tcase_set_timeout(curves, 600);
    tcase_add_test(curves, fp8_curves_stay_within_one_percent_of_bf16);
    suite_add_tcase(s, curves);
    return check_run(s, 0);
}
