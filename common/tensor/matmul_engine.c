/* The fp32 matmul engine of this process (matmul_engine.h). */
#include "matmul_engine.h"

#include <stdatomic.h>
#include <stddef.h>

const char *const matmul_engine_names[] = {"openblas", "onednn", NULL};

#ifndef MATMUL_DEFAULT_ONEDNN
#define MATMUL_DEFAULT_ONEDNN 0
#endif

/* The decision rule's measurements (docs/design.md, "fp32 matmul engine"): on an AMD
 * EPYC without AVX-512 oneDNN 2.6's fp32 matmul is its AVX2 gemm:jit, whose "any"
 * weight layout is a plain one; on an Intel Xeon with AVX-512 it is brgemm with a
 * blocked weight layout. */
#define MATMUL_DEFAULT_REASON                                                            \
    "OpenBLAS by default: oneDNN's fp32 matmul measured 4% slower on bench256's step and" \
    " 3-7% on 1F1B's micro-batch products (AVX2 gemm:jit); within 3% and 8% faster"     \
    " (AVX-512 brgemm); the rule asks 5% and 10% faster"

static _Atomic int engine = MATMUL_DEFAULT_ONEDNN ? MATMUL_ONEDNN : MATMUL_OPENBLAS;
static _Atomic int chosen;

matmul_engine matmul_engine_default(void) {
    return MATMUL_DEFAULT_ONEDNN ? MATMUL_ONEDNN : MATMUL_OPENBLAS;
}

const char *matmul_engine_default_reason(void) {
    return MATMUL_DEFAULT_ONEDNN ? "oneDNN by this build's choice (make MATMUL=onednn)"
                                 : MATMUL_DEFAULT_REASON;
}

void matmul_engine_set(matmul_engine e) { atomic_store(&engine, (int)e); }
matmul_engine matmul_engine_current(void) { return (matmul_engine)atomic_load(&engine); }
int matmul_engine_chosen(void) { return atomic_load(&chosen); }
void matmul_engine_set_chosen(int c) { atomic_store(&chosen, c); }
