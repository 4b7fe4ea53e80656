/* The model's ops in a run's precision (ops_mixed.h), on the CPU.
 *
 * fp32 calls the ops.h twin. bf16 and fp16 are the plain reference: the 16-bit inputs
 * widened to fp32 scratch (exact), the fp32 CPU op (ops_cpu.h) run on them, its outputs
 * rounded back once. So each 16-bit op computes what its fp32 twin computes on the same
 * (16-bit) values, bit for bit, and only the linears differ: their products run through
 * matmul16 (16-bit multiplies, fp32 sums), the point of 16 bits on this CPU.
 *
 * The CPU ops are called, not the ops.h ones, so that a watcher sees one op per mixed
 * op, with its traffic in the bytes of p. Row-wise ops work in chunks of rows, so that
 * the scratch stays small; ops whose fp32 twin sums over all rows (the position
 * gradient) widen all rows at once, since summing chunk by chunk would round
 * differently; layer norm (ops_mixed_layernorm.c) carries its sums across chunks. Two hot ones skip the scratch with the same
 * bits: the linear's dbias (the twin's sums, read from 16 bits) and bf16's residual add.
 *
 * The scratch is one workspace per thread, grown when an op needs more and never
 * shrunk: a training loop allocates nothing after its first step. It is library
 * scratch (as oneDNN's is), so plain aligned memory, not the accounting allocator. */
#include "ops_mixed.h"

#include "device.h"
#include "fp8_linear.h"
#include "matmul16.h"
#include "matmul_f32.h"
#include "number_formats.h"
#include "ops.h"
#include "ops_cpu.h"
#include "ops_mixed_internal.h"
#include "ops_mixed_table.h"
#include "ops_observe.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK_FLOATS MIXED_CHUNK_FLOATS

void *precision_at(precision p, const void *base, size_t i) {
    return (char *)base + i * precision_bytes(p);
}

/* ---- the per-thread workspace --------------------------------------------------- */

typedef struct {
    float *floats;
    size_t capacity;   /* in floats */
} mixed_workspace;

static pthread_key_t workspace_key;
static pthread_once_t workspace_key_once = PTHREAD_ONCE_INIT;

static void workspace_free(void *arg) {
    mixed_workspace *w = arg;
    if (!w) return;
    free(w->floats);
    free(w);
}

static void workspace_make_key(void) { pthread_key_create(&workspace_key, workspace_free); }

static void out_of_memory(size_t bytes) {
    fprintf(stderr, "ops_mixed: out of memory (%zu bytes of scratch)\n", bytes);
    exit(1);
}

/* The calling thread's workspace, at least n floats (64-byte aligned). Its contents are
 * not kept: each op fills what it uses. */
static float *workspace(size_t n) {
    pthread_once(&workspace_key_once, workspace_make_key);
    mixed_workspace *w = pthread_getspecific(workspace_key);
    if (!w) {
        w = calloc(1, sizeof *w);
        if (!w) out_of_memory(sizeof *w);
        pthread_setspecific(workspace_key, w);
    }
    if (n > w->capacity) {
        const size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
        free(w->floats);
        w->floats = aligned_alloc(64, bytes);
        if (!w->floats) out_of_memory(bytes);
        w->capacity = bytes / sizeof(float);
    }
    return w->floats;
}

float *mixed_scratch(size_t n) { return workspace(n); }

size_t ops_mixed_scratch_bytes(void) {
    pthread_once(&workspace_key_once, workspace_make_key);
    const mixed_workspace *w = pthread_getspecific(workspace_key);
    return w ? w->capacity * sizeof(float) : 0;
}

void ops_mixed_release_thread(void) {
    pthread_once(&workspace_key_once, workspace_make_key);
    workspace_free(pthread_getspecific(workspace_key));
    pthread_setspecific(workspace_key, NULL);
    matmul16_release_thread();   /* the linears' primitives: the same thread's scratch */
    matmul_f32_release_thread();   /* and the fp32 engine's, with its weight layouts */
    fp8_linear_release_thread();
}

int mixed_chunk_rows(size_t width) {
    size_t rows = width ? CHUNK_FLOATS / width : 1;
    return rows ? (int)rows : 1;
}

/* ---- conversions and watching ---------------------------------------------------- */

static void widen(precision p, float *dst, const void *src, size_t n) {
    precision_from16(p, dst, src, n);
}

static void round_to(precision p, void *dst, const float *src, size_t n) {
    precision_to16(p, dst, src, n);
}

/* Bytes of n elements of p, and of n fp32 values, for the traffic an op reports. */
static double bytes_of(precision p, double n) { return n * (double)precision_bytes(p); }
#define F32(n) (4.0 * (double)(n))

/* A 16-bit op begins: told to the watchers. Returns whether
 * the thread is watched (for mixed_end). bytes is evaluated by the caller; it is cheap. */
int mixed_begin(op_kind kind, double bytes) {
    const int watched = ops_watched();
    if (watched) ops_watch_begin(kind, bytes);
    return watched;
}

void mixed_end(int watched, op_kind kind) {
    if (watched) ops_watch_end(kind);
}

/* A matrix product through matmul16, told to the profiler as ops_cpu.c tells sgemm's. */
static void product16(precision p, int trans_a, int trans_b, int M, int N, int K,
                      const void *A, int lda, const void *B, int ldb, float beta, float *C,
                      int ldc) {
    ops_gemm_begin(trans_a, trans_b, M, N, K);
    matmul16(p, trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, ldc);
    ops_gemm_end();
}

/* The same, rounded once to 16 bits by the product itself (bias of p added before). */
static void product16_out16(precision p, int trans_a, int trans_b, int M, int N, int K,
                            const void *A, int lda, const void *B, int ldb, const void *bias,
                            void *C, int ldc) {
    ops_gemm_begin(trans_a, trans_b, M, N, K);
    matmul16_out16(p, trans_a, trans_b, M, N, K, A, lda, B, ldb, bias, C, ldc);
    ops_gemm_end();
}

/* ---- whole vectors ------------------------------------------------------------------ */

void mixed_round(precision p, void *dst, const float *src, size_t n) {
    if (p == PRECISION_FP32) {
        vec_copy(dst, src, n);
        return;
    }
    const int w = mixed_begin(OP_VECTOR, F32(n) + bytes_of(p, n));
    MIXED_ON_GPU(w, OP_VECTOR, round, p, dst, src, n);
    round_to(p, dst, src, n);
    mixed_end(w, OP_VECTOR);
}

void mixed_widen(precision p, float *dst, const void *src, size_t n) {
    if (p == PRECISION_FP32) {
        vec_copy(dst, src, n);
        return;
    }
    const int w = mixed_begin(OP_VECTOR, F32(n) + bytes_of(p, n));
    MIXED_ON_GPU(w, OP_VECTOR, widen, p, dst, src, n);
    widen(p, dst, src, n);
    mixed_end(w, OP_VECTOR);
}

/* ---- embeddings ------------------------------------------------------------------ */

void mixed_embedding_forward(precision p, void *out, const int *tokens, const void *wte,
                             int N, int C, int vocab_start, int vocab_len) {
    if (p == PRECISION_FP32) {
        embedding_forward(out, tokens, wte, N, C, vocab_start, vocab_len);
        return;
    }
    const int w = mixed_begin(OP_EMBEDDING,
                              bytes_of(p, 2.0 * N * C));
    MIXED_ON_GPU(w, OP_EMBEDDING, embedding_forward, p, out, tokens, wte, N, C, vocab_start, vocab_len);
    /* a copy of rows: widening and rounding back gives the same bits, so none is done */
    const size_t row_bytes = (size_t)C * precision_bytes(p);
    for (int n = 0; n < N; n++) {
        unsigned row = (unsigned)(tokens[n] - vocab_start);
        void *o = precision_at(p, out, (size_t)n * C);
        if (row < (unsigned)vocab_len)
            memcpy(o, precision_at(p, wte, (size_t)row * C), row_bytes);
        else
            memset(o, 0, row_bytes);
    }
    mixed_end(w, OP_EMBEDDING);
}

void mixed_embedding_backward(precision p, float *dwte, const void *dout, const int *tokens,
                              int N, int C, int vocab_start, int vocab_len) {
    if (p == PRECISION_FP32) {
        embedding_backward(dwte, dout, tokens, N, C, vocab_start, vocab_len);
        return;
    }
    const int w = mixed_begin(OP_EMBEDDING,
                              bytes_of(p, (double)N * C) + F32(2.0 * N * C));
    MIXED_ON_GPU(w, OP_EMBEDDING, embedding_backward, p, dwte, dout, tokens, N, C, vocab_start, vocab_len);
    const int rows = mixed_chunk_rows((size_t)C);
    float *g = workspace((size_t)rows * C);
    for (int n0 = 0; n0 < N; n0 += rows) {   /* rows in order, as the fp32 op adds them */
        const int nn = N - n0 < rows ? N - n0 : rows;
        widen(p, g, precision_at(p, dout, (size_t)n0 * C), (size_t)nn * C);
        cpu_embedding_backward(dwte, g, tokens + n0, nn, C, vocab_start, vocab_len);
    }
    mixed_end(w, OP_EMBEDDING);
}

void mixed_position_forward(precision p, void *out, const void *wpe, int B, int T, int C) {
    if (p == PRECISION_FP32) {
        position_forward(out, wpe, B, T, C);
        return;
    }
    const int w = mixed_begin(OP_EMBEDDING,
                              bytes_of(p, 3.0 * B * T * C));
    MIXED_ON_GPU(w, OP_EMBEDDING, position_forward, p, out, wpe, B, T, C);
    const size_t tc = (size_t)T * C;
    float *pos = workspace(2 * tc), *o = pos + tc;
    widen(p, pos, wpe, tc);
    for (int b = 0; b < B; b++) {   /* out += wpe: widened, added in fp32, rounded once */
        void *ob = precision_at(p, out, (size_t)b * tc);
        widen(p, o, ob, tc);
        cpu_position_forward(o, pos, 1, T, C);
        round_to(p, ob, o, tc);
    }
    mixed_end(w, OP_EMBEDDING);
}

void mixed_position_backward(precision p, float *dwpe, const void *dout, int B, int T,
                             int C) {
    if (p == PRECISION_FP32) {
        position_backward(dwpe, dout, B, T, C);
        return;
    }
    const int w = mixed_begin(OP_EMBEDDING,
                              bytes_of(p, (double)B * T * C) + F32(2.0 * T * C));
    MIXED_ON_GPU(w, OP_EMBEDDING, position_backward, p, dwpe, dout, B, T, C);
    const size_t n = (size_t)B * T * C;   /* sums over b: all rows at once */
    float *g = workspace(n);
    widen(p, g, dout, n);
    cpu_position_backward(dwpe, g, B, T, C);
    mixed_end(w, OP_EMBEDDING);
}

/* ---- linear: matmul16, 16-bit products summed in fp32 ----------------------------- */

/* fp8: a bf16 run whose linears take FP8-rounded inputs (fp8_linear.h) */
static void linear_forward_in(precision p, int fp8, void *out, const void *inp,
                              const void *weight, const void *bias, int N, int IC, int OC) {
    if (p == PRECISION_FP32) {
        linear_forward(out, inp, weight, bias, N, IC, OC);
        return;
    }
    const double elements = (double)N * IC + (double)N * OC + (double)OC * IC;
    const int w =
        mixed_begin(OP_LINEAR_FORWARD, bytes_of(p, elements));
    MIXED_ON_GPU(w, OP_LINEAR_FORWARD, linear_forward, p, out, inp, weight, bias, N, IC, OC);
    /* the product and the bias summed in fp32, rounded once, by the product itself */
    if (fp8 && p == PRECISION_BF16 && fp8_linear_active(NULL))
        fp8_linear_forward(out, inp, weight, bias, N, IC, OC);
    else if (N > 0 && OC > 0)
        product16_out16(p, 0, 1, N, OC, IC, inp, IC, weight, IC, bias, out, OC);
    mixed_end(w, OP_LINEAR_FORWARD);
}

void mixed_linear_forward(precision p, void *out, const void *inp, const void *weight,
                          const void *bias, int N, int IC, int OC) {
    linear_forward_in(p, 1, out, inp, weight, bias, N, IC, OC);
}

void mixed_head_forward(precision p, void *out, const void *inp, const void *weight,
                        const void *bias, int N, int IC, int OC) {
    linear_forward_in(p, 0, out, inp, weight, bias, N, IC, OC);
}

/* Columns summed at a time, as ops_cpu.c's add_column_sums: its double accumulators
 * stay in L1. */
#define DBIAS_COLUMNS 1024

/* dbias += column sums of dout: the fp32 op's own sums (add_column_sums in ops_cpu.c: a
 * double per column, rows in order, dbias += its float), each 16-bit value widened as it
 * is read. The same bits as widening all of dout first (test_ops_mixed checks them),
 * without that copy's write and re-read: it made this 2.6x fp32's time in bench256. */
static void linear_dbias(precision p, float *dbias, const void *dout, int N, int OC) {
    const uint16_t *g = dout;
    for (int c0 = 0; c0 < OC; c0 += DBIAS_COLUMNS) {
        const int w = OC - c0 < DBIAS_COLUMNS ? OC - c0 : DBIAS_COLUMNS;
        double acc[DBIAS_COLUMNS];
        for (int j = 0; j < w; j++) acc[j] = 0.0;
        for (int r = 0; r < N; r++) {
            const uint16_t *row = g + (size_t)r * OC + c0;
            if (p == PRECISION_BF16)
                for (int j = 0; j < w; j++) acc[j] += number_from_bf16(row[j]);
            else
                for (int j = 0; j < w; j++) acc[j] += number_from_f16(row[j]);
        }
        for (int j = 0; j < w; j++) dbias[c0 + j] += (float)acc[j];
    }
}

void mixed_linear_backward(precision p, void *dinp, float *dweight, float *dbias,
                           const void *dout, const void *inp, const void *weight, int N,
                           int IC, int OC) {
    if (p == PRECISION_FP32) {
        linear_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
        return;
    }
    const int w = mixed_begin(OP_LINEAR_BACKWARD,
                              bytes_of(p, 2.0 * N * OC + 2.0 * N * IC + (double)OC * IC) +
                                  F32(2.0 * OC * IC));
    MIXED_ON_GPU(w, OP_LINEAR_BACKWARD, linear_backward, p, dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
    if (N > 0 && p == PRECISION_BF16 && fp8_linear_backward_active()) {
        fp8_linear_backward(dinp, dweight, dout, inp, weight, N, IC, OC);   /* hybrid */
        if (dbias) linear_dbias(p, dbias, dout, N, OC);
    } else if (N > 0) {
        if (dinp)   /* dinp[N,IC] = dout[N,OC] @ weight[OC,IC], rounded once */
            product16_out16(p, 0, 0, N, IC, OC, dout, OC, weight, IC, NULL, dinp, IC);
        if (dweight)   /* dweight[OC,IC] += dout^T @ inp, straight into the fp32 gradient */
            product16(p, 1, 0, OC, IC, N, dout, OC, inp, IC, 1.0f, dweight, IC);
        if (dbias) linear_dbias(p, dbias, dout, N, OC);
    }
    mixed_end(w, OP_LINEAR_BACKWARD);
}

/* ---- attention: one batch element at a time ([B,T,...] layouts) ------------------ */

void mixed_attention_forward(precision p, void *out, void *att, const void *qkv, int B,
                             int T, int C, int NH) {
    if (p == PRECISION_FP32) {
        attention_forward(out, att, qkv, B, T, C, NH);
        return;
    }
    const int w = mixed_begin(OP_ATTENTION_FORWARD,
                              bytes_of(p, 4.0 * B * T * C + (double)B * NH * T * T));
    MIXED_ON_GPU(w, OP_ATTENTION_FORWARD, attention_forward, p, out, att, qkv, B, T, C, NH);
    const size_t n_qkv = (size_t)T * 3 * C, n_out = (size_t)T * C;
    const size_t n_att = (size_t)NH * T * T;
    float *q = workspace(n_qkv + n_out + n_att), *o = q + n_qkv, *a = o + n_out;
    for (int b = 0; b < B; b++) {
        widen(p, q, precision_at(p, qkv, b * n_qkv), n_qkv);
        cpu_attention_forward(o, a, q, 1, T, C, NH);
        round_to(p, precision_at(p, out, b * n_out), o, n_out);
        round_to(p, precision_at(p, att, b * n_att), a, n_att);
    }
    mixed_end(w, OP_ATTENTION_FORWARD);
}

/* datt, scratch in ops.h, is not written: the fp32 op's scratch is the workspace. */
void mixed_attention_backward(precision p, void *dqkv, void *datt, const void *dout,
                              const void *qkv, const void *att, int B, int T, int C,
                              int NH) {
    if (p == PRECISION_FP32) {
        attention_backward(dqkv, datt, dout, qkv, att, B, T, C, NH);
        return;
    }
    const int w = mixed_begin(OP_ATTENTION_BACKWARD,
                              bytes_of(p, 7.0 * B * T * C + (double)B * NH * T * T));
    MIXED_ON_GPU(w, OP_ATTENTION_BACKWARD, attention_backward, p, dqkv, datt, dout, qkv, att, B, T, C, NH);
    const size_t n_qkv = (size_t)T * 3 * C, n_out = (size_t)T * C;
    const size_t n_att = (size_t)NH * T * T;
    float *q = workspace(2 * n_qkv + n_out + 2 * n_att), *dq = q + n_qkv;
    float *dy = dq + n_qkv, *a = dy + n_out, *da = a + n_att;
    for (int b = 0; b < B; b++) {
        widen(p, q, precision_at(p, qkv, b * n_qkv), n_qkv);
        widen(p, dy, precision_at(p, dout, b * n_out), n_out);
        widen(p, a, precision_at(p, att, b * n_att), n_att);
        cpu_attention_backward(dq, da, dy, q, a, 1, T, C, NH);
        round_to(p, precision_at(p, dqkv, b * n_qkv), dq, n_qkv);
    }
    mixed_end(w, OP_ATTENTION_BACKWARD);
}

/* ---- GELU -------------------------------------------------------------------------- */

void mixed_gelu_forward(precision p, void *out, void *x, size_t n) {
    if (p == PRECISION_FP32) {
        gelu_forward(out, x, n);
        return;
    }
    const int w = mixed_begin(OP_GELU, bytes_of(p, 3.0 * n));
    MIXED_ON_GPU(w, OP_GELU, gelu_forward, p, out, x, n);
    float *xs = workspace(2 * CHUNK_FLOATS), *ys = xs + CHUNK_FLOATS;
    for (size_t i = 0; i < n; i += CHUNK_FLOATS) {
        const size_t len = n - i < CHUNK_FLOATS ? n - i : CHUNK_FLOATS;
        void *xi = precision_at(p, x, i);
        widen(p, xs, xi, len);
        cpu_gelu_forward(ys, xs, len);
        round_to(p, precision_at(p, out, i), ys, len);
        round_to(p, xi, xs, len);   /* x becomes gelu'(x), as in fp32 */
    }
    mixed_end(w, OP_GELU);
}

void mixed_gelu_backward(precision p, void *dinp, const void *dgelu, const void *dout,
                         size_t n) {
    if (p == PRECISION_FP32) {
        gelu_backward(dinp, dgelu, dout, n);
        return;
    }
    const int w = mixed_begin(OP_GELU, bytes_of(p, 3.0 * n));
    MIXED_ON_GPU(w, OP_GELU, gelu_backward, p, dinp, dgelu, dout, n);
    if (p == PRECISION_BF16) {   /* cpu_gelu_backward's products, widened as read */
        const uint16_t *dg = dgelu, *dy = dout;
        uint16_t *dx = dinp;
        for (size_t i = 0; i < n; i++)
            dx[i] = number_to_bf16(number_from_bf16(dg[i]) * number_from_bf16(dy[i]));
        mixed_end(w, OP_GELU);
        return;
    }
    float *dg = workspace(2 * CHUNK_FLOATS), *dy = dg + CHUNK_FLOATS;
    /* dinp may be dout: each chunk is read, then written */
    for (size_t i = 0; i < n; i += CHUNK_FLOATS) {
        const size_t len = n - i < CHUNK_FLOATS ? n - i : CHUNK_FLOATS;
        widen(p, dg, precision_at(p, dgelu, i), len);
        widen(p, dy, precision_at(p, dout, i), len);
        cpu_gelu_backward(dy, dg, dy, len);
        round_to(p, precision_at(p, dinp, i), dy, len);
    }
    mixed_end(w, OP_GELU);
}

/* ---- cross-entropy ------------------------------------------------------------------ */

void mixed_crossentropy_forward(precision p, float *losses, void *probs, const void *logits,
                                const int *targets, int N, int V) {
    if (p == PRECISION_FP32) {
        crossentropy_forward(losses, probs, logits, targets, N, V);
        return;
    }
    const int w = mixed_begin(OP_CROSSENTROPY,
                              bytes_of(p, 2.0 * N * V) + F32(N));
    MIXED_ON_GPU(w, OP_CROSSENTROPY, crossentropy_forward, p, losses, probs, logits, targets, N, V);
    const int rows = mixed_chunk_rows((size_t)V);
    float *x = workspace((size_t)rows * V);
    for (int n0 = 0; n0 < N; n0 += rows) {   /* probs may be logits: read, then written */
        const int nn = N - n0 < rows ? N - n0 : rows;
        const size_t at = (size_t)n0 * V, len = (size_t)nn * V;
        widen(p, x, precision_at(p, logits, at), len);
        cpu_crossentropy_forward(losses + n0, x, x, targets + n0, nn, V);   /* in place */
        round_to(p, precision_at(p, probs, at), x, len);
    }
    mixed_end(w, OP_CROSSENTROPY);
}

void mixed_crossentropy_backward(precision p, void *dlogits, const void *probs,
                                 const int *targets, float dloss, int N, int V) {
    if (p == PRECISION_FP32) {
        crossentropy_backward(dlogits, probs, targets, dloss, N, V);
        return;
    }
    const int w = mixed_begin(OP_CROSSENTROPY,
                              bytes_of(p, 2.0 * N * V));
    MIXED_ON_GPU(w, OP_CROSSENTROPY, crossentropy_backward, p, dlogits, probs, targets, dloss, N, V);
    const int rows = mixed_chunk_rows((size_t)V);
    float *x = workspace((size_t)rows * V);
    for (int n0 = 0; n0 < N; n0 += rows) {   /* dlogits may be probs */
        const int nn = N - n0 < rows ? N - n0 : rows;
        const size_t at = (size_t)n0 * V, len = (size_t)nn * V;
        widen(p, x, precision_at(p, probs, at), len);
        cpu_crossentropy_backward(x, x, targets + n0, dloss, nn, V);
        round_to(p, precision_at(p, dlogits, at), x, len);
    }
    mixed_end(w, OP_CROSSENTROPY);
}

/* ---- vectors --------------------------------------------------------------------- */

void mixed_vec_zero(precision p, void *x, size_t n) {
    if (p == PRECISION_FP32) {
        vec_zero(x, n);
        return;
    }
    const int w = mixed_begin(OP_VECTOR, bytes_of(p, n));
    MIXED_ON_GPU(w, OP_VECTOR, vec_zero, p, x, n);
    memset(x, 0, n * precision_bytes(p));   /* +0 in both 16-bit formats */
    mixed_end(w, OP_VECTOR);
}

void mixed_vec_copy(precision p, void *dst, const void *src, size_t n) {
    if (p == PRECISION_FP32) {
        vec_copy(dst, src, n);
        return;
    }
    const int w = mixed_begin(OP_VECTOR, bytes_of(p, 2.0 * n));
    MIXED_ON_GPU(w, OP_VECTOR, vec_copy, p, dst, src, n);
    if (dst != src) memmove(dst, src, n * precision_bytes(p));
    mixed_end(w, OP_VECTOR);
}

/* bf16's y += x in one pass: each element widened, added in fp32 and rounded, the bits
 * of widen + cpu_vec_add + round without their passes over scratch (those cost 2x
 * fp32's residual add in bench256; this loop, which gcc vectorises, 0.6x of them).
 * fp16's conversions do not vectorise as well: fused, its loop was no faster. */
static void add_bf16(uint16_t *y, const uint16_t *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        y[i] = number_to_bf16(number_from_bf16(y[i]) + number_from_bf16(x[i]));
}

void mixed_vec_add(precision p, void *y, const void *x, size_t n) {
    if (p == PRECISION_FP32) {
        vec_add(y, x, n);
        return;
    }
    const int w = mixed_begin(OP_RESIDUAL, bytes_of(p, 3.0 * n));
    MIXED_ON_GPU(w, OP_RESIDUAL, vec_add, p, y, x, n);
    if (p == PRECISION_BF16) {
        add_bf16(y, x, n);
        mixed_end(w, OP_RESIDUAL);
        return;
    }
    float *ys = workspace(2 * CHUNK_FLOATS), *xs = ys + CHUNK_FLOATS;
    for (size_t i = 0; i < n; i += CHUNK_FLOATS) {
        const size_t len = n - i < CHUNK_FLOATS ? n - i : CHUNK_FLOATS;
        void *yi = precision_at(p, y, i);
        widen(p, ys, yi, len);
        widen(p, xs, precision_at(p, x, i), len);
        cpu_vec_add(ys, xs, len);
        round_to(p, yi, ys, len);
    }
    mixed_end(w, OP_RESIDUAL);
}
