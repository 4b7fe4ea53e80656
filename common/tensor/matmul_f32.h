/* fp32 matrix products through oneDNN's matmul, with a layer's weights kept in the
 * layout oneDNN asks for (format_tag any, then a reorder) across calls:
 *
 *   C[M,N] = op(A)[M,K] op(B)[K,N]  (+ C when beta = 1)
 *
 * Row-major, as cblas_sgemm(CblasRowMajor, ...) takes them (matmul16.h has the same
 * conventions); beta 0 or 1, no alpha. With weight set, B is a layer's weight: the
 * first call reorders it into a buffer of the thread's own, and later calls with the
 * same pointer and shape use that copy until the weights change. They change when an
 * optimizer step ends (adamw_update), when a buffer is allocated or freed (alloc.c: a
 * gather into a fresh buffer, a new model at a reused address), and wherever a caller
 * writes weights in place otherwise (a checkpoint loaded): each calls
 * matmul_weights_changed(), and every thread's copies are re-made at their next use.
 * Where oneDNN's layout for B is the caller's own, nothing is copied.
 *
 * As in matmul16, each (transposes, shape, leading dimensions, beta, weight) gets its
 * primitive once per thread; later calls neither allocate nor create anything, and each
 * thread computes on one core (its OpenMP count set to 1). */
#ifndef MATMUL_F32_H
#define MATMUL_F32_H

void matmul_f32(int trans_a, int trans_b, int M, int N, int K, const float *A, int lda,
                const float *B, int ldb, float beta, float *C, int ldc, int weight);

/* Every kept weight layout is stale: re-made at its next use, on every thread. */
void matmul_weights_changed(void);

/* The implementation oneDNN runs for this product (weight layout "any", packed
 * leading dimensions, beta 0), e.g. "gemm:jit"; valid until the thread's next call. */
const char *matmul_f32_impl(int trans_a, int trans_b, int M, int N, int K);

/* The calling thread's counts since its first call: primitives created (matmuls and
 * reorders), weight layouts made (reorders run). Constant while a loop repeats known shapes on weights
 * that do not change. */
unsigned long matmul_f32_creations(void);
unsigned long matmul_f32_packs(void);

/* Destroys the calling thread's primitives and buffers (a thread that ends does it). */
void matmul_f32_release_thread(void);

#endif
