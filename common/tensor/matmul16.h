/* Matrix products with 16-bit inputs and fp32 accumulation and output, on the CPU,
 * through oneDNN's matmul: the building block of mixed-precision linear layers.
 *
 *   C[M,N] = op(A)[M,K] op(B)[K,N]  (+ C when beta = 1)
 *
 * Row-major, as cblas_sgemm(CblasRowMajor, ...) takes them: op(A) is A[M,K] (leading
 * dimension lda) or, with trans_a, A stored as [K,M]; op(B) is B[K,N] (ldb) or, with
 * trans_b, B stored as [N,K]; C is [M,N] with leading dimension ldc. A and B hold bf16
 * or fp16 bit patterns (precision.h); every product is summed in fp32, and beta = 1
 * adds onto what C holds (a bias put there first, or a gradient accumulating), beta = 0
 * overwrites it. Only beta 0 and 1, and no alpha: what the linear layers need.
 *
 * The first call with a given (precision, transposes, shape, leading dimensions, beta)
 * on a thread creates oneDNN's primitive for it; later calls reuse it from a small
 * table of the thread's own, and neither allocate nor create anything. Each calling
 * thread computes on one core: matmul16 sets its own OpenMP thread count to 1 (oneDNN
 * is built on OpenMP), as one rank per core wants.
 *
 * Where oneDNN has no implementation for a 16-bit type on this CPU (fp16 without
 * AVX512-FP16 or AMX-FP16), the inputs are widened to fp32 (exactly: every 16-bit
 * value is an fp32 value) and multiplied by oneDNN's fp32 matmul: the same product of
 * the same rounded inputs, at fp32's speed. matmul16_impl names which one runs.
 *
 * Either way a row of C is summed the same way whatever the other rows of a call of 16
 * rows or more at a multiple of 16 (fewer, or odd pieces, may run other kernels): a
 * rank's or a micro-batch's rows get the bits the whole batch's rows get. */
#ifndef MATMUL16_H
#define MATMUL16_H
#include <stdint.h>

#include "precision.h"

/* p is PRECISION_BF16 or PRECISION_FP16; beta is 0 or 1 (anything else exits with a
 * message, as does a failure inside oneDNN). M, N or K of 0 is allowed. */
void matmul16(precision p, int trans_a, int trans_b, int M, int N, int K,
              const uint16_t *A, int lda, const uint16_t *B, int ldb, float beta, float *C,
              int ldc);

/* The same product (beta 0) rounded once to p's 16 bits into C (leading dimension
 * ldc), with bias[N] of p, when not NULL, added in fp32 before the rounding: a linear
 * layer's output, without an fp32 copy of it (oneDNN writes the 16-bit result; the
 * fallback computes in fp32 scratch and rounds). A bias-less product of K = 0 is 0. */
void matmul16_out16(precision p, int trans_a, int trans_b, int M, int N, int K,
                    const uint16_t *A, int lda, const uint16_t *B, int ldb,
                    const uint16_t *bias, uint16_t *C, int ldc);

/* The implementation matmul16 runs for this product with packed operands (lda, ldb,
 * ldc the row lengths, beta 0): its library and that library's name for it ("oneDNN
 * brg:avx512_core_bf16", ...), or for the fallback its fp32 kernel's ("oneDNN gemm:jit,
 * 16 rows a call", "OpenBLAS sgemm, ..."), followed by "(fp32 from <type>: no oneDNN
 * <type> matmul here)". Creates the primitive if the thread has none yet. The string stays valid
 * until the thread's next call of this function. */
const char *matmul16_impl(precision p, int trans_a, int trans_b, int M, int N, int K);

/* Whether p's products run the fallback here (widened to fp32). */
int matmul16_widens(precision p);

/* Whether every row of p's products keeps its bits whatever rows share its call, down
 * to a call of one row, at odd offsets and alignments (matmul16_rows.c probes one
 * product once per precision: every transpose, beta 0 and 1, the 16-bit output). The
 * calls of 16 rows or more at multiples of 16 keep them on every kernel matmul16 runs;
 * smaller or odd pieces (a sequence of a tiny model, an expert's tokens) on some native
 * kernels alone (AMX's bf16 sums a one-row call differently). A kernel
 * that differs only rarely can pass one product (the fallback's AVX-512 fp32 brgemm:
 * one row of a 128 x 96 product in fp16), so it speaks for native kernels. */
int matmul16_rows_invariant(precision p);

/* How many products the calling thread has set up (a primitive created, or a fallback
 * chosen) since its first call: constant while a loop repeats known shapes. */
unsigned long matmul16_creations(void);

/* Destroys the calling thread's primitives and buffers (a thread that ends does it by
 * itself): what a leak checker wants before the main thread exits. */
void matmul16_release_thread(void);

#endif
