/* 16-bit matmuls against fp32 on one core: GFLOP/s of OpenBLAS's cblas_sgemm (fp32 in
 * and out), matmul16 in bf16 and in fp16 (16-bit in, fp32 accumulation and out), at
 * bench256's linear-layer shapes, with the kernel each runs on named. Speed only,
 * never asserted.
 *   build/cpu/bench/bench_matmul16 [--cold] [repeats]   (best of repeats, default 5)
 * The forward's layout: out[M,N] = inp[M,K] weight[N,K]^T (trans_b); the weight gradient
 * accumulates (beta 1), as the step's do.
 *
 * Warm, each product repeats on operands already in this core's caches: the floor that
 * --profile compares a step with. --cold writes 64 MiB between products, so that each
 * starts with its operands out of L1 and L2, as most of a step's do (other ops wrote
 * their outputs between the write of an activation or weight and the product that
 * reads it). */
#include <cblas.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* Written between cold products: far beyond any core's L2 (1-4 MiB on CPUs of today). */
#define EVICT_BYTES (64u << 20)

/* Writes a buffer far larger than L2, as a step's other ops write their activations and
 * gradients between products: the operands leave this core's caches, and the caches
 * hold dirty lines to write back (reading the buffer alone left the products as fast
 * as warm on a CPU with a large L3). */
static void evict_caches(unsigned char *buffer) {
    for (size_t i = 0; i < EVICT_BYTES; i += 64) buffer[i]++;
}

/* GFLOP/s: the best of `tries` timings. Warm: each of enough products for ~50 ms.
 * Cold (evict not NULL): one product each, after evicting the caches. */
static double gflops(const operands *o, precision p, int tries, unsigned char *evict) {
    const double flops = 2.0 * o->M * o->N * o->K;
    run_once(o, p);   /* the primitive is created here, outside the timing */
    double t0 = now_s();
    run_once(o, p);
    double one = now_s() - t0;
    int iters = evict ? 1 : one > 0 ? (int)(0.05 / one) + 1 : 100;
    double best = 1e30;
    for (int r = 0; r < tries; r++) {
        if (evict) evict_caches(evict);
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

/* [--cold] [repeats]: one clear line and exit 2 on anything else. */
static void parse_args(int argc, char **argv, int *cold, int *repeats) {
    *cold = 0;
    *repeats = 5;
    for (int i = 1; i < argc; i++) {
        char *end;
        long r = strtol(argv[i], &end, 10);
        if (!strcmp(argv[i], "--cold")) {
            *cold = 1;
        } else if (*argv[i] && !*end && r >= 1 && r <= 1000) {
            *repeats = (int)r;
        } else {
            fprintf(stderr, "bench_matmul16: error: '%s': expected --cold or a number of "
                            "repeats from 1 to 1000\n", argv[i]);
            exit(2);
        }
    }
}

int main(int argc, char **argv) {
    int cold, repeats;
    parse_args(argc, argv, &cold, &repeats);
    const int tries = cold ? 4 * repeats : repeats;   /* a cold try times one product */
    unsigned char *evict = cold ? calloc(EVICT_BYTES, 1) : NULL;
    if (cold && !evict) {
        fprintf(stderr, "bench_matmul16: out of memory\n");
        return 1;
    }
    openblas_set_num_threads(1);   /* matmul16 keeps oneDNN to one thread itself */
    printf("  fp32: OpenBLAS cblas_sgemm, %s kernels\n", openblas_get_corename());
    for (int p = PRECISION_BF16; p <= PRECISION_FP16; p++)
        printf("  %s: %s\n", precision_name((precision)p),
               matmul16_impl((precision)p, 0, 1, shapes[0].M, shapes[0].N, shapes[0].K));
    printf("  %-8s %16s %10s %10s %10s %9s  (GFLOP/s, 1 thread, best of %d%s)\n", "layer",
           "M x N x K", "fp32", "bf16", "fp16", "bf16/fp32", tries,
           cold ? "; operands evicted from L1 and L2 before each product" : "");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        double rate[PRECISION_COUNT];
        for (int p = 0; p < PRECISION_COUNT; p++) {
            operands o = operands_make(&shapes[s], p == PRECISION_FP16 ? PRECISION_FP16
                                                                       : PRECISION_BF16);
            rate[p] = gflops(&o, (precision)p, tries, evict);
            operands_free(&o);
        }
        printf("  %-8s %4d x %4d x %4d %10.0f %10.0f %10.0f %8.2fx\n", shapes[s].what,
               shapes[s].M, shapes[s].N, shapes[s].K, rate[PRECISION_FP32],
               rate[PRECISION_BF16], rate[PRECISION_FP16],
               rate[PRECISION_BF16] / rate[PRECISION_FP32]);
    }
    matmul16_release_thread();
    free(evict);
    return 0;
}
