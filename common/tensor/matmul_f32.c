/* fp32 matmuls through oneDNN (matmul_f32.h): per thread, a table of primitives, one per
 * (transposes, shape, leading dimensions, beta, weight), and a table of weight layouts,
 * one per (weight pointer, its descriptor in oneDNN's chosen layout).
 *
 * oneDNN 2.x C API, as matmul16.c: strided 2-D descriptors (a transpose is a stride),
 * except a weight's, which is format_tag any: oneDNN names the layout its kernel reads
 * fastest (blocked for brgemm on AVX-512; on AVX2 its gemm:jit takes a plain one), and
 * a reorder primitive writes the weight into it. The scratchpad is ours ("user" mode,
 * one buffer per thread), so a run allocates nothing. */
#include "matmul_f32.h"

#include "dnnl_util.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A step has a few dozen distinct products (4 linears x forward and dinp and dweight,
 * the head); beyond that the least recently used goes. A layout per weight: 4 L + 1. */
#define MF_SLOTS 64
#define MF_PACKS 64
#define MF_IMPL_LEN 96
/* A layout also keeps a few of its source's elements and is re-made when one differs: a
 * guard for weights written in place by a path that did not call
 * matmul_weights_changed (it catches a whole new weight, not a single element). */
#define MF_SAMPLES 8

typedef struct {
    int used, trans_a, trans_b, M, N, K, lda, ldb, ldc, accumulate, weight;
    unsigned long last_use;
    int packed;   /* B is read from a weight layout (oneDNN's differs from the caller's) */
    dnnl_memory_desc_t b_user, b_packed;
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c, scratch;
    char impl[MF_IMPL_LEN];
} mf_slot;

/* A weight in oneDNN's layout, made from `src` at generation `generation`. */
typedef struct {
    int used;
    const float *src;
    dnnl_memory_desc_t user, packed;
    unsigned long generation, last_use;
    float sample[MF_SAMPLES];   /* a few of the source's elements when it was made */
    dnnl_primitive_t reorder;
    dnnl_memory_t from, to;
    void *buf;
    size_t bytes;
} mf_pack;

typedef struct {
    dnnl_util_thread base;   /* engine and stream (first: dnnl_util.h's tables) */
    mf_slot slots[MF_SLOTS];
    mf_pack packs[MF_PACKS];
    unsigned long clock, creations, reorders;
    void *scratch;
    size_t scratch_bytes;
    char impl_copy[MF_IMPL_LEN];
} mf_thread;

/* Bumped whenever weights may have changed; a layout made at an older one is stale. */
static _Atomic unsigned long weights_generation = 1;


#define MF_CHECK(call) DNNL_CHECK("matmul_f32", call)

static void mf_slot_clear(mf_slot *s) {
    if (s->prim) dnnl_primitive_destroy(s->prim);
    dnnl_memory_t mems[4] = {s->a, s->b, s->c, s->scratch};
    dnnl_util_destroy_memories(mems, 4);
    memset(s, 0, sizeof *s);
}

/* Forgets a layout's source and primitive; its buffer is kept for the next weight. */
static void mf_pack_forget(mf_pack *p) {
    if (p->reorder) dnnl_primitive_destroy(p->reorder);
    dnnl_memory_t mems[2] = {p->from, p->to};
    dnnl_util_destroy_memories(mems, 2);
    void *buf = p->buf;
    size_t bytes = p->bytes;
    memset(p, 0, sizeof *p);
    p->buf = buf;
    p->bytes = bytes;
}

/* What the thread's table holds beyond its engine and stream (dnnl_util_tls). */
static void mf_thread_clear(void *arg) {
    mf_thread *t = arg;
    for (int i = 0; i < MF_SLOTS; i++) mf_slot_clear(&t->slots[i]);
    for (int i = 0; i < MF_PACKS; i++) {
        mf_pack_forget(&t->packs[i]);
        free(t->packs[i].buf);
    }
    free(t->scratch);
}

static dnnl_util_tls mf_tls = DNNL_UTIL_TLS("matmul_f32", mf_thread, mf_thread_clear);

/* The calling thread's table, made on its first call. */
static mf_thread *mf_thread_get(void) { return dnnl_util_tls_get(&mf_tls); }

void matmul_f32_release_thread(void) { dnnl_util_tls_release(&mf_tls); }

void matmul_weights_changed(void) { atomic_fetch_add(&weights_generation, 1); }

static void mf_grow(void **buf, size_t *have, size_t bytes) {
    dnnl_util_grow("matmul_f32", buf, have, bytes);
}

static dnnl_memory_desc_t mf_desc(int rows, int cols, int ld, int transposed) {
    return dnnl_util_strided(dnnl_f32, rows, cols, ld, transposed);
}

/* Slot s's primitive descriptor: B in the "any" layout when it is a weight. */
static dnnl_primitive_desc_t mf_describe(mf_thread *t, mf_slot *s) {
    dnnl_memory_desc_t a = mf_desc(s->M, s->K, s->lda, s->trans_a);
    dnnl_memory_desc_t c = mf_desc(s->M, s->N, s->ldc, 0);
    s->b_user = mf_desc(s->K, s->N, s->ldb, s->trans_b);
    dnnl_memory_desc_t b = s->b_user;
    if (s->weight) {
        dnnl_dims_t dims = {s->K, s->N};
        MF_CHECK(dnnl_memory_desc_init_by_tag(&b, 2, dims, dnnl_f32, dnnl_format_tag_any));
    }
    dnnl_matmul_desc_t desc;
    MF_CHECK(dnnl_matmul_desc_init(&desc, &a, &b, NULL, &c));
    dnnl_primitive_attr_t attr = dnnl_util_matmul_attr("matmul_f32", s->accumulate);
    dnnl_primitive_desc_t pd = NULL;
    MF_CHECK(dnnl_primitive_desc_create(&pd, &desc, attr, t->base.engine, NULL));
    dnnl_primitive_attr_destroy(attr);
    return pd;
}

static void mf_create(mf_thread *t, mf_slot *s) {
    dnnl_primitive_desc_t pd = mf_describe(t, s);
    const char *impl = NULL;
    MF_CHECK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl));
    snprintf(s->impl, sizeof s->impl, "%s", impl ? impl : "?");
    dnnl_memory_t *mems[4] = {&s->a, &s->b, &s->c, &s->scratch};
    dnnl_util_matmul_memories(pd, t->base.engine, mems);
    s->b_packed = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    s->packed = s->weight && !dnnl_memory_desc_equal(&s->b_packed, &s->b_user);
    const dnnl_memory_desc_t *scratch_md =
        dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    mf_grow(&t->scratch, &t->scratch_bytes, dnnl_memory_desc_get_size(scratch_md));
    MF_CHECK(dnnl_primitive_create(&s->prim, pd));
    dnnl_primitive_desc_destroy(pd);
}

static int mf_same_key(const mf_slot *s, const mf_slot *k) {
    return s->trans_a == k->trans_a && s->trans_b == k->trans_b && s->M == k->M &&
           s->N == k->N && s->K == k->K && s->lda == k->lda && s->ldb == k->ldb &&
           s->ldc == k->ldc && s->accumulate == k->accumulate && s->weight == k->weight;
}

/* The slot for this product: found, or made in the least recently used one. */
static mf_slot *mf_lookup(mf_thread *t, const mf_slot *key) {
    mf_slot *victim = &t->slots[0];
    for (int i = 0; i < MF_SLOTS; i++) {
        mf_slot *s = &t->slots[i];
        if (s->used && mf_same_key(s, key)) {
            s->last_use = ++t->clock;
            return s;
        }
        if (!s->used || (victim->used && s->last_use < victim->last_use)) victim = s;
    }
    mf_slot_clear(victim);
    *victim = *key;
    victim->used = 1;
    victim->last_use = ++t->clock;
    t->creations++;
    mf_create(t, victim);
    return victim;
}

/* A layout slot for weight B as slot s reads it: its reorder made (and its buffer
 * grown) when the slot is taken for a new weight or descriptor. */
static void mf_pack_setup(mf_thread *t, mf_pack *p, const mf_slot *s, const float *B) {
    mf_pack_forget(p);
    p->used = 1;
    p->src = B;
    p->user = s->b_user;
    p->packed = s->b_packed;
    mf_grow(&p->buf, &p->bytes, dnnl_memory_desc_get_size(&p->packed));
    MF_CHECK(dnnl_memory_create(&p->from, &p->user, t->base.engine, DNNL_MEMORY_NONE));
    MF_CHECK(dnnl_memory_create(&p->to, &p->packed, t->base.engine, p->buf));
    dnnl_primitive_desc_t rpd;
    MF_CHECK(dnnl_reorder_primitive_desc_create(&rpd, &p->user, t->base.engine, &p->packed,
                                                t->base.engine, NULL));
    MF_CHECK(dnnl_primitive_create(&p->reorder, rpd));
    dnnl_primitive_desc_destroy(rpd);
    t->creations++;
}

/* Element i of MF_SAMPLES spread over the K x N weight as it is stored. */
static float mf_sample(const mf_slot *s, const float *B, int i) {
    const long rows = s->trans_b ? s->N : s->K, cols = s->trans_b ? s->K : s->N;
    const long at = (rows * cols - 1) * i / (MF_SAMPLES - 1);
    return B[(at / cols) * s->ldb + at % cols];
}

static int mf_sample_changed(const mf_pack *p, const mf_slot *s, const float *B) {
    for (int i = 0; i < MF_SAMPLES; i++)
        if (memcmp(&p->sample[i], &(float){mf_sample(s, B, i)}, sizeof(float))) return 1;
    return 0;
}

/* Weight B in slot s's layout, re-made when the weights changed since it was made. A
 * weight at a new address (a ZeRO-3 gather into a fresh buffer) takes over a stale
 * layout of the same descriptors, its reorder and buffer, and creates nothing. */
static const void *mf_packed_weight(mf_thread *t, const mf_slot *s, const float *B) {
    const unsigned long now = atomic_load(&weights_generation);
    mf_pack *p = NULL, *twin = NULL, *victim = &t->packs[0];
    for (int i = 0; i < MF_PACKS && !p; i++) {
        mf_pack *q = &t->packs[i];
        const int same = q->used && dnnl_memory_desc_equal(&q->user, &s->b_user) &&
                         dnnl_memory_desc_equal(&q->packed, &s->b_packed);
        if (same && q->src == B) p = q;
        else if (same && q->generation != now && !twin) twin = q;
        else if (!q->used || (victim->used && q->last_use < victim->last_use)) victim = q;
    }
    if (!p && twin) {
        p = twin;
        p->src = B;
        p->generation = 0;   /* made from another weight */
    } else if (!p) {
        p = victim;
        mf_pack_setup(t, p, s, B);
    }
    p->last_use = ++t->clock;
    if (p->generation != now || mf_sample_changed(p, s, B)) {
        MF_CHECK(dnnl_memory_set_data_handle(p->from, (void *)B));
        dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, p->from}, {DNNL_ARG_TO, p->to}};
        MF_CHECK(dnnl_primitive_execute(p->reorder, t->base.stream, 2, args));
        MF_CHECK(dnnl_stream_wait(t->base.stream));
        p->generation = now;
        for (int i = 0; i < MF_SAMPLES; i++) p->sample[i] = mf_sample(s, B, i);
        t->reorders++;
    }
    return p->buf;
}

static void mf_execute(mf_thread *t, const mf_slot *s, const float *A, const void *B,
                       float *C) {
    MF_CHECK(dnnl_memory_set_data_handle(s->a, (void *)A));
    MF_CHECK(dnnl_memory_set_data_handle(s->b, (void *)B));
    MF_CHECK(dnnl_memory_set_data_handle(s->c, C));
    MF_CHECK(dnnl_memory_set_data_handle(s->scratch, t->scratch));
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, s->a},
                               {DNNL_ARG_WEIGHTS, s->b},
                               {DNNL_ARG_DST, s->c},
                               {DNNL_ARG_SCRATCHPAD, s->scratch}};
    MF_CHECK(dnnl_primitive_execute(s->prim, t->base.stream, 4, args));
    MF_CHECK(dnnl_stream_wait(t->base.stream));
}

void matmul_f32(int trans_a, int trans_b, int M, int N, int K, const float *A, int lda,
                const float *B, int ldb, float beta, float *C, int ldc, int weight) {
    if (beta != 0.0f && beta != 1.0f) {
        fprintf(stderr, "matmul_f32: beta %g (only 0 or 1)\n", (double)beta);
        exit(1);
    }
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {   /* an empty sum: C = 0, or C unchanged */
        for (int i = 0; i < M && beta == 0.0f; i++)
            memset(C + (size_t)i * ldc, 0, (size_t)N * sizeof(float));
        return;
    }
    const mf_slot key = {.trans_a = !!trans_a, .trans_b = !!trans_b, .M = M, .N = N, .K = K,
                         .lda = lda, .ldb = ldb, .ldc = ldc, .accumulate = beta != 0.0f,
                         .weight = !!weight};
    mf_thread *t = mf_thread_get();
    const mf_slot *s = mf_lookup(t, &key);
    mf_execute(t, s, A, s->packed ? mf_packed_weight(t, s, B) : (const void *)B, C);
}

const char *matmul_f32_impl(int trans_a, int trans_b, int M, int N, int K) {
    if (M <= 0 || N <= 0 || K <= 0) return "none (empty product)";
    const mf_slot key = {.trans_a = !!trans_a, .trans_b = !!trans_b, .M = M, .N = N, .K = K,
                         .lda = trans_a ? M : K, .ldb = trans_b ? K : N, .ldc = N,
                         .weight = 1};
    mf_thread *t = mf_thread_get();
    snprintf(t->impl_copy, sizeof t->impl_copy, "%s", mf_lookup(t, &key)->impl);
    return t->impl_copy;
}

unsigned long matmul_f32_creations(void) {
    const mf_thread *t = dnnl_util_tls_peek(&mf_tls);
    return t ? t->creations : 0;
}

unsigned long matmul_f32_packs(void) {
    const mf_thread *t = dnnl_util_tls_peek(&mf_tls);
    return t ? t->reorders : 0;
}
