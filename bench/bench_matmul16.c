/* 16-bit matmuls against fp32 on one core: GFLOP/s of OpenBLAS's cblas_sgemm (fp32 in
 * and out), matmul16 in bf16 and in fp16 (16-bit in, fp32 accumulation and out), at
 * bench256's linear-layer shapes, with the kernel each runs on named. Speed only,
 * never asserted.
 *   build/cpu/bench/bench_matmul16 [repeats]     (best of repeats, default 5)
 * The forward's layout: out[M,N] = inp[M,K] weight[N,K]^T (trans_b); the weight gradient
 * accumulates (beta 1), as the step's do. */
#include <cblas.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "matmul16.h"
#include "precision.h"

typedef struct { int M, N, K, trans_a, trans_b, accumulate; const char *what; } shape;
/* bench256 (dim 256, 512 tokens a step): qkv and fc forward, fc-proj forward, then fc's
 * backward: the input gradient dX = dY W and the weight gradient dW += dY^T X */
static const shape shapes[] = {{512, 768, 256, 0, 1, 0, "qkv"},
                               {512, 1024, 256, 0, 1, 0, "fc"},
                               {512, 256, 1024, 0, 1, 0, "fc proj"},
                               {512, 256, 1024, 0, 0, 0, "fc dX"},
                               {1024, 256, 512, 1, 0, 1, "fc dW"}};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
    int M, N, K, trans_a, trans_b, accumulate;
    float *a, *b, *c;
    uint16_t *a16, *b16;
} operands;

/* One product in fp32 (p = PRECISION_FP32: cblas_sgemm) or 16 bits (matmul16). */
static void run_once(const operands *o, precision p) {
    const int lda = o->trans_a ? o->M : o->K, ldb = o->trans_b ? o->K : o->N;
    const float beta = o->accumulate ? 1.0f : 0.0f;
    if (p == PRECISION_FP32)
        cblas_sgemm(CblasRowMajor, o->trans_a ? CblasTrans : CblasNoTrans,
                    o->trans_b ? CblasTrans : CblasNoTrans, o->M, o->N, o->K, 1.0f, o->a, lda,
                    o->b, ldb, beta, o->c, o->N);
    else
        matmul16(p, o->trans_a, o->trans_b, o->M, o->N, o->K, o->a16, lda, o->b16, ldb, beta,
                 o->c, o->N);
}

/* GFLOP/s: the best of repeats timings, each of enough products for ~50 ms. */
static double gflops(const operands *o, precision p, int repeats) {
    const double flops = 2.0 * o->M * o->N * o->K;
    run_once(o, p);   /* the primitive is created here, outside the timing */
    double t0 = now_s();
    run_once(o, p);
    double one = now_s() - t0;
    int iters = one > 0 ? (int)(0.05 / one) + 1 : 100;
    double best = 1e30;
    for (int r = 0; r < repeats; r++) {
        double start = now_s();
        for (int i = 0; i < iters; i++) run_once(o, p);
        double t = (now_s() - start) / iters;
        if (t < best) best = t;
    }
    return flops / best / 1e9;
}

static operands operands_make(const shape *s, precision p16) {
    operands o = {.M = s->M, .N = s->N, .K = s->K, .trans_a = s->trans_a,
                  .trans_b = s->trans_b, .accumulate = s->accumulate};
    size_t na = (size_t)s->M * s->K, nb = (size_t)s->N * s->K, nc = (size_t)s->M * s->N;
    o.a = malloc(na * sizeof(float));
    o.b = malloc(nb * sizeof(float));
    o.c = calloc(nc, sizeof(float));
    o.a16 = malloc(na * sizeof(uint16_t));
    o.b16 = malloc(nb * sizeof(uint16_t));
    if (!o.a || !o.b || !o.c || !o.a16 || !o.b16) {
        fprintf(stderr, "bench_matmul16: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < na; i++) o.a[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
    for (size_t i = 0; i < nb; i++) o.b[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
    precision_to16(p16, o.a16, o.a, na);
    precision_to16(p16, o.b16, o.b, nb);
    return o;
}

static void operands_free(operands *o) {
    free(o->a); free(o->b); free(o->c); free(o->a16); free(o->b16);
}

int main(int argc, char **argv) {
    const int repeats = argc > 1 ? atoi(argv[1]) : 5;
    openblas_set_num_threads(1);   /* matmul16 keeps oneDNN to one thread itself */
    printf("  fp32: OpenBLAS cblas_sgemm, %s kernels\n", openblas_get_corename());
    for (int p = PRECISION_BF16; p <= PRECISION_FP16; p++)
        printf("  %s: %s\n", precision_name((precision)p),
               matmul16_impl((precision)p, 0, 1, shapes[0].M, shapes[0].N, shapes[0].K));
    printf("  %-8s %16s %10s %10s %10s %9s  (GFLOP/s, 1 thread, best of %d)\n", "layer",
           "M x N x K", "fp32", "bf16", "fp16", "bf16/fp32", repeats);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        double rate[PRECISION_COUNT];
        for (int p = 0; p < PRECISION_COUNT; p++) {
            operands o = operands_make(&shapes[s], p == PRECISION_FP16 ? PRECISION_FP16
                                                                       : PRECISION_BF16);
            rate[p] = gflops(&o, (precision)p, repeats);
            operands_free(&o);
        }
        printf("  %-8s %4d x %4d x %4d %10.0f %10.0f %10.0f %8.2fx\n", shapes[s].what,
               shapes[s].M, shapes[s].N, shapes[s].K, rate[PRECISION_FP32],
               rate[PRECISION_BF16], rate[PRECISION_FP16],
               rate[PRECISION_BF16] / rate[PRECISION_FP32]);
    }
    matmul16_release_thread();
    return 0;
}
