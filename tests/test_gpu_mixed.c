/* The 16-bit ops on the GPU (gpu/ops_cuda_mixed.cu) against the CPU's (ops_mixed.c).
 *
 * Each op of ops_mixed.h runs twice through the same call: on the CPU (device_select
 * DEVICE_CPU, host buffers) and on the GPU (DEVICE_CUDA, device buffers, so the call
 * goes through ops_mixed.c's dispatch to the backend's table), in bf16 and in fp16, on
 * the same random non-zero 16-bit inputs. Both sides compute in fp32 on the same values
 * and round once, so a 16-bit output may differ by the rounding of an fp32 difference:
 * at most one unit in the last place, 2^-7 (bf16) or 2^-10 (fp16) of max |cpu| (the
 * relative error printed is max |gpu - cpu| / max |cpu|); fp32 outputs (parameter
 * gradients, LayerNorm's statistics, losses, AdamW's state) within 1e-5, as
 * test_gpu_ops holds the fp32 ops; moves and conversions bit for bit. A control shows
 * the 16-bit bound can fail: the CPU's bf16 linear judged as an fp16 result is outside
 * fp16's bound. "WORST <op> <precision> rel E (tol T)" lines come last.
 *
 * Without a GPU it prints "SKIP: <why>" and exits 77. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"

#ifdef USE_CUDA
#include "ops.h"
#include "ops_mixed.h"
#include "precision.h"
#include "rng.h"

#define TOL_FP32 1e-5

static double tol16(precision p) { return p == PRECISION_BF16 ? 0x1p-7 : 0x1p-10; }

/* ---- the worst error of each op and precision -------------------------------------- */
enum { MAX_OPS = 64 };
static struct {
    char op[64];
    double worst, tol;
} records[MAX_OPS];
static int record_count, failures;
static char first_failure[192];

static void record(const char *what, precision p, double rel, double tol, int ok) {
    char op[64];
    snprintf(op, sizeof op, "%.*s %s", (int)strcspn(what, " ,"), what, precision_name(p));
    int i = 0;
    while (i < record_count && strcmp(records[i].op, op) != 0) i++;
    if (i == record_count && record_count < MAX_OPS)
        snprintf(records[record_count++].op, sizeof records[0].op, "%s", op);
    if (i < record_count) {
        if (rel > records[i].worst || isnan(rel)) records[i].worst = rel;
        if (tol > records[i].tol) records[i].tol = tol;
    }
    if (!ok && failures++ == 0)
        snprintf(first_failure, sizeof first_failure, "%s %s: relative error %.3e over %.0e",
                 what, precision_name(p), rel, tol);
}

static void start_test(void) {
    failures = 0;
    first_failure[0] = '\0';
    device_select(DEVICE_CPU, 0);
}

#define FINISH_TEST()                                                                     \
    ck_assert_msg(failures == 0, "%d comparison%s over tolerance; the first: %s", failures, \
                  failures == 1 ? "" : "s", first_failure)

/* ---- buffers --------------------------------------------------------------------- */
static uint64_t next_stream = 1;

static float *random_floats(size_t n, double lo, double hi) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    ck_assert_ptr_nonnull(x);
    const uint64_t stream = next_stream++;
    for (size_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * rng_uniform(11, stream, i));
    return x;
}

/* n random values rounded to p (fp32: as they are), as p's bits */
static void *random_in(precision p, size_t n, double lo, double hi) {
    float *x = random_floats(n, lo, hi);
    if (p == PRECISION_FP32) return x;
    uint16_t *h = malloc((n ? n : 1) * sizeof(uint16_t));
    ck_assert_ptr_nonnull(h);
    precision_to16(p, h, x, n);
    free(x);
    return h;
}

static void *clone(const void *src, size_t bytes) {
    void *x = malloc(bytes ? bytes : 1);
    ck_assert_ptr_nonnull(x);
    memcpy(x, src, bytes);
    return x;
}

/* The host buffer copied to the GPU (selected by the caller) */
static void *up(const void *host, size_t bytes) {
    void *d = device_malloc(bytes ? bytes : 1);
    ops_upload(d, host, bytes);
    return d;
}

static float *widened(precision p, const void *x, size_t n) {
    float *w = malloc((n ? n : 1) * sizeof(float));
    ck_assert_ptr_nonnull(w);
    if (p == PRECISION_FP32) memcpy(w, x, n * sizeof(float));
    else precision_from16(p, w, x, n);
    return w;
}

/* Downloads n elements of q (the buffer's precision) from dev and compares them with
 * host's: bit for bit when tol < 0, else by relative error. p labels the run. */
static void compare(const char *what, precision p, precision q, const void *dev,
                    const void *host, size_t n, double tol) {
    const size_t bytes = n * precision_bytes(q);
    void *got = malloc(bytes ? bytes : 1);
    ck_assert_ptr_nonnull(got);
    const device_kind was = device_current();   /* the download is the GPU's */
    device_select(DEVICE_CUDA, 0);
    ops_download(got, dev, bytes);
    device_select(was, 0);
    float *a = widened(q, got, n), *b = widened(q, host, n);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        /* equal infinities and two NaNs agree (their difference would be NaN) */
        const int same = a[i] == b[i] || (isnan(a[i]) && isnan(b[i]));
        const double d = same                        ? 0.0
                         : isnan(a[i]) || isnan(b[i]) ? INFINITY
                                                      : fabs((double)a[i] - b[i]);
        if (d > worst || isnan(d)) worst = d;
        if (isfinite(b[i]) && fabs((double)b[i]) > scale) scale = fabs((double)b[i]);
    }
    const double rel = scale > 0 ? worst / scale : worst;
    const int ok = tol < 0 ? memcmp(got, host, bytes) == 0 : rel <= tol;
    printf("  %-36s %s  max |gpu-cpu| %.3e  rel %.3e  (%s%.0e)\n", what, precision_name(p),
           worst, rel, tol < 0 ? "bits, " : "tol ", tol < 0 ? 0.0 : tol);
    record(what, p, rel, tol < 0 ? 0 : tol, ok);
    free(got), free(a), free(b);
}

static void dev_free_all(void **ptrs, size_t count) {
    for (size_t i = 0; i < count; i++) device_free(ptrs[i]);
}
#define DEV_FREE(...)                                                     \
    do {                                                                  \
        void *list_[] = {__VA_ARGS__};                                    \
        dev_free_all(list_, sizeof list_ / sizeof list_[0]);              \
    } while (0)
#define ON_CPU() device_select(DEVICE_CPU, 0)
#define ON_GPU() device_select(DEVICE_CUDA, 0)
#define B16(p, n) ((n) * precision_bytes(p))

static const precision both[] = {PRECISION_BF16, PRECISION_FP16};

/* ---- conversions and vectors -------------------------------------------------------- */

START_TEST(conversions_bit_for_bit) {
    /* specials: zeros, infinities, NaN, fp16's subnormals and overflow, halfway cases */
    const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 6e-8f, 3e-5f, 65519.0f,
                             65520.0f, 1e30f, 1.00390625f, 1.01171875f, -2.5e-39f};
    const size_t ns = sizeof special / sizeof special[0], n = 4099 + ns;
    for (int k = 0; k < 2; k++) {
        const precision p = both[k];
        float *x = random_floats(n, -300, 300);
        memcpy(x, special, sizeof special);
        void *h = malloc(B16(p, n));
        ON_CPU();
        mixed_round(p, h, x, n);
        float *back = malloc(n * sizeof(float));
        mixed_widen(p, back, h, n);
        ON_GPU();
        float *d_x = up(x, n * sizeof(float));
        void *d_h = device_malloc(B16(p, n));
        float *d_back = device_malloc(n * sizeof(float));
        mixed_round(p, d_h, d_x, n);
        mixed_widen(p, d_back, d_h, n);
        compare("round", p, p, d_h, h, n, -1);
        compare("widen", p, PRECISION_FP32, d_back, back, n, -1);
        /* in place: x's first n 16-bit elements */
        mixed_round_in_place(p, d_x, n);
        compare("round_in_place", p, p, d_x, h, n, -1);
        DEV_FREE(d_x, d_h, d_back);
        free(x), free(h), free(back);
    }
    FINISH_TEST();
}
END_TEST

START_TEST(vectors_match_cpu) {
    const size_t n = 5003;
    for (int k = 0; k < 2; k++) {
        const precision p = both[k];
        void *y = random_in(p, n, -2, 2), *x = random_in(p, n, -2, 2);
        ON_GPU();
        void *d_y = up(y, B16(p, n)), *d_x = up(x, B16(p, n)), *d_z = up(x, B16(p, n));
        mixed_vec_add(p, d_y, d_x, n);
        mixed_vec_copy(p, d_z, precision_at(p, d_z, 7), n - 7);   /* overlapping: memmove */
        ck_assert_int_eq(mixed_vec_finite(p, d_y, n), 1);
        ON_CPU();
        mixed_vec_add(p, y, x, n);
        void *z = clone(x, B16(p, n));
        mixed_vec_copy(p, z, precision_at(p, z, 7), n - 7);
        compare("vec_add", p, p, d_y, y, n, -1);
        compare("vec_copy (overlapping)", p, p, d_z, z, n, -1);
        /* one inf among them: not finite, on both devices */
        const float inf = INFINITY;
        mixed_round(p, precision_at(p, y, n / 2), &inf, 1);
        ON_GPU();
        ops_upload(d_y, y, B16(p, n));
        ck_assert_int_eq(mixed_vec_finite(p, d_y, n), 0);
        mixed_vec_zero(p, d_y, n);
        ck_assert_int_eq(mixed_vec_finite(p, d_y, n), 1);
        ON_CPU();
        ck_assert_int_eq(mixed_vec_finite(p, y, n), 0);
        mixed_vec_zero(p, y, n);
        compare("vec_zero", p, p, d_y, y, n, -1);
        DEV_FREE(d_y, d_x, d_z);
        free(y), free(x), free(z);
    }
    FINISH_TEST();
}
END_TEST

START_TEST(adamw_matches_cpu) {
    const size_t n = 10007;
    const adamw_config cfg = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                              .weight_decay = 0.1f, .warmup_steps = 2};
    const precision grads_in[] = {PRECISION_BF16, PRECISION_FP16, PRECISION_FP32};
    for (int k = 0; k < 3; k++) {
        const precision p = grads_in[k];
        float *w = random_floats(n, -1, 1), *m = random_floats(n, -0.1, 0.1);
        float *v = random_floats(n, 1e-4, 1e-2);
        void *g = random_in(p, n, -1, 1);
        ON_GPU();
        float *d_w = up(w, n * 4), *d_m = up(m, n * 4), *d_v = up(v, n * 4);
        void *d_g = up(g, n * precision_bytes(p));
        for (int step = 1; step <= 3; step++)
            mixed_adamw_update(p, d_w, d_g, 0.25f, d_m, d_v, n, &cfg, step);
        ON_CPU();
        for (int step = 1; step <= 3; step++)
            mixed_adamw_update(p, w, g, 0.25f, m, v, n, &cfg, step);
        compare("adamw_update params", p, PRECISION_FP32, d_w, w, n, TOL_FP32);
        compare("adamw_update m", p, PRECISION_FP32, d_m, m, n, TOL_FP32);
        compare("adamw_update v", p, PRECISION_FP32, d_v, v, n, TOL_FP32);
        DEV_FREE(d_w, d_m, d_v, d_g);
        free(w), free(m), free(v), free(g);
    }
    FINISH_TEST();
}
END_TEST

/* ---- the model's ops ------------------------------------------------------------------ */

START_TEST(embeddings_match_cpu) {
    const int B = 3, T = 37, C = 72, V = 259, N = B * T, vs = 50, vl = 100;
    int *tokens = malloc(N * sizeof(int));
    for (int i = 0; i < N; i++) tokens[i] = (int)(rng_hash(11, 99, i) % V);
    for (int k = 0; k < 2; k++) {
        const precision p = both[k];
        void *wte = random_in(p, (size_t)vl * C, -1, 1), *wpe = random_in(p, (size_t)T * C, -1, 1);
        void *out = random_in(p, (size_t)N * C, 5, 6), *dout = random_in(p, (size_t)N * C, -1, 1);
        float *dwte = random_floats((size_t)vl * C, -1, 1), *dwpe = random_floats((size_t)T * C, -1, 1);
        ON_GPU();
        int *d_tok = up(tokens, N * sizeof(int));
        void *d_wte = up(wte, B16(p, (size_t)vl * C)), *d_wpe = up(wpe, B16(p, (size_t)T * C));
        void *d_out = up(out, B16(p, (size_t)N * C)), *d_dout = up(dout, B16(p, (size_t)N * C));
        float *d_dwte = up(dwte, (size_t)vl * C * 4), *d_dwpe = up(dwpe, (size_t)T * C * 4);
        mixed_embedding_forward(p, d_out, d_tok, d_wte, N, C, vs, vl);
        mixed_position_forward(p, d_out, d_wpe, B, T, C);
        mixed_embedding_backward(p, d_dwte, d_dout, d_tok, N, C, vs, vl);
        mixed_position_backward(p, d_dwpe, d_dout, B, T, C);
        ON_CPU();
        mixed_embedding_forward(p, out, tokens, wte, N, C, vs, vl);
        mixed_position_forward(p, out, wpe, B, T, C);
        mixed_embedding_backward(p, dwte, dout, tokens, N, C, vs, vl);
        mixed_position_backward(p, dwpe, dout, B, T, C);
        compare("embedding+position_forward", p, p, d_out, out, (size_t)N * C, -1);
        compare("embedding_backward (+=)", p, PRECISION_FP32, d_dwte, dwte, (size_t)vl * C, -1);
        compare("position_backward (+=)", p, PRECISION_FP32, d_dwpe, dwpe, (size_t)T * C, TOL_FP32);
        DEV_FREE(d_tok, d_wte, d_wpe, d_out, d_dout, d_dwte, d_dwpe);
        free(wte), free(wpe), free(out), free(dout), free(dwte), free(dwpe);
    }
    free(tokens);
    FINISH_TEST();
}
END_TEST

START_TEST(layernorm_matches_cpu) {
    const int N = 300, C = 100;
    const size_t n = (size_t)N * C;
    for (int k = 0; k < 2; k++) {
        const precision p = both[k];
        void *inp = random_in(p, n, 2, 4), *w = random_in(p, C, 0.5, 1.5);
        void *b = random_in(p, C, -1, 1), *dout = random_in(p, n, -1, 1);
        void *dinp = random_in(p, n, -1, 1), *out = random_in(p, n, 7, 8);
        float *mean = random_floats(N, 7, 8), *rstd = random_floats(N, 7, 8);
        float *dw = random_floats(C, -1, 1), *db = random_floats(C, -1, 1);
        ON_GPU();
        void *d_inp = up(inp, B16(p, n)), *d_w = up(w, B16(p, C)), *d_b = up(b, B16(p, C));
        void *d_dout = up(dout, B16(p, n)), *d_dinp = up(dinp, B16(p, n)), *d_out = up(out, B16(p, n));
        float *d_mean = up(mean, N * 4), *d_rstd = up(rstd, N * 4);
        float *d_dw = up(dw, C * 4), *d_db = up(db, C * 4);
        mixed_layernorm_forward(p, d_out, d_mean, d_rstd, d_inp, d_w, d_b, N, C);
        ON_CPU();
        mixed_layernorm_forward(p, out, mean, rstd, inp, w, b, N, C);
        compare("layernorm_forward out", p, p, d_out, out, n, tol16(p));
        compare("layernorm_forward mean", p, PRECISION_FP32, d_mean, mean, N, TOL_FP32);
        compare("layernorm_forward rstd", p, PRECISION_FP32, d_rstd, rstd, N, TOL_FP32);
        ON_GPU();   /* backward from the CPU's statistics: the same inputs on both */
        ops_upload(d_mean, mean, N * 4);
        ops_upload(d_rstd, rstd, N * 4);
        mixed_layernorm_backward(p, d_dinp, d_dw, d_db, d_dout, d_inp, d_w, d_mean, d_rstd, N, C);
        ON_CPU();
        mixed_layernorm_backward(p, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
        compare("layernorm_backward dinp (+=)", p, p, d_dinp, dinp, n, tol16(p));
        compare("layernorm_backward dweight (+=)", p, PRECISION_FP32, d_dw, dw, C, TOL_FP32);
        compare("layernorm_backward dbias (+=)", p, PRECISION_FP32, d_db, db, C, TOL_FP32);
        DEV_FREE(d_inp, d_w, d_b, d_dout, d_dinp, d_out, d_mean, d_rstd, d_dw, d_db);
        free(inp), free(w), free(b), free(dout), free(dinp), free(out), free(mean), free(rstd);
        free(dw), free(db);
    }
    FINISH_TEST();
}
END_TEST

/* out, dinp, dweight, dbias of one linear in p, GPU against CPU */
static void check_linear(precision p, int N, int IC, int OC) {
    const size_t ni = (size_t)N * IC, no = (size_t)N * OC, nw = (size_t)OC * IC;
    void *inp = random_in(p, ni, -1, 1), *w = random_in(p, nw, -1, 1), *b = random_in(p, OC, -1, 1);
    void *dout = random_in(p, no, -1, 1), *out = random_in(p, no, 9, 10), *dinp = random_in(p, ni, 9, 10);
    float *dw = random_floats(nw, -1, 1), *db = random_floats(OC, -1, 1);
    ON_GPU();
    void *d_inp = up(inp, B16(p, ni)), *d_w = up(w, B16(p, nw)), *d_b = up(b, B16(p, OC));
    void *d_dout = up(dout, B16(p, no)), *d_out = up(out, B16(p, no)), *d_dinp = up(dinp, B16(p, ni));
    float *d_dw = up(dw, nw * 4), *d_db = up(db, OC * 4);
    mixed_linear_forward(p, d_out, d_inp, d_w, d_b, N, IC, OC);
    mixed_linear_backward(p, d_dinp, d_dw, d_db, d_dout, d_inp, d_w, N, IC, OC);
    ON_CPU();
    mixed_linear_forward(p, out, inp, w, b, N, IC, OC);
    mixed_linear_backward(p, dinp, dw, db, dout, inp, w, N, IC, OC);
    compare("linear_forward out (+bias)", p, p, d_out, out, no, tol16(p));
    compare("linear_backward dinp", p, p, d_dinp, dinp, ni, tol16(p));
    compare("linear_backward dweight (+=)", p, PRECISION_FP32, d_dw, dw, nw, TOL_FP32);
    compare("linear_backward dbias (+=)", p, PRECISION_FP32, d_db, db, OC, TOL_FP32);
    DEV_FREE(d_inp, d_w, d_b, d_dout, d_out, d_dinp, d_dw, d_db);
    free(inp), free(w), free(b), free(dout), free(out), free(dinp), free(dw), free(db);
}

START_TEST(linear_matches_cpu) {
    for (int k = 0; k < 2; k++) {
        check_linear(both[k], 111, 72, 259);
        check_linear(both[k], 64, 256, 768);   /* bench256's shape */
    }
    FINISH_TEST();
}
END_TEST

/* The control: the CPU's bf16 product of the same inputs (bf16 values, exact in fp16)
 * judged by fp16's bound is outside it, so a GPU that rounded to the wrong format, or
 * rounded twice, fails the comparison above. */
START_TEST(control_bf16_is_not_fp16) {
    const int N = 64, IC = 256, OC = 768;
    uint16_t *inp = random_in(PRECISION_BF16, (size_t)N * IC, -1, 1);
    uint16_t *w = random_in(PRECISION_BF16, (size_t)OC * IC, -1, 1);
    float *fi = widened(PRECISION_BF16, inp, (size_t)N * IC), *fw = widened(PRECISION_BF16, w, (size_t)OC * IC);
    uint16_t *hi = malloc((size_t)N * IC * 2), *hw = malloc((size_t)OC * IC * 2);
    precision_to16(PRECISION_FP16, hi, fi, (size_t)N * IC);
    precision_to16(PRECISION_FP16, hw, fw, (size_t)OC * IC);
    uint16_t *ob = malloc((size_t)N * OC * 2), *oh = malloc((size_t)N * OC * 2);
    mixed_linear_forward(PRECISION_BF16, ob, inp, w, NULL, N, IC, OC);
    mixed_linear_forward(PRECISION_FP16, oh, hi, hw, NULL, N, IC, OC);
    float *a = widened(PRECISION_BF16, ob, (size_t)N * OC), *b = widened(PRECISION_FP16, oh, (size_t)N * OC);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < (size_t)N * OC; i++) {
        if (fabs((double)a[i] - b[i]) > worst) worst = fabs((double)a[i] - b[i]);
        if (fabs((double)b[i]) > scale) scale = fabs((double)b[i]);
    }
    printf("  control: bf16 product vs fp16's, rel %.3e against fp16's bound %.0e\n",
           worst / scale, tol16(PRECISION_FP16));
    ck_assert_msg(worst / scale > tol16(PRECISION_FP16), "the control passed: the bound is too loose");
    free(inp), free(w), free(fi), free(fw), free(hi), free(hw), free(ob), free(oh), free(a), free(b);
}
END_TEST

START_TEST(attention_matches_cpu) {
    const int B = 3, T = 37, C = 72, NH = 4;
    const size_t nq = (size_t)B * T * 3 * C, ny = (size_t)B * T * C, na = (size_t)B * NH * T * T;
    for (int k = 0; k < 2; k++) {
        const precision p = both[k];
        void *qkv = random_in(p, nq, -1, 1), *dy = random_in(p, ny, -1, 1);
        void *y = random_in(p, ny, 9, 10), *att = random_in(p, na, 9, 10), *dq = random_in(p, nq, 9, 10);
        ON_GPU();
        void *d_qkv = up(qkv, B16(p, nq)), *d_dy = up(dy, B16(p, ny)), *d_y = up(y, B16(p, ny));
        void *d_att = up(att, B16(p, na)), *d_dq = up(dq, B16(p, nq)), *d_da = up(att, B16(p, na));
        mixed_attention_forward(p, d_y, d_att, d_qkv, B, T, C, NH);
        ON_CPU();
        mixed_attention_forward(p, y, att, qkv, B, T, C, NH);
        compare("attention_forward out", p, p, d_y, y, ny, tol16(p));
        compare("attention_forward att", p, p, d_att, att, na, tol16(p));
        ON_GPU();   /* backward from the CPU's probabilities */
        ops_upload(d_att, att, B16(p, na));
        mixed_attention_backward(p, d_dq, d_da, d_dy, d_qkv, d_att, B, T, C, NH);
        ON_CPU();
        void *da = clone(att, B16(p, na));
        mixed_attention_backward(p, dq, da, dy, qkv, att, B, T, C, NH);
        compare("attention_backward dqkv", p, p, d_dq, dq, nq, tol16(p));
        DEV_FREE(d_qkv, d_dy, d_y, d_att, d_dq, d_da);
        free(qkv), free(dy), free(y), free(att), free(dq), free(da);
    }
    FINISH_TEST();
}
END_TEST

START_TEST(gelu_and_crossentropy_match_cpu) {
    const size_t n = 7001;
    const int N = 37, V = 259;
    const size_t nl = (size_t)N * V;
    int *targets = malloc(N * sizeof(int));
    for (int i = 0; i < N; i++) targets[i] = (int)(rng_hash(11, 77, i) % V);
    for (int k = 0; k < 2; k++) {
        const precision p = both[k];
        void *x = random_in(p, n, -4, 4), *dout = random_in(p, n, -1, 1), *out = random_in(p, n, 9, 10);
        void *logits = random_in(p, nl, -4, 4);
        float *losses = random_floats(N, 9, 10);
        ON_GPU();
        void *d_x = up(x, B16(p, n)), *d_dout = up(dout, B16(p, n)), *d_out = up(out, B16(p, n));
        void *d_logits = up(logits, B16(p, nl));
        float *d_losses = up(losses, N * 4);
        int *d_t = up(targets, N * sizeof(int));
        mixed_gelu_forward(p, d_out, d_x, n);
        mixed_gelu_backward(p, d_dout, d_x, d_dout, n);   /* in place, as the model does */
        mixed_crossentropy_forward(p, d_losses, d_logits, d_logits, d_t, N, V);
        ON_CPU();
        mixed_gelu_forward(p, out, x, n);
        mixed_gelu_backward(p, dout, x, dout, n);
        mixed_crossentropy_forward(p, losses, logits, logits, targets, N, V);
        compare("gelu_forward out", p, p, d_out, out, n, tol16(p));
        compare("gelu_forward gelu'(x)", p, p, d_x, x, n, tol16(p));
        compare("gelu_backward dinp", p, p, d_dout, dout, n, tol16(p));
        compare("crossentropy_forward losses", p, PRECISION_FP32, d_losses, losses, N, TOL_FP32);
        compare("crossentropy_forward probs", p, p, d_logits, logits, nl, tol16(p));
        ON_GPU();   /* backward from the CPU's probabilities */
        ops_upload(d_logits, logits, B16(p, nl));
        mixed_crossentropy_backward(p, d_logits, d_logits, d_t, 0.125f, N, V);
        ON_CPU();
        mixed_crossentropy_backward(p, logits, logits, targets, 0.125f, N, V);
        compare("crossentropy_backward dlogits", p, p, d_logits, logits, nl, tol16(p));
        DEV_FREE(d_x, d_dout, d_out, d_logits, d_losses, d_t);
        free(x), free(dout), free(out), free(logits), free(losses);
    }
    free(targets);
    FINISH_TEST();
}
END_TEST

#endif /* USE_CUDA */

int main(void) {
    char why[160];
    if (device_gpu_count() == 0) {   /* always 0 in a build without GPU=1 */
        printf("SKIP: no GPU to test the 16-bit CUDA ops on: %s\n",
               device_no_gpu_reason(why, sizeof why));
        return 77;
    }
#ifdef USE_CUDA
    Suite *suite = suite_create("gpu_mixed");
    TCase *tc = tcase_create("gpu_vs_cpu_16bit");
    suite_add_tcase(suite, tc);
    tcase_add_checked_fixture(tc, start_test, NULL);
    tcase_set_timeout(tc, 120);
    printf("16-bit GPU ops vs CPU ops (rel = max |gpu-cpu| / max |cpu|)\n");
    tcase_add_test(tc, conversions_bit_for_bit);
    tcase_add_test(tc, vectors_match_cpu);
    tcase_add_test(tc, adamw_matches_cpu);
    tcase_add_test(tc, embeddings_match_cpu);
    tcase_add_test(tc, layernorm_matches_cpu);
    tcase_add_test(tc, linear_matches_cpu);
    tcase_add_test(tc, control_bf16_is_not_fp16);
    tcase_add_test(tc, attention_matches_cpu);
    tcase_add_test(tc, gelu_and_crossentropy_match_cpu);
    SRunner *sr = srunner_create(suite);
    srunner_set_fork_status(sr, CK_NOFORK);   /* CUDA does not survive fork() */
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    printf("worst relative error per op, gpu vs cpu:\n");
    for (int i = 0; i < record_count; i++)
        printf("WORST %-34s rel %.3e  (tol %.0e)%s\n", records[i].op, records[i].worst,
               records[i].tol, records[i].worst <= records[i].tol ? "" : "  FAILED");
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
#else
    return 77;
#endif
}
