/* The CUDA ops (gpu/ops_cuda.cu) against the CPU ops (common/ops_cpu.c).
 *
 * Every op runs on the same random non-zero inputs on both devices; the GPU result is
 * compared to the CPU one by relative error, max |gpu - cpu| / max |cpu| over the whole
 * output, which stays meaningful where single elements cancel to near zero. FP32 ops
 * must agree to 1e-5 (the CPU side accumulates in double, so it is the reference);
 * linear also reports both against a float64 product computed here, and the TF32 path
 * must agree to 2e-3: TF32 keeps 10 of fp32's 23 mantissa bits, and rounding the inputs
 * alone gives about 8e-4 at these shapes (simulated on the CPU, with truncation as the
 * worse case, by tests/test_gpu_host.c), too close to the former 1e-3.
 *
 * One run diagnoses every op: each comparison is printed and recorded instead of
 * stopping the test, a test fails at its end when any of its comparisons did, and the
 * worst relative error of every op is printed last ("WORST <op> <precision> rel ...").
 * The precision is reset to FP32 before every test, so a TF32 test that fails cannot
 * leave the tests after it in TF32.
 *
 * Outputs that the op must overwrite start as garbage, and outputs it must accumulate
 * into start non-zero, so that the convention of ops.h is checked as well.
 *
 * Without a GPU (or in a build without GPU=1) there is nothing to run: the program
 * prints "SKIP: <why>" and exits 77. With one, it runs without fork: CUDA does not
 * survive a fork once used. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"

#ifdef USE_CUDA
#include "comm_internal.h"
#include "floats.h"
#include "ops.h"
#include "ops_cpu.h"
#include "ops_cuda.h"
#include "rng.h"

#define TOL_FP32 1e-5
#define TOL_TF32 2e-3

/* ---- what every comparison leaves behind ------------------------------------------- */

enum { MAX_OPS = 64 };
typedef struct {
    char op[64];   /* the label's first word, plus " tf32" for TF32 comparisons */
    double worst, tol;
} op_record;
static op_record op_records[MAX_OPS];
static int op_count;
static int test_failures;            /* comparisons of the running test over tolerance */
static char first_failure[192];

static void record(const char *what, double rel, double tol, int ok) {
    char op[64];
    snprintf(op, sizeof op, "%.*s%s", (int)strcspn(what, " ,"), what,
             strstr(what, "tf32") ? " tf32" : " fp32");
    op_record *r = NULL;
    for (int i = 0; i < op_count && !r; i++)
        if (strcmp(op_records[i].op, op) == 0) r = &op_records[i];
    if (!r && op_count < MAX_OPS) {
        r = &op_records[op_count++];
        snprintf(r->op, sizeof r->op, "%s", op);
    }
    if (r && (rel > r->worst || isnan(rel))) r->worst = rel;
    if (r && tol > r->tol) r->tol = tol;
    if (!ok && test_failures++ == 0)
        snprintf(first_failure, sizeof first_failure, "%s: relative error %.3e over %.0e",
                 what, rel, tol);
}

/* Before every test: FP32, and no failures yet. */
static void start_test(void) {
    cuda_set_tf32(0);
    test_failures = 0;
    first_failure[0] = '\0';
}

/* The end of every test: it fails when any comparison did. */
#define FINISH_TEST()                                                                     \
    ck_assert_msg(test_failures == 0, "%d comparison%s over tolerance; the first: %s",   \
                  test_failures, test_failures == 1 ? "" : "s", first_failure)

static void print_worst_per_op(void) {
    printf("worst relative error per op, gpu vs cpu:\n");
    for (int i = 0; i < op_count; i++)
        printf("WORST %-34s rel %.3e  (tol %.0e)%s\n", op_records[i].op, op_records[i].worst,
               op_records[i].tol, op_records[i].worst <= op_records[i].tol ? "" : "  FAILED");
}

/* ---- helpers ----------------------------------------------------------------------- */

static uint64_t next_stream = 1;   /* every buffer gets its own random stream */

/* n floats, uniform in (lo, hi); callers pick ranges that keep them away from 0 where
 * an exact zero would hide a mistake. */
static float *host_random(size_t n, double lo, double hi) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    ck_assert_ptr_nonnull(x);
    uint64_t stream = next_stream++;
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(lo + (hi - lo) * rng_uniform(7, stream, i));
    return x;
}

static float *host_copy(const float *src, size_t n) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    ck_assert_ptr_nonnull(x);
    memcpy(x, src, n * sizeof(float));
    return x;
}

static int *host_tokens(size_t n, int V) {
    int *t = malloc((n ? n : 1) * sizeof(int));
    ck_assert_ptr_nonnull(t);
    uint64_t stream = next_stream++;
    for (size_t i = 0; i < n; i++) t[i] = (int)(rng_hash(7, stream, i) % (uint64_t)V);
    return t;
}

static void *dev_upload(const void *host, size_t bytes) {
    void *d = device_malloc(bytes);
    cuda_ops_upload(d, host, bytes);
    return d;
}

static float *dev_floats(const float *host, size_t n) {
    return dev_upload(host, n * sizeof(float));
}

/* Device buffer of n floats filled with garbage: for outputs that must be overwritten. */
static float *dev_garbage(size_t n) {
    float *junk = host_random(n, 1e3, 2e3);
    float *d = dev_floats(junk, n);
    free(junk);
    return d;
}

static float *download(const float *dev, size_t n) {
    float *h = malloc((n ? n : 1) * sizeof(float));
    ck_assert_ptr_nonnull(h);
    cuda_ops_download(h, dev, n * sizeof(float));
    return h;
}

/* max |a - b| / max |ref|; infinite when a NaN appears on one side only. */
static double rel_error(const float *a, const float *ref, size_t n, double *max_abs_diff) {
    double worst = 0.0, scale = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) != isnan(ref[i])) {
            *max_abs_diff = INFINITY;
            return INFINITY;
        }
        if (isnan(ref[i])) continue;
        double d = fabs((double)a[i] - (double)ref[i]);
        if (d > worst) worst = d;
        if (fabs((double)ref[i]) > scale) scale = fabs((double)ref[i]);
    }
    *max_abs_diff = worst;
    return scale > 0.0 ? worst / scale : worst;
}

/* Downloads the GPU result, compares it with the CPU one, prints and asserts. */
static void expect_close(const char *what, const float *gpu_dev, const float *cpu, size_t n,
                         double tol) {
    float *gpu = download(gpu_dev, n);
    double diff;
    double rel = rel_error(gpu, cpu, n, &diff);
    printf("  %-40s max |gpu-cpu| %.3e  rel %.3e  (tol %.0e)\n", what, diff, rel, tol);
    record(what, rel, tol, rel <= tol);
    free(gpu);
}

/* Downloads and checks bit equality (ops that only move or order-exactly sum data). */
static void expect_identical(const char *what, const float *gpu_dev, const float *cpu,
                             size_t n) {
    float *gpu = download(gpu_dev, n);
    double diff;
    rel_error(gpu, cpu, n, &diff);
    printf("  %-40s max |gpu-cpu| %.3e  (must be bit-identical)\n", what, diff);
    record(what, diff, 0.0, memcmp(gpu, cpu, n * sizeof(float)) == 0);
    free(gpu);
}

static void dev_free_all(void **ptrs, size_t count) {
    for (size_t i = 0; i < count; i++) device_free(ptrs[i]);
}
#define DEV_FREE(...)                                                       \
    do {                                                                    \
        void *dev_list_[] = {__VA_ARGS__};                                  \
        dev_free_all(dev_list_, sizeof dev_list_ / sizeof dev_list_[0]);    \
    } while (0)

/* ---- embeddings --------------------------------------------------------------------- */

START_TEST(embedding_matches_cpu) {
    const int N = 111, C = 72, V = 259;
    const int slices[][2] = {{0, V}, {50, 100}};   /* whole vocabulary, and one slice */
    int *tokens = host_tokens(N, V);
    for (int i = 0; i < N; i += 3) tokens[i] = 57;   /* a heavily repeated token */
    int *d_tokens = dev_upload(tokens, N * sizeof(int));
    for (int s = 0; s < 2; s++) {
        const int vs = slices[s][0], vl = slices[s][1];
        char label[64];
        float *wte = host_random((size_t)vl * C, -1, 1);
        float *out = malloc((size_t)N * C * sizeof(float));
        cpu_embedding_forward(out, tokens, wte, N, C, vs, vl);
        float *d_wte = dev_floats(wte, (size_t)vl * C), *d_out = dev_garbage((size_t)N * C);
        cuda_embedding_forward(d_out, d_tokens, d_wte, N, C, vs, vl);
        snprintf(label, sizeof label, "embedding_forward [%d,+%d)", vs, vl);
        expect_identical(label, d_out, out, (size_t)N * C);

        /* backward accumulates; rows of one token are added in row order on both */
        float *dwte = host_random((size_t)vl * C, -1, 1);
        float *dout = host_random((size_t)N * C, -1, 1);
        float *d_dwte = dev_floats(dwte, (size_t)vl * C),
              *d_dout = dev_floats(dout, (size_t)N * C);
        float *d_dwte2 = dev_floats(dwte, (size_t)vl * C);
        cpu_embedding_backward(dwte, dout, tokens, N, C, vs, vl);
        cuda_embedding_backward(d_dwte, d_dout, d_tokens, N, C, vs, vl);
        cuda_embedding_backward(d_dwte2, d_dout, d_tokens, N, C, vs, vl);
        snprintf(label, sizeof label, "embedding_backward [%d,+%d)", vs, vl);
        expect_identical(label, d_dwte, dwte, (size_t)vl * C);
        expect_identical("embedding_backward, second run", d_dwte2, dwte, (size_t)vl * C);
        DEV_FREE(d_wte, d_out, d_dwte, d_dout, d_dwte2);
        free(wte), free(out), free(dwte), free(dout);
    }
    DEV_FREE(d_tokens);
    free(tokens);
    FINISH_TEST();
}
END_TEST

START_TEST(position_matches_cpu) {
    const int B = 3, T = 37, C = 72;
    const size_t n = (size_t)B * T * C;
    float *out = host_random(n, -1, 1), *wpe = host_random((size_t)T * C, -1, 1);
    float *d_out = dev_floats(out, n), *d_wpe = dev_floats(wpe, (size_t)T * C);
    cpu_position_forward(out, wpe, B, T, C);
    cuda_position_forward(d_out, d_wpe, B, T, C);
    expect_identical("position_forward (+=)", d_out, out, n);

    float *dwpe = host_random((size_t)T * C, -1, 1), *dout = host_random(n, -1, 1);
    float *d_dwpe = dev_floats(dwpe, (size_t)T * C), *d_dout = dev_floats(dout, n);
    cpu_position_backward(dwpe, dout, B, T, C);
    cuda_position_backward(d_dwpe, d_dout, B, T, C);
    expect_close("position_backward (+=)", d_dwpe, dwpe, (size_t)T * C, TOL_FP32);
    DEV_FREE(d_out, d_wpe, d_dwpe, d_dout);
    free(out), free(wpe), free(dwpe), free(dout);
    FINISH_TEST();
}
END_TEST

/* ---- layer norm --------------------------------------------------------------------- */

START_TEST(layernorm_matches_cpu) {
    /* 300 rows: several row chunks in the column sums; 100 columns: not a warp multiple */
    const int N = 300, C = 100;
    const size_t n = (size_t)N * C;
    float *inp = host_random(n, 2, 4);   /* an offset, so the mean matters */
    float *w = host_random(C, 0.5, 1.5), *b = host_random(C, -1, 1);
    float *out = malloc(n * sizeof(float)), *mean = malloc(N * sizeof(float)),
          *rstd = malloc(N * sizeof(float));
    cpu_layernorm_forward(out, mean, rstd, inp, w, b, N, C);
    float *d_inp = dev_floats(inp, n), *d_w = dev_floats(w, C), *d_b = dev_floats(b, C);
    float *d_out = dev_garbage(n), *d_mean = dev_garbage(N), *d_rstd = dev_garbage(N);
    cuda_layernorm_forward(d_out, d_mean, d_rstd, d_inp, d_w, d_b, N, C);
    expect_close("layernorm_forward out", d_out, out, n, TOL_FP32);
    expect_close("layernorm_forward mean", d_mean, mean, N, TOL_FP32);
    expect_close("layernorm_forward rstd", d_rstd, rstd, N, TOL_FP32);

    /* backward from the CPU's mean and rstd, so that both sides see the same inputs */
    cuda_ops_upload(d_mean, mean, N * sizeof(float));
    cuda_ops_upload(d_rstd, rstd, N * sizeof(float));
    float *dout = host_random(n, -1, 1);
    float *dinp = host_random(n, -1, 1), *dw = host_random(C, -1, 1),
          *db = host_random(C, -1, 1);
    float *d_dout = dev_floats(dout, n), *d_dinp = dev_floats(dinp, n),
          *d_dw = dev_floats(dw, C), *d_db = dev_floats(db, C);
    float *d_dinp2 = dev_floats(dinp, n), *d_dw2 = dev_floats(dw, C),
          *d_db2 = dev_floats(db, C);
    cpu_layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    cuda_layernorm_backward(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, d_mean, d_rstd, N, C);
    expect_close("layernorm_backward dinp (+=)", d_dinp, dinp, n, TOL_FP32);
    expect_close("layernorm_backward dweight (+=)", d_dw, dw, C, TOL_FP32);
    expect_close("layernorm_backward dbias (+=)", d_db, db, C, TOL_FP32);

    /* deterministic: a second run gives the same bits */
    cuda_layernorm_backward(d_dinp2, d_dw2, d_db2, d_dout, d_inp, d_w, d_mean, d_rstd, N,
                            C);
    float *g1 = download(d_dw, C), *g2 = download(d_dw2, C);
    record("layernorm_backward deterministic (second run)", 0.0, 0.0,
           memcmp(g1, g2, C * sizeof(float)) == 0);
    free(g1), free(g2);
    DEV_FREE(d_inp, d_w, d_b, d_out, d_mean, d_rstd, d_dout, d_dinp, d_dw, d_db, d_dinp2,
             d_dw2, d_db2);
    free(inp), free(w), free(b), free(out), free(mean), free(rstd), free(dout), free(dinp),
        free(dw), free(db);
    FINISH_TEST();
}
END_TEST

/* ---- linear ------------------------------------------------------------------------- */

/* out = inp @ w^T + bias in float64, the reference for both devices. */
static float *linear_reference(const float *inp, const float *w, const float *bias, int N,
                               int IC, int OC) {
    float *ref = malloc((size_t)N * OC * sizeof(float));
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double acc = bias ? bias[o] : 0.0;
            for (int i = 0; i < IC; i++)
                acc += (double)inp[(size_t)n * IC + i] * w[(size_t)o * IC + i];
            ref[(size_t)n * OC + o] = (float)acc;
        }
    return ref;
}

/* Forward with and without bias, then backward with every output and with the optional
 * ones left out; tol is TOL_FP32, or TOL_TF32 with TF32 enabled. */
static void check_linear(int N, int IC, int OC, double tol, const char *tag) {
    const size_t ni = (size_t)N * IC, no = (size_t)N * OC, nw = (size_t)OC * IC;
    char label[96];
    float *inp = host_random(ni, -1, 1), *w = host_random(nw, -1, 1),
          *bias = host_random(OC, -1, 1);
    float *d_inp = dev_floats(inp, ni), *d_w = dev_floats(w, nw),
          *d_bias = dev_floats(bias, OC);
    float *out = malloc(no * sizeof(float)), *d_out = dev_garbage(no);
    for (int with_bias = 1; with_bias >= 0; with_bias--) {
        const float *bb = with_bias ? bias : NULL;
        cpu_linear_forward(out, inp, w, bb, N, IC, OC);
        cuda_linear_forward(d_out, d_inp, d_w, with_bias ? d_bias : NULL, N, IC, OC);
        snprintf(label, sizeof label, "linear_forward%s %s", with_bias ? "" : " (no bias)",
                 tag);
        expect_close(label, d_out, out, no, tol);
        /* both against float64: the CPU is as good a reference as it claims */
        float *ref = linear_reference(inp, w, bb, N, IC, OC), *gpu = download(d_out, no);
        double diff_gpu, diff_cpu;
        double rel_gpu = rel_error(gpu, ref, no, &diff_gpu),
               rel_cpu = rel_error(out, ref, no, &diff_cpu);
        printf("  %-40s gpu rel %.3e, cpu rel %.3e vs float64\n", "", rel_gpu, rel_cpu);
        char vs64[120];
        snprintf(vs64, sizeof vs64, "%s vs float64", label);
        record(vs64, rel_gpu, tol, rel_gpu <= tol);
        free(ref), free(gpu);
    }

    float *dout = host_random(no, -1, 1);
    float *dw = host_random(nw, -1, 1), *db = host_random(OC, -1, 1),
          *dinp = malloc(ni * sizeof(float));
    float *d_dout = dev_floats(dout, no), *d_dinp = dev_garbage(ni);
    float *d_dw = dev_floats(dw, nw), *d_db = dev_floats(db, OC);
    float *dw0 = host_copy(dw, nw);
    cpu_linear_backward(dinp, dw, db, dout, inp, w, N, IC, OC);
    cuda_linear_backward(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, N, IC, OC);
    snprintf(label, sizeof label, "linear_backward dinp %s", tag);
    expect_close(label, d_dinp, dinp, ni, tol);
    snprintf(label, sizeof label, "linear_backward dweight (+=) %s", tag);
    expect_close(label, d_dw, dw, nw, tol);
    snprintf(label, sizeof label, "linear_backward dbias (+=) %s", tag);
    expect_close(label, d_db, db, OC, tol);

    /* dinp and dbias are optional */
    cuda_ops_upload(d_dw, dw0, nw * sizeof(float));
    memcpy(dw, dw0, nw * sizeof(float));
    cpu_linear_backward(NULL, dw, NULL, dout, inp, w, N, IC, OC);
    cuda_linear_backward(NULL, d_dw, NULL, d_dout, d_inp, d_w, N, IC, OC);
    snprintf(label, sizeof label, "linear_backward dweight only %s", tag);
    expect_close(label, d_dw, dw, nw, tol);
    DEV_FREE(d_inp, d_w, d_bias, d_out, d_dout, d_dinp, d_dw, d_db);
    free(inp), free(w), free(bias), free(out), free(dout), free(dw), free(db), free(dinp),
        free(dw0);
}

START_TEST(linear_matches_cpu) {
    check_linear(111, 72, 200, TOL_FP32, "fp32");
    check_linear(256, 384, 128, TOL_FP32, "fp32");
    FINISH_TEST();
}
END_TEST

START_TEST(linear_tf32_matches_cpu) {
    cuda_set_tf32(1);
    check_linear(111, 72, 200, TOL_TF32, "tf32");
    check_linear(256, 384, 128, TOL_TF32, "tf32");
    cuda_set_tf32(0);
    FINISH_TEST();
}
END_TEST

/* ---- attention ------------------------------------------------------------------------
 */

static void check_attention(int B, int T, int C, int NH) {
    const size_t nqkv = (size_t)B * T * 3 * C, ny = (size_t)B * T * C;
    const size_t natt = (size_t)B * NH * T * T;
    char label[96];
    float *qkv = host_random(nqkv, -1, 1);
    float *y = malloc(ny * sizeof(float)), *att = malloc(natt * sizeof(float));
    cpu_attention_forward(y, att, qkv, B, T, C, NH);
    float *d_qkv = dev_floats(qkv, nqkv), *d_y = dev_garbage(ny),
          *d_att = dev_garbage(natt);
    cuda_attention_forward(d_y, d_att, d_qkv, B, T, C, NH);
    snprintf(label, sizeof label, "attention_forward out B%d T%d C%d NH%d", B, T, C, NH);
    expect_close(label, d_y, y, ny, TOL_FP32);
    expect_close("attention_forward att", d_att, att, natt, TOL_FP32);

    /* backward from the CPU's probabilities; datt is scratch, dqkv overwritten */
    cuda_ops_upload(d_att, att, natt * sizeof(float));
    float *dy = host_random(ny, -1, 1);
    float *dqkv = malloc(nqkv * sizeof(float)), *datt = malloc(natt * sizeof(float));
    cpu_attention_backward(dqkv, datt, dy, qkv, att, B, T, C, NH);
    float *d_dy = dev_floats(dy, ny), *d_dqkv = dev_garbage(nqkv),
          *d_datt = dev_garbage(natt);
    cuda_attention_backward(d_dqkv, d_datt, d_dy, d_qkv, d_att, B, T, C, NH);
    snprintf(label, sizeof label, "attention_backward dqkv B%d T%d C%d NH%d", B, T, C, NH);
    expect_close(label, d_dqkv, dqkv, nqkv, TOL_FP32);
    DEV_FREE(d_qkv, d_y, d_att, d_dy, d_dqkv, d_datt);
    free(qkv), free(y), free(att), free(dy), free(dqkv), free(datt);
}

START_TEST(attention_matches_cpu) {
    check_attention(3, 37, 72, 4);    /* B <= NH: heads batched, batch rows looped */
    check_attention(5, 33, 32, 2);    /* B > NH: the other walk */
    check_attention(2, 64, 128, 4);   /* the course's bench shape per head */
    FINISH_TEST();
}
END_TEST

/* ---- GELU -------------------------------------------------------------------------------
 */

START_TEST(gelu_matches_cpu) {
    const size_t n = 10007;
    float *inp = host_random(n, -6, 6), *out = malloc(n * sizeof(float));
    float *d_inp = dev_floats(inp, n), *d_out = dev_garbage(n);
    cpu_gelu_forward(out, inp, n);   /* both leave gelu'(x) in place of x */
    cuda_gelu_forward(d_out, d_inp, n);
    expect_close("gelu_forward", d_out, out, n, TOL_FP32);
    expect_close("gelu_forward: gelu'(x) left in x", d_inp, inp, n, TOL_FP32);

    float *dout = host_random(n, -1, 1), *dinp = malloc(n * sizeof(float));
    cpu_gelu_backward(dinp, inp, dout, n);
    float *d_dout = dev_floats(dout, n), *d_dinp = dev_garbage(n);
    cuda_gelu_backward(d_dinp, d_inp, d_dout, n);
    expect_close("gelu_backward", d_dinp, dinp, n, TOL_FP32);
    DEV_FREE(d_inp, d_out, d_dout, d_dinp);
    free(inp), free(out), free(dout), free(dinp);
    FINISH_TEST();
}
END_TEST

/* ---- cross-entropy
 * ------------------------------------------------------------------------ */

static void check_crossentropy(int N, int V, int in_place) {
    const size_t n = (size_t)N * V;
    char label[96];
    float *logits = host_random(n, -4, 4);
    int *targets = host_tokens(N, V);
    float *probs = malloc(n * sizeof(float)), *losses = malloc(N * sizeof(float));
    cpu_crossentropy_forward(losses, probs, logits, targets, N, V);
    float *d_logits = dev_floats(logits, n), *d_losses = dev_garbage(N);
    float *d_probs = in_place ? d_logits : dev_garbage(n);
    int *d_targets = dev_upload(targets, N * sizeof(int));
    cuda_crossentropy_forward(d_losses, d_probs, d_logits, d_targets, N, V);
    snprintf(label, sizeof label, "crossentropy_forward probs N%d V%d%s", N, V,
             in_place ? " in place" : "");
    expect_close(label, d_probs, probs, n, TOL_FP32);
    expect_close("crossentropy_forward losses", d_losses, losses, N, TOL_FP32);

    /* backward from the CPU's probabilities */
    const float dloss = 1.0f / N;
    float *d_dlogits = in_place ? d_probs : dev_garbage(n);
    cuda_ops_upload(d_probs, probs, n * sizeof(float));
    float *dlogits = malloc(n * sizeof(float));
    cpu_crossentropy_backward(dlogits, probs, targets, dloss, N, V);
    cuda_crossentropy_backward(d_dlogits, d_probs, d_targets, dloss, N, V);
    snprintf(label, sizeof label, "crossentropy_backward%s", in_place ? " in place" : "");
    expect_close(label, d_dlogits, dlogits, n, TOL_FP32);
    if (in_place) DEV_FREE(d_logits, d_losses, d_targets);
    else DEV_FREE(d_logits, d_losses, d_targets, d_probs, d_dlogits);
    free(logits), free(targets), free(probs), free(losses), free(dlogits);
}

START_TEST(crossentropy_matches_cpu) {
    check_crossentropy(37, 259, 0);
    check_crossentropy(37, 259, 1);       /* as the model calls it */
    check_crossentropy(4, 50257, 1);      /* a GPT-2 sized vocabulary */
    FINISH_TEST();
}
END_TEST

/* ---- AdamW ------------------------------------------------------------------------------
 */

START_TEST(adamw_matches_cpu) {
    const size_t n = 10007;
    const adamw_config cfg = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                              .weight_decay = 0.1f};
    float *p = host_random(n, -1, 1), *g = host_random(n, -1, 1);
    float *m = host_random(n, -0.1, 0.1), *v = host_random(n, 1e-4, 1e-2);
    float *d_p = dev_floats(p, n), *d_g = dev_floats(g, n), *d_m = dev_floats(m, n),
          *d_v = dev_floats(v, n);
    for (int step = 1; step <= 3; step++) {
        cpu_adamw_update(p, g, m, v, n, &cfg, step);
        cuda_adamw_update(d_p, d_g, d_m, d_v, n, &cfg, step);
    }
    expect_close("adamw_update params (3 steps)", d_p, p, n, TOL_FP32);
    expect_close("adamw_update m", d_m, m, n, TOL_FP32);
    expect_close("adamw_update v", d_v, v, n, TOL_FP32);
    DEV_FREE(d_p, d_g, d_m, d_v);
    free(p), free(g), free(m), free(v);
    FINISH_TEST();
}
END_TEST

/* ---- vectors and transfers
 * --------------------------------------------------------------- */

START_TEST(vectors_match_cpu) {
    const size_t n = 100003;
    float *x = host_random(n, -1, 1), *y = host_random(n, -1, 1),
          *out = malloc(n * sizeof(float));
    float *d_x = dev_floats(x, n), *d_y = dev_floats(y, n), *d_out = dev_garbage(n);

    cpu_residual_forward(out, x, y, n);
    cuda_residual_forward(d_out, d_x, d_y, n);
    expect_identical("residual_forward", d_out, out, n);

    cpu_vec_add(y, x, n);
    cuda_vec_add(d_y, d_x, n);
    expect_identical("vec_add", d_y, y, n);

    cpu_vec_scale(y, 0.37f, n);
    cuda_vec_scale(d_y, 0.37f, n);
    expect_identical("vec_scale", d_y, y, n);

    cpu_vec_copy(out, y, n);
    cuda_vec_copy(d_out, d_y, n);
    expect_identical("vec_copy", d_out, out, n);

    cpu_vec_zero(out, n);
    cuda_vec_zero(d_out, n);
    expect_identical("vec_zero", d_out, out, n);

    /* both sum in double, in different orders: agreement far below float precision */
    const size_t big = 3000017;
    float *z = host_random(big, -1, 2);
    float *d_z = dev_floats(z, big);
    double cpu = cpu_vec_sum(z, big), gpu = cuda_vec_sum(d_z, big);
    double rel = fabs(gpu - cpu) / fabs(cpu);
    printf("  %-40s |gpu-cpu| %.3e  rel %.3e  (tol 1e-12)\n", "vec_sum", fabs(gpu - cpu),
           rel);
    ck_assert_msg(rel <= 1e-12, "vec_sum: %.17g vs %.17g", gpu, cpu);
    ck_assert_msg(cuda_vec_sum(d_z, 1) == (double)z[0], "vec_sum of one element");

    /* transfers of an odd byte count come back bit for bit */
    unsigned char bytes[1001], back[1001];
    for (size_t i = 0; i < sizeof bytes; i++) bytes[i] = (unsigned char)(i * 37 + 11);
    void *d_bytes = dev_upload(bytes, sizeof bytes);
    cuda_ops_synchronize();
    cuda_ops_download(back, d_bytes, sizeof back);
    ck_assert_int_eq(memcmp(bytes, back, sizeof bytes), 0);
    printf("  %-40s bit-identical round trip\n", "ops_upload / ops_download");
    DEV_FREE(d_x, d_y, d_out, d_z, d_bytes);
    free(x), free(y), free(out), free(z);
    FINISH_TEST();
}
END_TEST

/* Through the public ops.h entry points: a CUDA thread is dispatched to the GPU. */
START_TEST(ops_dispatch_to_gpu) {
    ck_assert_int_eq(device_current(), DEVICE_CUDA);
    const size_t n = 1000;
    float *x = host_random(n, -1, 1);
    float *d_x = dev_floats(x, n);
    vec_scale(d_x, 2.0f, n);
    cpu_vec_scale(x, 2.0f, n);
    ck_assert_msg(fabs(vec_sum(d_x, n) - cpu_vec_sum(x, n)) < 1e-9, "dispatch");
    printf("  %-40s device memory handled by the CUDA ops\n", "ops.h dispatch");
    DEV_FREE(d_x);
    free(x);
}
END_TEST

/* ---- the NCCL backend, on a world of one rank ------------------------------------------
 * One GPU allows one NCCL rank, so the collectives reduce nothing here; what is checked
 * is the plumbing: device and host (staged) buffers, in-place calls, async start and
 * wait, 16-bit types, split, barrier and teardown. */

static void expect_unchanged(const char *what, const float *dev, const float *want,
                             size_t n) {
    float *got = download(dev, n);
    ck_assert_msg(memcmp(got, want, n * sizeof(float)) == 0, "%s changed the data", what);
    free(got);
}

START_TEST(nccl_world_of_one) {
    comm_options opts = comm_options_default();
    opts.timeout_seconds = 30;
    comm_job *job = comm_job_create(&opts, 1, 0);
    unsigned char id[128];
    nccl_unique_id(id);
    comm *world = nccl_world(job, &job->ranks[0], 0, 1, id);
    ck_assert_str_eq(comm_backend_name(world), "nccl");
    ck_assert_int_eq(comm_size(world), 1);

    const size_t n = 1001;
    float *x = host_random(n, -1, 1), *host = host_copy(x, n);
    float *d_x = dev_floats(x, n), *d_all = dev_garbage(n);
    comm_allreduce(world, d_x, n, COMM_F32, COMM_SUM);
    expect_unchanged("allreduce sum", d_x, x, n);
    comm_allreduce(world, d_x, n, COMM_F32, COMM_AVG);
    expect_unchanged("allreduce avg", d_x, x, n);
    comm_reduce_scatter(world, d_x, d_x, n, COMM_F32, COMM_SUM);   /* in place */
    expect_unchanged("reduce_scatter", d_x, x, n);
    comm_allgather(world, d_x, d_all, n, COMM_F32);
    expect_unchanged("allgather", d_all, x, n);
    comm_broadcast(world, d_x, n, COMM_F32, 0);
    comm_reduce(world, d_x, n, COMM_F32, COMM_MAX, 0);
    expect_unchanged("broadcast, reduce", d_x, x, n);
    comm_request *req = comm_allreduce_start(world, d_x, n, COMM_F32, COMM_SUM);
    comm_wait(req);
    expect_unchanged("async allreduce", d_x, x, n);
    uint16_t bf16[64], bf16_back[64];   /* the top halves of floats: valid bf16 values */
    for (int i = 0; i < 64; i++) bf16[i] = (uint16_t)(comm_f32_to_bf16(x[i]));
    void *d_bf16 = dev_upload(bf16, sizeof bf16);
    comm_allreduce(world, d_bf16, 64, COMM_BF16, COMM_SUM);
    cuda_ops_download(bf16_back, d_bf16, sizeof bf16_back);
    ck_assert_int_eq(memcmp(bf16, bf16_back, sizeof bf16), 0);

    comm_allreduce(world, host, n, COMM_F32, COMM_SUM);   /* host memory: staged */
    ck_assert_int_eq(memcmp(host, x, n * sizeof(float)), 0);
    req = comm_allgather_start(world, host, host, n, COMM_F32);
    comm_wait(req);
    ck_assert_int_eq(memcmp(host, x, n * sizeof(float)), 0);

    comm *sub = comm_split(world, 0, 0, "sub");
    ck_assert_ptr_nonnull(sub);
    ck_assert_int_eq(comm_size(sub), 1);
    comm_allreduce(sub, d_x, n, COMM_F32, COMM_SUM);
    expect_unchanged("allreduce on a split group", d_x, x, n);
    comm_barrier(sub);
    comm_free(sub);
    comm_barrier(world);
    comm_stats stats = comm_stats_get(world);
    printf("  %-40s %llu calls, all data unchanged on one rank\n", "NCCL backend (1 rank)",
           (unsigned long long)(stats.calls[COMM_KIND_ALLREDUCE] +
                                stats.calls[COMM_KIND_ALLGATHER]));
    comm_job_free(job);
    DEV_FREE(d_x, d_all, d_bf16);
    free(x), free(host);
}
END_TEST

#endif /* USE_CUDA */

int main(void) {
    char why[160];
    if (device_gpu_count() == 0) {   /* always 0 in a build without GPU=1 */
        printf("SKIP: no GPU to test the CUDA ops on: %s\n",
               device_no_gpu_reason(why, sizeof why));
        return 77;
    }
#ifdef USE_CUDA
    Suite *suite = suite_create("gpu_ops");
    TCase *tc = tcase_create("gpu_vs_cpu");
    suite_add_tcase(suite, tc);
    tcase_add_checked_fixture(tc, start_test, NULL);
    device_select(DEVICE_CUDA, 0);
    printf("GPU ops vs CPU ops (relative error = max |gpu-cpu| / max |cpu|)\n");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, embedding_matches_cpu);
    tcase_add_test(tc, position_matches_cpu);
    tcase_add_test(tc, layernorm_matches_cpu);
    tcase_add_test(tc, linear_matches_cpu);
    tcase_add_test(tc, linear_tf32_matches_cpu);
    tcase_add_test(tc, attention_matches_cpu);
    tcase_add_test(tc, gelu_matches_cpu);
    tcase_add_test(tc, crossentropy_matches_cpu);
    tcase_add_test(tc, adamw_matches_cpu);
    tcase_add_test(tc, vectors_match_cpu);
    tcase_add_test(tc, ops_dispatch_to_gpu);
    tcase_add_test(tc, nccl_world_of_one);
    SRunner *sr = srunner_create(suite);
    /* CUDA does not survive fork() once initialised in the parent */
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    print_worst_per_op();
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
#else
    return 77;   /* unreachable: a build without GPU=1 sees no GPU */
#endif
}
