/* The time floor of --predict-chapters: this machine's single-thread sgemm rate at the
 * shape of bench256's MLP, which the predicted step time divides the FLOPs by. */
#include "predict.h"

#include <cblas.h>

#include "alloc.h"

double measure_sgemm_gflops(int tokens, int dim) {
    const int M = tokens, N = 4 * dim, K = dim;   /* the MLP's first GEMM */
    float *a = mem_alloc(MEM_OTHER, sizeof(float) * M * K);
    float *b = mem_alloc(MEM_OTHER, sizeof(float) * K * N);
    float *c = mem_alloc(MEM_OTHER, sizeof(float) * M * N);
    openblas_set_num_threads(1);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1, a, K, b, N, 0, c, N);
    int calls = 0;
    const double t0 = comm_now();
    double elapsed = 0;
    while (elapsed < 0.2) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1, a, K, b, N, 0, c, N);
        calls++;
        elapsed = comm_now() - t0;
    }
    mem_free(a);
    mem_free(b);
    mem_free(c);
    return 2.0 * M * N * K * calls / elapsed / 1e9;
}
