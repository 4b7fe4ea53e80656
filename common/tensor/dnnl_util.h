/* What the oneDNN matmuls (matmul16.c in 16 bits, matmul_f32.c in fp32) share: the
 * 2.x C API's calls checked, a thread's engine and stream on one core, strided 2-D
 * descriptors, the primitive attributes (our scratchpad, beta 1 as a "sum" post-op),
 * and buffers that grow only. */
#ifndef DNNL_UTIL_H
#define DNNL_UTIL_H
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stddef.h>

/* Prints "<who>: <what> failed: <oneDNN's reason>" and exits: a oneDNN call that fails
 * here is a bug or an unsupported CPU, which no caller can recover from. */
_Noreturn void dnnl_util_die(const char *who, const char *what, dnnl_status_t st);
#define DNNL_CHECK(who, call)                                 \
    do {                                                      \
        dnnl_status_t st_ = (call);                           \
        if (st_ != dnnl_success) dnnl_util_die(who, #call, st_); \
    } while (0)

/* A table of the calling thread's own (a matmul's primitives and buffers): made, zeroed,
 * on the thread's first use, with the thread's CPU engine and stream, its OpenMP thread
 * count set to 1 first (one core per rank: OMP_NUM_THREADS is read once, before main,
 * for every thread alike); destroyed when the thread ends. A table's type begins with
 * a dnnl_util_thread; `clear` frees what the rest of it holds. */
typedef struct dnnl_util_tls dnnl_util_tls;
typedef struct {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    const dnnl_util_tls *tls;
} dnnl_util_thread;
struct dnnl_util_tls {
    const char *who;
    size_t size;
    void (*clear)(void *table);
    pthread_key_t key;
    _Atomic int made;
};
#define DNNL_UTIL_TLS(who, type, clear) {who, sizeof(type), clear, 0, 0}
/* The calling thread's table, made when it has none. */
void *dnnl_util_tls_get(dnnl_util_tls *tls);
/* The calling thread's table, or NULL. */
void *dnnl_util_tls_peek(dnnl_util_tls *tls);
/* Destroys the calling thread's table now (a leak checker wants it of the main thread). */
void dnnl_util_tls_release(dnnl_util_tls *tls);

/* rows x cols of dt with leading dimension ld; stored transposed, its logical
 * [rows, cols] has strides {1, ld} instead of {ld, 1} (a transpose without a copy). */
dnnl_memory_desc_t dnnl_util_strided(dnnl_data_type_t dt, int rows, int cols, int ld,
                                     int transposed);

/* Attributes for a matmul: the scratchpad passed by the caller ("user" mode), and with
 * accumulate, C += product (the "sum" post-op). The caller destroys them. */
dnnl_primitive_attr_t dnnl_util_matmul_attr(const char *who, int accumulate);

/* Grows *buf to at least bytes (64-byte aligned), only when more is needed; exits
 * with a message when out of memory. */
void dnnl_util_grow(const char *who, void **buf, size_t *have, size_t bytes);

/* A matmul's memory objects without data (handles set at each run), in the layouts its
 * primitive descriptor chose: source, weights, destination, scratchpad, into *mems[i]. */
void dnnl_util_matmul_memories(dnnl_primitive_desc_t pd, dnnl_engine_t engine,
                               dnnl_memory_t *mems[4]);

/* Destroys the n memory objects that are set. */
void dnnl_util_destroy_memories(dnnl_memory_t *mems, int n);

#endif
