/* Tests of the per-op profile (op_profile.h) on the CPU.
 *
 * A profile is only a lesson if it saw every op. The reference is arithmetic: one
 * training step of a small model must show exactly the op calls the model makes and
 * exactly the matmul FLOPs of its shapes (2 N x every linear weight forward, twice
 * that backward; 4 B T^2 C for the attention products forward, 8 B T^2 C backward while
 * T fits one causal block). A profile that missed the backward is the negative control:
 * the same comparison must then fail. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "data.h"
#include "model.h"
#include "matmul16.h"
#include "op_profile.h"
#include "ops.h"
#include "ops_mixed.h"
#include "baseline.h"
#include "replica.h"
#include "check_run.h"

/* T = 16 is under the attention's causal block (32): its products are all T x T. */
static const gpt_config small = {.vocab = 256, .ctx = 16, .layers = 2, .heads = 2, .dim = 32};
enum { BATCH = 2 };

/* What one step must show, from the shapes alone. */
typedef struct {
    double linear_forward_flops, linear_backward_flops, attention_forward_flops,
        attention_backward_flops;
    double layernorm_calls, gelu_calls, adamw_calls;
} expected_step;

static expected_step expect(const gpt_config *c) {
    const double N = (double)BATCH * c->ctx, C = c->dim, L = c->layers, T = c->ctx;
    /* qkv 3C^2, proj C^2, fc 4C^2, fc2 4C^2 per layer, and the tied head V x C */
    const double linear_weights = L * 12.0 * C * C + (double)c->vocab * C;
    return (expected_step){
        .linear_forward_flops = 2.0 * N * linear_weights,
        .linear_backward_flops = 4.0 * N * linear_weights,
        .attention_forward_flops = L * 4.0 * BATCH * T * T * C,
        .attention_backward_flops = L * 8.0 * BATCH * T * T * C,
        .layernorm_calls = 2.0 * (2.0 * L + 1.0),   /* forward and backward */
        .gelu_calls = 2.0 * L,
        .adamw_calls = 1.0,
    };
}

/* Largest relative difference between what the profile saw and what it must show. */
static double largest_difference(const op_profile *p, const expected_step *e) {
    const double got[] = {p->gemm_flops[OP_LINEAR_FORWARD], p->gemm_flops[OP_LINEAR_BACKWARD],
                          p->gemm_flops[OP_ATTENTION_FORWARD],
                          p->gemm_flops[OP_ATTENTION_BACKWARD], p->calls[OP_LAYERNORM],
                          p->calls[OP_GELU], p->calls[OP_ADAMW]};
    const double want[] = {e->linear_forward_flops, e->linear_backward_flops,
                           e->attention_forward_flops, e->attention_backward_flops,
                           e->layernorm_calls, e->gelu_calls, e->adamw_calls};
    double worst = 0.0;
    for (size_t i = 0; i < sizeof got / sizeof got[0]; i++) {
        const double d = fabs(got[i] - want[i]) / want[i];
        worst = d > worst ? d : worst;
    }
    return worst;
}

/* One training step under the profile; watch_backward 0 hides the backward from it. */
static void profiled_step(op_profile *p, int watch_backward) {
    gpt_shape s = gpt_shape_make(&small, 1, 0);
    replica r;
    replica_init(&r, &s, 7, 1);
    gpt_model *m = gpt_model_create(&s, BATCH, small.ctx, NULL);
    dataset *d = dataset_builtin();
    run_config cfg = run_config_default();
    cfg.model = small;
    load_batch(m, d, &cfg, 1, 0, BATCH);
    op_profile_start(p, PRECISION_FP32);
    gpt_forward(m, r.params);
    if (!watch_backward) op_profile_stop(p);
    gpt_backward(m, r.params, r.grads, 1.0f / (BATCH * small.ctx), NULL, NULL);
    replica_adamw(&r, &cfg.adamw);
    op_profile_stop(p);
    dataset_free(d);
    gpt_model_free(m);
    replica_free(&r);
}

/* The profile of one step, and its largest difference from what it must show. */
static double profiled_difference(op_profile *p, const expected_step *e, int watch_backward) {
    profiled_step(p, watch_backward);
    return largest_difference(p, e);
}

START_TEST(profile_sees_every_op_and_product_of_a_step) {
    static op_profile p;
    const expected_step e = expect(&small);
    const double worst = profiled_difference(&p, &e, 1);
    printf("profile: linear fwd %.0f / %.0f FLOPs, bwd %.0f / %.0f, attention fwd %.0f /"
           " %.0f, bwd %.0f / %.0f; largest relative difference %.2e (tolerance 1e-12)\n",
           p.gemm_flops[OP_LINEAR_FORWARD], e.linear_forward_flops,
           p.gemm_flops[OP_LINEAR_BACKWARD], e.linear_backward_flops,
           p.gemm_flops[OP_ATTENTION_FORWARD], e.attention_forward_flops,
           p.gemm_flops[OP_ATTENTION_BACKWARD], e.attention_backward_flops, worst);
    ck_assert_double_le(worst, 1e-12);
    ck_assert_double_eq(p.unlisted_gemm_flops, 0.0);
    /* the products lie inside their ops, and every op took some time */
    for (int k = 0; k < OP_KINDS; k++) ck_assert_double_le(p.gemm_seconds[k], p.seconds[k]);
    ck_assert_double_gt(p.seconds[OP_GELU], 0.0);
}
END_TEST

START_TEST(floor_sums_its_shapes) {
    static op_profile p;
    profiled_step(&p, 1);
    double by_kind[OP_KINDS];
    const double floor = op_profile_sgemm_floor(&p, by_kind);
    double sum = 0.0;
    for (int k = 0; k < OP_KINDS; k++) sum += by_kind[k];
    printf("sgemm floor of one step: %.3f ms over %d shapes; |floor - sum of kinds| %.2e s"
           " (tolerance 1e-12)\n", 1e3 * floor, p.num_shapes, fabs(floor - sum));
    ck_assert_double_gt(floor, 0.0);
    ck_assert_double_le(fabs(floor - sum), 1e-12);
    ck_assert_double_eq(by_kind[OP_GELU], 0.0);   /* no products outside matmul ops */
}
END_TEST

START_TEST(negative_control_a_profile_blind_to_backward_fails) {
    static op_profile p;
    const expected_step e = expect(&small);
    const double worst = profiled_difference(&p, &e, 0);
    printf("negative control (backward not watched): largest relative difference %.2e,"
           " must exceed the tolerance 1e-12\n", worst);
    ck_assert_double_gt(worst, 1e-12);
}
END_TEST

/* --profile, parsed like any flag, reaches the training loop: the run's result carries
 * the floor (what --json prints). Without the flag there is none: the control. */
static double floor_of_run(int profile) {
    char *argv[] = {"test_profile", "--steps", "2", "--layers", "1", "--dim", "16",
                    "--heads", "2", "--ctx", "8", "--batch", "2", "--quiet", "--profile"};
    run_config cfg = run_config_default();
    cli_parse(profile ? 15 : 14, argv, &cfg, NULL, argv[0], "");
    dataset *d = dataset_builtin();
    baseline_run *b = baseline_train(&cfg, d);
    const double floor = b->result.sgemm_floor_seconds;
    baseline_free(b);
    dataset_free(d);
    return floor;
}

START_TEST(profile_flag_puts_the_floor_into_the_result) {
    const double with = floor_of_run(1), without = floor_of_run(0);
    printf("--profile: floor %.4f ms per step; without the flag %.4f ms (must be 0)\n",
           1e3 * with, 1e3 * without);
    ck_assert_double_gt(with, 0.0);
    ck_assert_double_eq(without, 0.0);
}
END_TEST

/* The table names the OpenBLAS kernel the products ran on, as detected or as forced by
 * OPENBLAS_CORETYPE: the same CPU's figures differ by 2x between the two. */
START_TEST(report_names_the_blas_kernel) {
    static op_profile p;
    profiled_step(&p, 1);
    char *text = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&text, &size);
    ck_assert_ptr_nonnull(out);
    op_profile_report(&p, NULL, "baseline", 1, p.seconds[OP_GELU], p.seconds[OP_GELU], 0.0, out);
    fclose(out);
    char want[96];
    snprintf(want, sizeof want, "sgemm: OpenBLAS, %s kernels", op_profile_blas_kernel());
    printf("the profile's kernel line: %s", strstr(text, "sgemm: OpenBLAS") ? strstr(text, "sgemm: OpenBLAS") : "(none)\n");
    ck_assert_msg(strstr(text, want) != NULL, "no \"%s\" in the profile", want);
    free(text);
}
END_TEST

/* A bf16 linear and a bf16 attention under the profile, and its table in text. */
static char *bf16_profile_text(op_profile *p) {
    enum { N = 32, IC = 64, OC = 96, B = 2, T = 16, C = 32, NH = 2 };
    uint16_t *inp = calloc(N * IC, 2), *weight = calloc(OC * IC, 2), *out = calloc(N * OC, 2);
    uint16_t *qkv = calloc(B * T * 3 * C, 2), *att = calloc(B * NH * T * T, 2);
    uint16_t *y = calloc(B * T * C, 2);
    op_profile_start(p, PRECISION_BF16);
    mixed_linear_forward(PRECISION_BF16, out, inp, weight, NULL, N, IC, OC);
    mixed_attention_forward(PRECISION_BF16, y, att, qkv, B, T, C, NH);
    op_profile_stop(p);
    char *text = NULL;
    size_t size = 0;
    FILE *stream = open_memstream(&text, &size);
    ck_assert_ptr_nonnull(stream);
    op_profile_report(p, NULL, "baseline", 1, p->seconds[OP_LINEAR_FORWARD],
                      p->seconds[OP_LINEAR_FORWARD], 0.0, stream);
    fclose(stream);
    void *buffers[] = {inp, weight, out, qkv, att, y};
    for (int i = 0; i < 6; i++) free(buffers[i]);
    return text;
}

/* In bf16 the linears' products are oneDNN's matmul16, floored by matmul16 at their
 * shapes, and the rows and the kernel line say so; the attention's stay sgemm's. */
START_TEST(bf16_report_names_the_matmul16_kernel) {
    static op_profile p;
    char *text = bf16_profile_text(&p);
    char want[160];
    snprintf(want, sizeof want, "bf16 matmul (the linears' products): %s\n",
             matmul16_impl(PRECISION_BF16, 0, 1, 32, 96, 64));
    printf("the bf16 profile:%s", text);
    ck_assert_msg(strstr(text, "linear fwd: bf16 matmul") != NULL, "no bf16 matmul row");
    ck_assert_msg(strstr(text, "attention fwd: sgemm") != NULL, "no attention sgemm row");
    ck_assert_msg(strstr(text, want) != NULL, "no \"%s\" in the profile", want);
    ck_assert_str_eq(op_profile_matmul16_kernel(), matmul16_impl(PRECISION_BF16, 0, 1, 32, 96, 64));
    for (int i = 0; i < p.num_shapes; i++)   /* the floor's kernel per shape */
        ck_assert_int_eq(p.shapes[i].in_16_bits, p.shapes[i].kind == OP_LINEAR_FORWARD);
    double by_kind[OP_KINDS];
    op_profile_sgemm_floor(&p, by_kind);
    ck_assert_double_gt(by_kind[OP_LINEAR_FORWARD], 0.0);
    free(text);
    ops_mixed_release_thread();
}
END_TEST

int main(void) {
    Suite *suite = suite_create("profile");
    TCase *tc = tcase_create("profile");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, profile_sees_every_op_and_product_of_a_step);
    tcase_add_test(tc, floor_sums_its_shapes);
    tcase_add_test(tc, negative_control_a_profile_blind_to_backward_fails);
    tcase_add_test(tc, profile_flag_puts_the_floor_into_the_result);
    tcase_add_test(tc, report_names_the_blas_kernel);
    tcase_add_test(tc, bf16_report_names_the_matmul16_kernel);
    suite_add_tcase(suite, tc);
    return check_run(suite, 0);
}
