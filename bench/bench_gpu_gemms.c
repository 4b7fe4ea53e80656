/* cuBLAS's floor under a training step: the matrix products of one step of the model
 * the flags describe (--preset bench256, or GPT-2 small's --layers 12 --heads 12
 * --dim 768 --ctx 1024 --vocab 50304), each timed alone on one GPU, summed. A step
 * cannot beat it on this GPU with these products; gpu/check.sh prints a step's time
 * next to it. In fp32, TF32 and bf16 (16-bit inputs, fp32 sums and output, as
 * gpu/ops_cuda_mixed.cu's products).
 *
 * The products of a step, N = batch x ctx rows, per block: four linears (C -> 3C, C ->
 * C, C -> 4C, 4C -> C), each a forward product, d(input) and d(weight); attention's
 * batched products over batch x heads, Q K^T and att V forward, and their four
 * backward; then the LM head (C -> vocab), forward and both backward products. Each
 * is timed with CUDA events over --reps calls after two untimed ones.
 *   GPU=1 make benches && build/cpu-gpu/bench/bench_gpu_gemms --preset bench256
 *       [--label bench256] [--reps 20]
 * One "RESULT impl=gemm-floor label=... precision=P ms=M tflops=T" line per precision.
 * Without a GPU it prints "SKIP: <why>" and exits 0. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "device.h"
#include "model.h"
#include "number_formats.h"

#ifdef USE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "cuda_check.h"
#include "ops_cuda.h"

typedef struct {
    int m, n, k, batch;   /* column-major m x n = (m x k)(k x n), batch times */
    double count;         /* how many of it a step has */
} product;

enum { MAX_PRODUCTS = 4 * 3 + 2 + 3 };   /* four linears' three, attention's two, the head's */

/* The step's distinct products (shapes as ops_cuda.cu hands them to cuBLAS). */
static int step_products(const gpt_config *m, int B, product *out) {
    const int T = m->ctx, C = m->dim, NH = m->heads, hs = C / NH, N = B * T;
    const int L = m->layers;
    const int linear[4][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}};
    int n = 0;
    for (int i = 0; i < 4; i++) {
        const int IC = linear[i][0], OC = linear[i][1];
        out[n++] = (product){OC, N, IC, 1, L};   /* forward */
        out[n++] = (product){IC, N, OC, 1, L};   /* d(input) */
        out[n++] = (product){IC, OC, N, 1, L};   /* d(weight) */
    }
    out[n++] = (product){T, T, hs, B * NH, 3.0 * L};   /* Q K^T; dQ, dK's shapes alike */
    out[n++] = (product){hs, T, T, B * NH, 3.0 * L};   /* att V; d(att), dV alike */
    out[n++] = (product){m->vocab, N, C, 1, 1};        /* the LM head */
    out[n++] = (product){C, N, m->vocab, 1, 1};
    out[n++] = (product){C, m->vocab, N, 1, 1};
    return n;
}

/* Milliseconds of one call of p in the precision (0 fp32, 1 tf32, 2 bf16). */
static double time_product(const product *p, int precision, int reps, void *a, void *b,
                           float *c) {
    cublasHandle_t h = cuda_thread_cublas();
    cudaStream_t s = cuda_thread_stream();
    const cudaDataType_t in = precision == 2 ? CUDA_R_16BF : CUDA_R_32F;
    const cublasComputeType_t compute =
        precision == 1 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    const float alpha = 1.0f, beta = 0.0f;
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    for (int r = -2; r < reps; r++) {
        if (r == 0) CUDA_CHECK(cudaEventRecord(start, s));
        const cublasStatus_t st = cublasGemmStridedBatchedEx(
            h, CUBLAS_OP_N, CUBLAS_OP_N, p->m, p->n, p->k, &alpha, a, in, p->m,
            (long long)p->m * p->k, b, in, p->k, (long long)p->k * p->n, &beta, c,
            CUDA_R_32F, p->m, (long long)p->m * p->n, p->batch, compute,
            CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS) {   /* the product's shape, to find the bad one */
            fprintf(stderr, "cuBLAS error %d (%s): product m %d n %d k %d batch %d, %s\n",
                    (int)st, cublasGetStatusString(st), p->m, p->n, p->k, p->batch,
                    precision == 2 ? "bf16" : precision == 1 ? "tf32" : "fp32");
            exit(1);
        }
    }
    CUDA_CHECK(cudaEventRecord(stop, s));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    return ms / reps;
}

/* Buffers big enough for every product, filled with small non-zero values. */
static size_t largest(const product *p, int n, char which) {
    size_t most = 1;
    for (int i = 0; i < n; i++) {
        const size_t e = (size_t)p[i].batch * (which == 'a'   ? (size_t)p[i].m * p[i].k
                                               : which == 'b' ? (size_t)p[i].k * p[i].n
                                                              : (size_t)p[i].m * p[i].n);
        if (e > most) most = e;
    }
    return most;
}

/* Each 32-bit word is a bf16 value twice (h << 16 | h): read as fp32 about the same
 * value, read as bf16 two of it, so one buffer serves every precision. */
static void *filled(size_t n) {
    uint32_t *host = malloc(n * sizeof(uint32_t));
    if (!host) exit(1);
    for (size_t i = 0; i < n; i++) {
        const uint32_t h = number_to_bf16(0.001f * (float)(1 + i % 7));
        host[i] = h << 16 | h;
    }
    void *d = device_malloc(n * sizeof(uint32_t));
    cuda_ops_upload(d, host, n * sizeof(uint32_t));
    free(host);
    return d;
}

static int run(const run_config *cfg, const char *label, int reps) {
    product p[MAX_PRODUCTS];
    const int n = step_products(&cfg->model, cfg->batch, p);
    void *a = filled(largest(p, n, 'a')), *b = filled(largest(p, n, 'b'));
    float *c = device_malloc(largest(p, n, 'c') * sizeof(float));
    static const char *const names[] = {"fp32", "tf32", "bf16"};
    double flops = 0;
    for (int i = 0; i < n; i++) flops += 2.0 * p[i].m * p[i].n * p[i].k * p[i].batch * p[i].count;
    for (int precision = 0; precision < 3; precision++) {
        double ms = 0;
        for (int i = 0; i < n; i++) ms += p[i].count * time_product(&p[i], precision, reps, a, b, c);
        printf("%-6s %10.3f ms of products a step  %8.1f TFLOP/s\n", names[precision], ms,
               flops / (ms * 1e-3) / 1e12);
        printf("RESULT impl=gemm-floor label=%s precision=%s ms=%.3f tflops=%.2f\n", label,
               names[precision], ms, flops / (ms * 1e-3) / 1e12);
        fflush(stdout);
    }
    device_free(a), device_free(b), device_free(c);
    return 0;
}
#endif

int main(int argc, char **argv) {
    run_config cfg = run_config_default();
    const char *label = "model";
    int reps = 20;
    const cli_option options[] = {
        {"label", OPT_STRING, &label, "the name on the RESULT lines", NULL, 0},
        {"reps", OPT_INT, &reps, "timed calls of each product", NULL, 1},
        {0},
    };
    cli_parse(argc, argv, &cfg, options, argv[0],
              "cuBLAS's floor under a training step: its products timed alone, summed.");
    if (device_gpu_count() == 0) {
        char why[160];
        printf("SKIP: no GPU to time: %s\n", device_no_gpu_reason(why, sizeof why));
        return 0;
    }
#ifdef USE_CUDA
    device_select(DEVICE_CUDA, 0);
    printf("cuBLAS products of one training step (%s: layers %d, dim %d, heads %d, ctx %d,"
           " vocab %d, batch %d), each timed alone\n", label, cfg.model.layers, cfg.model.dim,
           cfg.model.heads, cfg.model.ctx, cfg.model.vocab, cfg.batch);
    return run(&cfg, label, reps);
#else
    return 0;
#endif
}
