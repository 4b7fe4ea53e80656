/* 16-bit matmuls through oneDNN (matmul16.h): a table of primitives per thread, each
 * created once per (precision, transposes, shape, leading dimensions, beta).
 *
 * oneDNN 2.x C API: a matmul descriptor over three strided 2-D memory descriptors
 * (transposes are strides, no copies), a primitive descriptor (oneDNN picks the fastest
 * implementation this CPU has, e.g. brgemm on AVX512_BF16), a primitive. Creating one
 * costs far more than running it (it JIT-compiles its kernels), hence the table. Its
 * scratchpad is ours ("user" mode): one buffer per thread, sized by the largest
 * primitive, so that a run never allocates inside oneDNN. */
#include "matmul16.h"

#include "dnnl_util.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A model step has a few dozen distinct shapes (4 linears x forward, dinp, dweight, the
 * head, the attention's blocks); more than that and the least recently used goes. */
#define MM_SLOTS 64
#define MM_IMPL_LEN 128

typedef struct {
    int used;
    precision p;
    int trans_a, trans_b, M, N, K, lda, ldb, ldc, accumulate;
    int out16, has_bias;   /* matmul16_out16: C of p, and a bias row of p */
    unsigned long last_use;
    int fallback;   /* no oneDNN 16-bit implementation here: widen, fp32 matmul */
    int wide;       /* the fallback's fp32 product itself, on the widened copies */
    int call_rows;  /* the fallback: rows of C per fp32 product (M, or MM_CALL_ROWS) */
    int blas;       /* the fallback's calls through OpenBLAS's sgemm (mm_blas_calls) */
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c, scratch, bias;   /* handles set at each call */
    char impl[MM_IMPL_LEN];
} mm_slot;

typedef struct {
    dnnl_util_thread base;   /* engine and stream (first: dnnl_util.h's tables) */
    mm_slot slots[MM_SLOTS];
    unsigned long clock;
    unsigned long creations;
    void *scratch;   /* the primitives' scratchpad, shared: one runs at a time */
    size_t scratch_bytes;
    float *wide;     /* the fallback's fp32 copies of A and B */
    size_t wide_floats;
    char impl_copy[MM_IMPL_LEN];
} mm_thread;


#define MM_CHECK(call) DNNL_CHECK("matmul16", call)

static void mm_slot_clear(mm_slot *s) {
    if (s->prim) dnnl_primitive_destroy(s->prim);
    dnnl_memory_t mems[5] = {s->a, s->b, s->c, s->scratch, s->bias};
    dnnl_util_destroy_memories(mems, 5);
    memset(s, 0, sizeof *s);
}

/* What the thread's table holds beyond its engine and stream (dnnl_util_tls). */
static void mm_thread_clear(void *arg) {
    mm_thread *t = arg;
    for (int i = 0; i < MM_SLOTS; i++) mm_slot_clear(&t->slots[i]);
    free(t->scratch);
    free(t->wide);
}

static dnnl_util_tls mm_tls = DNNL_UTIL_TLS("matmul16", mm_thread, mm_thread_clear);

/* The calling thread's table, made on its first call. */
static mm_thread *mm_thread_get(void) { return dnnl_util_tls_get(&mm_tls); }

void matmul16_release_thread(void) { dnnl_util_tls_release(&mm_tls); }

/* Grows *buf to at least bytes (64-byte aligned); only when a new shape needs more. */
static void mm_grow(void **buf, size_t *have, size_t bytes) {
    dnnl_util_grow("matmul16", buf, have, bytes);
}

/* The operands' layouts in oneDNN's terms: the caller's 16-bit A, B (and C with out16),
 * or, for the fallback, the packed fp32 copies it widens them into. */
typedef struct {
    dnnl_data_type_t in, out;
    int lda, ldb, ldc;
    int accumulate, bias;   /* the sum post-op; a 16-bit bias argument */
} mm_layout;

static mm_layout mm_layout_16(const mm_slot *s) {
    const dnnl_data_type_t dt = s->p == PRECISION_BF16 ? dnnl_bf16 : dnnl_f16;
    return (mm_layout){dt, s->out16 ? dt : dnnl_f32, s->lda, s->ldb, s->ldc,
                       s->accumulate, s->has_bias};
}

/* A wide slot's layout: fp32, its key's leading dimensions (the widened copies') */
static mm_layout mm_layout_wide(const mm_slot *s) {
    return (mm_layout){dnnl_f32, dnnl_f32, s->lda, s->ldb, s->ldc, s->accumulate, 0};
}

/* The primitive descriptor of slot s's product in layout l: NULL when oneDNN has no
 * implementation of that data type here (it says dnnl_unimplemented). */
static dnnl_primitive_desc_t mm_describe(mm_thread *t, const mm_slot *s, mm_layout l) {
    dnnl_memory_desc_t a = dnnl_util_strided(l.in, s->M, s->K, l.lda, s->trans_a);
    dnnl_memory_desc_t b = dnnl_util_strided(l.in, s->K, s->N, l.ldb, s->trans_b);
    dnnl_memory_desc_t c = dnnl_util_strided(l.out, s->M, s->N, l.ldc, 0);
    dnnl_memory_desc_t bias = dnnl_util_strided(l.in, 1, s->N, s->N, 0);
    dnnl_matmul_desc_t desc;
    MM_CHECK(dnnl_matmul_desc_init(&desc, &a, &b, l.bias ? &bias : NULL, &c));
    dnnl_primitive_attr_t attr = dnnl_util_matmul_attr("matmul16", l.accumulate);
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t st = dnnl_primitive_desc_create(&pd, &desc, attr, t->base.engine, NULL);
    dnnl_primitive_attr_destroy(attr);
    if (st == dnnl_unimplemented) return NULL;
    if (st != dnnl_success) dnnl_util_die("matmul16", "dnnl_primitive_desc_create (matmul)", st);
    return pd;
}

static mm_slot *mm_lookup(mm_thread *t, const mm_slot *key);

/* The fallback's fp32 product of `rows` rows of C (from row 0 of a chunk): A and B
 * widened and packed as stored (rows of a_cols, b_cols), C in place, or in packed
 * scratch with out16, where a bias is put first and summed onto. */
static mm_slot mm_wide_key(const mm_slot *s, int rows) {
    return (mm_slot){.p = s->p, .trans_a = s->trans_a, .trans_b = s->trans_b, .M = rows,
                     .N = s->N, .K = s->K, .lda = s->trans_a ? s->M : s->K,
                     .ldb = s->trans_b ? s->K : s->N, .ldc = s->out16 ? s->N : s->ldc,
                     .accumulate = s->accumulate || s->has_bias, .wide = 1};
}

/* Rows of C per fp32 product. oneDNN's brgemm (AVX-512) sums a row of C the same way in
 * any call of 16 rows or more: one call. Its AVX2 sgemm (gemm:jit, all it has for fp32
 * on a CPU without AVX-512) sums a row by where it falls in the call (measured: rows of a
 * 64-row call differ from the same rows in a 128-row call, in either orientation), so
 * it gets calls of MM_CALL_ROWS rows: a rank's or a micro-batch's rows, a multiple of 16
 * at a multiple of 16, then run the very calls the whole batch's rows run. */
#define MM_CALL_ROWS 16
static int mm_in_calls_of_rows(mm_thread *t, const mm_slot *s) {
    const mm_slot key = mm_wide_key(s, s->M);
    return strncmp(mm_lookup(t, &key)->impl, "gemm:", 5) == 0;
}

/* Where the products run in 16-row calls, those with A transposed (the weight gradients,
 * dW += dY^T X) run them through OpenBLAS's sgemm: each call repacks all of B, and at 16
 * rows OpenBLAS did that 1.1-2.2x faster than oneDNN's gemm:jit on bench256's weight
 * gradients (fc-proj's 48 against 22 GFLOP/s); with B transposed or plain, oneDNN was
 * the faster one. A call of 16 rows is the same computation wherever its rows lie, in
 * either library, so every row keeps the bits it has in the whole batch's calls. */
static int mm_blas_calls(const mm_slot *s) { return s->trans_a; }

/* The fallback's name: its fp32 kernel (OpenBLAS's sgemm, or the oneDNN kernel of its
 * wide slot), and why it runs. */
static void mm_fallback_name(mm_thread *t, mm_slot *s) {
    const char *type = precision_name(s->p), *impl = "sgemm";
    if (!s->blas) {
        const mm_slot key = mm_wide_key(s, s->call_rows);
        impl = mm_lookup(t, &key)->impl;
    }
    snprintf(s->impl, sizeof s->impl, "%s%.64s%s (fp32 from %s: no oneDNN %s matmul here)",
             s->blas ? "OpenBLAS " : "oneDNN ", impl,
             s->call_rows < s->M ? ", 16 rows a call" : "", type, type);
}

/* Creates slot s's primitive, its memory objects and its share of the scratchpad: in
 * 16 bits, or in fp32 for a wide slot. A 16-bit product oneDNN cannot do here becomes a
 * fallback slot, which runs wide slots (mm_run_fallback) and has no primitive itself. */
static void mm_create(mm_thread *t, mm_slot *s) {
    dnnl_primitive_desc_t pd =
        mm_describe(t, s, s->wide ? mm_layout_wide(s) : mm_layout_16(s));
    if (!pd && s->wide)
        dnnl_util_die("matmul16", "dnnl_primitive_desc_create (fp32 matmul)", dnnl_unimplemented);
    if (!pd) {
        s->fallback = 1;
        const int in_calls = mm_in_calls_of_rows(t, s);
        s->call_rows = in_calls && s->M > MM_CALL_ROWS ? MM_CALL_ROWS : s->M;
        s->blas = in_calls && mm_blas_calls(s);
        mm_fallback_name(t, s);
        return;
    }
    const char *impl = NULL;
    MM_CHECK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl));
    /* a 16-bit product is named with its library; a wide slot by oneDNN's name alone,
     * which mm_in_calls_of_rows reads */
    snprintf(s->impl, sizeof s->impl, "%s%s", s->wide ? "" : "oneDNN ", impl ? impl : "?");
    dnnl_memory_t *mems[4] = {&s->a, &s->b, &s->c, &s->scratch};
    dnnl_util_matmul_memories(pd, t->base.engine, mems);
    if (s->has_bias)   /* the bias is the second "weights" of a matmul */
        MM_CHECK(dnnl_memory_create(&s->bias,
                                    dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 1),
                                    t->base.engine, DNNL_MEMORY_NONE));
    const dnnl_memory_desc_t *scratch_md =
        dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    mm_grow(&t->scratch, &t->scratch_bytes, dnnl_memory_desc_get_size(scratch_md));
    MM_CHECK(dnnl_primitive_create(&s->prim, pd));
    dnnl_primitive_desc_destroy(pd);
}

/* The slot for this product: found, or made in the least recently used one. */
static mm_slot *mm_lookup(mm_thread *t, const mm_slot *key) {
    mm_slot *victim = &t->slots[0];
    for (int i = 0; i < MM_SLOTS; i++) {
        mm_slot *s = &t->slots[i];
        if (s->used && s->p == key->p && s->trans_a == key->trans_a &&
            s->trans_b == key->trans_b && s->M == key->M && s->N == key->N &&
            s->K == key->K && s->lda == key->lda && s->ldb == key->ldb &&
            s->ldc == key->ldc && s->accumulate == key->accumulate &&
            s->out16 == key->out16 && s->has_bias == key->has_bias && s->wide == key->wide) {
            s->last_use = ++t->clock;
            return s;
        }
        if (!s->used || (victim->used && s->last_use < victim->last_use)) victim = s;
    }
    mm_slot_clear(victim);
    *victim = *key;
    victim->used = 1;
    victim->last_use = ++t->clock;
    t->creations++;
    mm_create(t, victim);
    return victim;
}

/* rows x cols of src (leading dimension ld) widened into dst, packed (ld = cols). */
static void mm_widen(float *dst, precision p, const uint16_t *src, int rows, int cols,
                     int ld) {
    for (int r = 0; r < rows; r++)
        precision_from16(p, dst + (size_t)r * cols, src + (size_t)r * ld, (size_t)cols);
}

/* Runs slot s's primitive on these buffers (bias: NULL, or a 16-bit bias argument). */
static void mm_execute(mm_thread *t, const mm_slot *s, const void *A, const void *B,
                       const uint16_t *bias, void *C) {
    MM_CHECK(dnnl_memory_set_data_handle(s->a, (void *)A));
    MM_CHECK(dnnl_memory_set_data_handle(s->b, (void *)B));
    MM_CHECK(dnnl_memory_set_data_handle(s->c, C));
    MM_CHECK(dnnl_memory_set_data_handle(s->scratch, t->scratch));
    dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, s->a},
                               {DNNL_ARG_WEIGHTS, s->b},
                               {DNNL_ARG_DST, s->c},
                               {DNNL_ARG_SCRATCHPAD, s->scratch},
                               {DNNL_ARG_BIAS, s->bias}};
    if (bias) MM_CHECK(dnnl_memory_set_data_handle(s->bias, (void *)bias));
    MM_CHECK(dnnl_primitive_execute(s->prim, t->base.stream, bias ? 5 : 4, args));
    MM_CHECK(dnnl_stream_wait(t->base.stream));
}

/* One fp32 product of the fallback: `rows` rows of C from a (op(A)'s first of them)
 * into c, on oneDNN's wide slot or, for mm_blas_calls' products, OpenBLAS. */
static void mm_fallback_call(mm_thread *t, const mm_slot *s, int rows, const float *a,
                             const float *wb, float *c) {
    const mm_slot key = mm_wide_key(s, rows);
    if (!s->blas) {
        mm_execute(t, mm_lookup(t, &key), a, wb, NULL, c);
        return;
    }
    cblas_sgemm(CblasRowMajor, s->trans_a ? CblasTrans : CblasNoTrans,
                s->trans_b ? CblasTrans : CblasNoTrans, rows, s->N, s->K, 1.0f, a, key.lda,
                wb, key.ldb, key.accumulate ? 1.0f : 0.0f, c, key.ldc);
}

/* The fallback: A and B widened, an fp32 product of call_rows rows of C a call. One
 * whole call only where oneDNN's fp32 kernel sums a row the same in any call (brgemm):
 * OpenBLAS sums a row of C by where the row falls in the call's blocking (its AVX2
 * kernels: rows 0-63 of a 128-row call differ from a call of those 64; its AVX-512 ones
 * below 16 rows), and so does oneDNN's gemm:jit, so a rank's rows would differ from the
 * whole batch's in a last fp32 bit, which rounding to fp16 turns into a whole fp16 step.
 * With a 16-bit C the product goes to fp32 scratch first (started from the bias rows
 * when there is one) and is rounded once. s is copied: a wide slot's lookup may reuse
 * the table entry it sits in. */
static void mm_run_fallback(mm_thread *t, const mm_slot *slot, const uint16_t *A,
                            const uint16_t *B, const uint16_t *bias, void *C) {
    const mm_slot s = *slot;
    const int a_rows = s.trans_a ? s.K : s.M, a_cols = s.trans_a ? s.M : s.K;
    const int b_rows = s.trans_b ? s.N : s.K, b_cols = s.trans_b ? s.K : s.N;
    const size_t a_n = (size_t)a_rows * a_cols, b_n = (size_t)b_rows * b_cols;
    const size_t c_n = s.out16 ? (size_t)s.M * s.N : 0;
    size_t have = t->wide_floats * sizeof(float);
    mm_grow((void **)&t->wide, &have, (a_n + b_n + c_n) * sizeof(float));
    t->wide_floats = have / sizeof(float);
    float *wa = t->wide, *wb = t->wide + a_n, *wc = s.out16 ? t->wide + a_n + b_n : C;
    const int ldc = s.out16 ? s.N : s.ldc;
    mm_widen(wa, s.p, A, a_rows, a_cols, s.lda);
    mm_widen(wb, s.p, B, b_rows, b_cols, s.ldb);
    if (bias)
        for (int r = 0; r < s.M; r++) precision_from16(s.p, wc + (size_t)r * ldc, bias, s.N);
    for (int r0 = 0; r0 < s.M; r0 += s.call_rows) {
        const int rows = s.M - r0 < s.call_rows ? s.M - r0 : s.call_rows;
        /* rows r0.. of op(A): A's rows, or with trans_a its columns */
        const float *a = wa + (s.trans_a ? (size_t)r0 : (size_t)r0 * s.K);
        mm_fallback_call(t, &s, rows, a, wb, wc + (size_t)r0 * ldc);
    }
    if (s.out16)
        for (int r = 0; r < s.M; r++)
            precision_to16(s.p, (uint16_t *)C + (size_t)r * s.ldc, wc + (size_t)r * ldc, s.N);
}

static void mm_run(mm_thread *t, const mm_slot *s, const uint16_t *A, const uint16_t *B,
                   const uint16_t *bias, void *C) {
    if (s->fallback) mm_run_fallback(t, s, A, B, bias, C);
    else mm_execute(t, s, A, B, bias, C);
}

static mm_slot mm_key_of(precision p, int trans_a, int trans_b, int M, int N, int K,
                         int lda, int ldb, float beta, int ldc) {
    if (p != PRECISION_BF16 && p != PRECISION_FP16) {
        fprintf(stderr, "matmul16: precision %s is not a 16-bit format\n",
                precision_name(p));
        exit(1);
    }
    if (beta != 0.0f && beta != 1.0f) {
        fprintf(stderr, "matmul16: beta %g (only 0 or 1)\n", (double)beta);
        exit(1);
    }
    mm_slot key = {.p = p, .trans_a = !!trans_a, .trans_b = !!trans_b, .M = M, .N = N,
                   .K = K, .lda = lda, .ldb = ldb, .ldc = ldc, .accumulate = beta != 0.0f};
    return key;
}

void matmul16(precision p, int trans_a, int trans_b, int M, int N, int K,
              const uint16_t *A, int lda, const uint16_t *B, int ldb, float beta, float *C,
              int ldc) {
    mm_slot key = mm_key_of(p, trans_a, trans_b, M, N, K, lda, ldb, beta, ldc);
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {   /* an empty sum: C = 0, or C unchanged */
        for (int i = 0; i < M && !key.accumulate; i++)
            memset(C + (size_t)i * ldc, 0, (size_t)N * sizeof(float));
        return;
    }
    mm_thread *t = mm_thread_get();
    mm_run(t, mm_lookup(t, &key), A, B, NULL, C);
}

void matmul16_out16(precision p, int trans_a, int trans_b, int M, int N, int K,
                    const uint16_t *A, int lda, const uint16_t *B, int ldb,
                    const uint16_t *bias, uint16_t *C, int ldc) {
    mm_slot key = mm_key_of(p, trans_a, trans_b, M, N, K, lda, ldb, 0.0f, ldc);
    key.out16 = 1;
    key.has_bias = bias != NULL;
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {   /* an empty sum: the bias alone, or 0 */
        for (int i = 0; i < M; i++) {
            uint16_t *row = C + (size_t)i * ldc;
            if (bias) memcpy(row, bias, (size_t)N * sizeof *row);
            else memset(row, 0, (size_t)N * sizeof *row);
        }
        return;
    }
    mm_thread *t = mm_thread_get();
    mm_run(t, mm_lookup(t, &key), A, B, bias, C);
}

const char *matmul16_impl(precision p, int trans_a, int trans_b, int M, int N, int K) {
    int lda = trans_a ? M : K, ldb = trans_b ? K : N;
    mm_slot key = mm_key_of(p, trans_a, trans_b, M, N, K, lda, ldb, 0.0f, N);
    if (M <= 0 || N <= 0 || K <= 0) return "none (empty product)";
    mm_thread *t = mm_thread_get();
    const mm_slot *s = mm_lookup(t, &key);
    snprintf(t->impl_copy, sizeof t->impl_copy, "%s", s->impl);
    return t->impl_copy;
}

int matmul16_widens(precision p) {
    const mm_slot key = mm_key_of(p, 0, 1, 8, 8, 8, 8, 8, 0.0f, 8);
    mm_thread *t = mm_thread_get();
    return mm_lookup(t, &key)->fallback;
}

unsigned long matmul16_creations(void) {
    const mm_thread *t = dnnl_util_tls_peek(&mm_tls);
    return t ? t->creations : 0;
}
