/* oneDNN helpers shared by the matmuls (dnnl_util.h). */
#include "dnnl_util.h"

#include <oneapi/dnnl/dnnl_debug.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

void dnnl_util_die(const char *who, const char *what, dnnl_status_t st) {
    fprintf(stderr, "%s: %s failed: %s\n", who, what, dnnl_status2str(st));
    exit(1);
}

static void tls_destroy(void *arg) {
    dnnl_util_thread *t = arg;
    if (!t) return;
    t->tls->clear(t);
    dnnl_stream_destroy(t->stream);
    dnnl_engine_destroy(t->engine);
    free(t);
}

static pthread_mutex_t tls_lock = PTHREAD_MUTEX_INITIALIZER;

/* The key, created by the first caller of any thread. */
static pthread_key_t tls_key(dnnl_util_tls *tls) {
    if (!atomic_load(&tls->made)) {
        pthread_mutex_lock(&tls_lock);
        if (!atomic_load(&tls->made) && pthread_key_create(&tls->key, tls_destroy) == 0)
            atomic_store(&tls->made, 1);
        pthread_mutex_unlock(&tls_lock);
        if (!atomic_load(&tls->made)) {
            fprintf(stderr, "%s: no thread-specific key left\n", tls->who);
            exit(1);
        }
    }
    return tls->key;
}

void *dnnl_util_tls_peek(dnnl_util_tls *tls) { return pthread_getspecific(tls_key(tls)); }

void *dnnl_util_tls_get(dnnl_util_tls *tls) {
    dnnl_util_thread *t = dnnl_util_tls_peek(tls);
    if (t) return t;
    t = calloc(1, tls->size);
    if (!t) {
        fprintf(stderr, "%s: out of memory\n", tls->who);
        exit(1);
    }
    t->tls = tls;
    omp_set_num_threads(1);   /* this thread's count only: OpenMP keeps it per thread */
    DNNL_CHECK(tls->who, dnnl_engine_create(&t->engine, dnnl_cpu, 0));
    DNNL_CHECK(tls->who, dnnl_stream_create(&t->stream, t->engine, dnnl_stream_default_flags));
    pthread_setspecific(tls->key, t);
    return t;
}

void dnnl_util_tls_release(dnnl_util_tls *tls) {
    tls_destroy(dnnl_util_tls_peek(tls));
    pthread_setspecific(tls->key, NULL);
}

dnnl_memory_desc_t dnnl_util_strided(dnnl_data_type_t dt, int rows, int cols, int ld,
                                     int transposed) {
    dnnl_memory_desc_t md;
    dnnl_dims_t dims = {rows, cols};
    dnnl_dims_t strides = {transposed ? 1 : ld, transposed ? ld : 1};
    DNNL_CHECK("oneDNN", dnnl_memory_desc_init_by_strides(&md, 2, dims, dt, strides));
    return md;
}

dnnl_primitive_attr_t dnnl_util_matmul_attr(const char *who, int accumulate) {
    dnnl_primitive_attr_t attr;
    DNNL_CHECK(who, dnnl_primitive_attr_create(&attr));
    DNNL_CHECK(who, dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
    if (accumulate) {   /* beta = 1: C += product, in fp32 */
        dnnl_post_ops_t ops;
        DNNL_CHECK(who, dnnl_post_ops_create(&ops));
        DNNL_CHECK(who, dnnl_post_ops_append_sum(ops, 1.0f));
        DNNL_CHECK(who, dnnl_primitive_attr_set_post_ops(attr, ops));
        dnnl_post_ops_destroy(ops);
    }
    return attr;
}

void dnnl_util_grow(const char *who, void **buf, size_t *have, size_t bytes) {
    if (bytes <= *have) return;
    free(*buf);
    *buf = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!*buf) {
        fprintf(stderr, "%s: out of memory (%zu bytes)\n", who, bytes);
        exit(1);
    }
    *have = bytes;
}

void dnnl_util_destroy_memories(dnnl_memory_t *mems, int n) {
    for (int i = 0; i < n; i++)
        if (mems[i]) dnnl_memory_destroy(mems[i]);
}

void dnnl_util_matmul_memories(dnnl_primitive_desc_t pd, dnnl_engine_t engine,
                               dnnl_memory_t *mems[4]) {
    const dnnl_query_t which[4] = {dnnl_query_src_md, dnnl_query_weights_md,
                                   dnnl_query_dst_md, dnnl_query_scratchpad_md};
    for (int i = 0; i < 4; i++) {
        const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, which[i], 0);
        DNNL_CHECK("oneDNN", dnnl_memory_create(mems[i], md, engine, DNNL_MEMORY_NONE));
    }
}
