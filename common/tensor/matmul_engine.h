/* Which library computes the fp32 linear layers' products on the CPU: OpenBLAS
 * (cblas_sgemm) or oneDNN's fp32 matmul (matmul_f32.h). One choice per process, made
 * before any rank starts (--matmul, or the build's default: make MATMUL=onednn), read
 * by every rank thread. oneDNN takes the products that read a weight (forward and
 * input gradient); the weight gradient and the attention's per-head blocks stay on
 * OpenBLAS either way (ops_cpu.c says why); 16-bit products always run through oneDNN
 * (matmul16.h).
 *
 * The default stays OpenBLAS unless oneDNN measures at least 5% faster on bench256's
 * step and 10% on a 1F1B micro-batch's products (MATMUL_DEFAULT_REASON says what was
 * measured). */
#ifndef MATMUL_ENGINE_H
#define MATMUL_ENGINE_H

typedef enum { MATMUL_OPENBLAS, MATMUL_ONEDNN, MATMUL_ENGINES } matmul_engine;

/* "openblas", "onednn" (NULL-terminated, in enum order: --matmul's choices) */
extern const char *const matmul_engine_names[];

/* The build's default (MATMUL_DEFAULT_ONEDNN=1 makes it oneDNN). */
matmul_engine matmul_engine_default(void);
/* Why the build's default is what it is: the measurement behind it, one line. */
const char *matmul_engine_default_reason(void);

/* The engine of this process's fp32 products: set once before ranks start. */
void matmul_engine_set(matmul_engine e);
matmul_engine matmul_engine_current(void);
/* Whether the current engine came from the command line (else the build's default). */
int matmul_engine_chosen(void);
void matmul_engine_set_chosen(int chosen);

#endif
