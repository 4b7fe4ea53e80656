// The ops of ops.h as CUDA kernels and cuBLAS calls, queued on the calling thread's
// stream. Semantics follow ops.h exactly (see there): forward outputs and input
// gradients are overwritten, parameter gradients and layernorm's dinp accumulate.
//
// Determinism: no floating-point atomics anywhere. Reductions across rows (bias and
// layernorm parameter gradients, position gradients, vec_sum) run in a fixed order
// that depends only on the shapes; the embedding gradient groups rows by token with a
// stable radix sort and then adds each token's rows in ascending row order, exactly
// the order of a sequential CPU loop. cuBLAS is deterministic on one stream.
//
// Row-major matrices are handed to column-major cuBLAS as their transposes: a
// row-major [R, K] matrix with row stride ld is a column-major K x R matrix with
// leading dimension ld, and (A B)^T = B^T A^T turns every product around.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cub/cub.cuh>

#include "cuda_check.h"
#include "grid_limits.h"
#include "ops_cuda.h"
#include "ops_cuda_kernels.cuh"
#include "overlap.h"

using namespace ops_cuda_kernels;

namespace {

// Process-wide: --tf32 is a property of the run, set once before ranks start.
std::atomic<int> tf32_flag{0};

// ---- matmuls ----------------------------------------------------------------------------

cublasComputeType_t compute_type() {
    return tf32_flag.load(std::memory_order_relaxed) ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                     : CUBLAS_COMPUTE_32F;
}

// The thread's handle with its math mode brought in line with the flag (cheap: it sets
// a field), so a --tf32 set after a rank's device_select still applies.
cublasHandle_t matmul_handle() {
    cublasHandle_t h = cuda_thread_cublas();
    CUBLAS_CHECK(cublasSetMathMode(h, tf32_flag.load(std::memory_order_relaxed)
                                          ? CUBLAS_TF32_TENSOR_OP_MATH
                                          : CUBLAS_DEFAULT_MATH));
    return h;
}

// Column-major C[m,n] = alpha op(A)[m,k] op(B)[k,n] + beta C, fp32 storage.
void gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
          float alpha, const float *A, int lda, const float *B, int ldb, float beta,
          float *C, int ldc) {
    CUBLAS_CHECK(cublasGemmEx(h, ta, tb, m, n, k, &alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F,
                              ldb, &beta, C, CUDA_R_32F, ldc, compute_type(),
                              CUBLAS_GEMM_DEFAULT));
}

void gemm_batched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                  int n, int k, float alpha, const float *A, int lda, long long stride_a,
                  const float *B, int ldb, long long stride_b, float beta, float *C,
                  int ldc, long long stride_c, int batch) {
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, &alpha, A, CUDA_R_32F, lda,
                                            stride_a, B, CUDA_R_32F, ldb, stride_b, &beta,
                                            C, CUDA_R_32F, ldc, stride_c, batch,
                                            compute_type(), CUBLAS_GEMM_DEFAULT));
}

}  // namespace


// =========================================================================================
// The C interface
// =========================================================================================

extern "C" {

void cuda_set_tf32(int on) { tf32_flag.store(on ? 1 : 0, std::memory_order_relaxed); }
int cuda_tf32_enabled(void) { return tf32_flag.load(std::memory_order_relaxed); }

// ---- embeddings
// ----------------------------------------------------------------------------

void cuda_embedding_forward(float *out, const int *tokens, const float *wte, int N, int C,
                            int vocab_start, int vocab_len) {
    if (N <= 0 || C <= 0) return;
    embedding_forward_kernel<<<grid_for((size_t)N * C), kThreads, 0, stream()>>>(
        out, tokens, wte, N, C, vocab_start, vocab_len);
    CUDA_CHECK_LAUNCH();
}

void cuda_embedding_backward(float *dwte, const float *dout, const int *tokens, int N,
                             int C, int vocab_start, int vocab_len) {
    if (N <= 0 || C <= 0 || vocab_len <= 0) return;
    // Only the bits that can be set are sorted: keys run 0..vocab_len.
    int end_bit = 1;
    while (end_bit < 32 && ((unsigned long long)1 << end_bit) <= (unsigned)vocab_len)
        end_bit++;
    size_t sort_bytes = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, (unsigned *)nullptr,
                                               (unsigned *)nullptr, (int *)nullptr,
                                               (int *)nullptr, N, 0, end_bit, stream()));
    // One scratch block: the sort's workspace first (it wants alignment), then four
    // arrays of N 32-bit values.
    const size_t workspace = (sort_bytes + 255) & ~(size_t)255;
    char *scratch = (char *)cuda_thread_scratch(workspace + 4 * sizeof(int) * (size_t)N);
    unsigned *keys_in = (unsigned *)(scratch + workspace);
    unsigned *keys_out = keys_in + N;
    int *rows_in = (int *)(keys_out + N);
    int *rows_out = rows_in + N;
    embedding_keys_kernel<<<grid_for(N), kThreads, 0, stream()>>>(
        keys_in, rows_in, tokens, N, vocab_start, vocab_len);
    CUDA_CHECK_LAUNCH();
    // Radix sort is stable: equal tokens keep ascending n, so sums follow row order.
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(scratch, sort_bytes, keys_in, keys_out,
                                               rows_in, rows_out, N, 0, end_bit, stream()));
    const int threads = std::min(256, std::max(32, (C + 31) / 32 * 32));
    embedding_backward_kernel<<<N, threads, 0, stream()>>>(dwte, dout, keys_out, rows_out,
                                                           N, C, (unsigned)vocab_len);
    CUDA_CHECK_LAUNCH();
}

void cuda_position_forward(float *out, const float *wpe, int B, int T, int C) {
    const size_t TC = (size_t)T * C, total = (size_t)B * TC;
    if (total == 0) return;
    position_forward_kernel<<<grid_for(total), kThreads, 0, stream()>>>(out, wpe, total,
                                                                        TC);
    CUDA_CHECK_LAUNCH();
}

void cuda_position_backward(float *dwpe, const float *dout, int B, int T, int C) {
    const size_t TC = (size_t)T * C;
    if (TC == 0 || B <= 0) return;
    position_backward_kernel<<<grid_for(TC), kThreads, 0, stream()>>>(dwpe, dout, B, TC);
    CUDA_CHECK_LAUNCH();
}

// ---- layer norm
// ----------------------------------------------------------------------------

void cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int N, int C) {
    if (N <= 0 || C <= 0) return;
    layernorm_forward_kernel<<<row_blocks(N), kRowsPerBlock * 32, 0, stream()>>>(
        out, mean, rstd, inp, weight, bias, N, C);
    CUDA_CHECK_LAUNCH();
}

void cuda_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, const float *mean,
                             const float *rstd, int N, int C) {
    if (N <= 0 || C <= 0) return;
    layernorm_backward_dinp_kernel<<<row_blocks(N), kRowsPerBlock * 32, 0, stream()>>>(
        dinp, dout, inp, weight, mean, rstd, N, C);
    CUDA_CHECK_LAUNCH();
    column_sums(dweight, dbias, layernorm_rows{dout, inp, mean, rstd}, N, C);
}

// ---- linear
// -----------------------------------------------------------------------------------

void cuda_linear_forward(float *out, const float *inp, const float *weight,
                         const float *bias, int N, int IC, int OC) {
    if (N <= 0 || OC <= 0) return;
    cublasHandle_t h = matmul_handle();
    float beta = 0.0f;
    if (bias) {
        // start from the bias and let the gemm add onto it (beta 1), as the CPU does
        const size_t total = (size_t)N * OC;
        fill_bias_kernel<<<grid_for(total), kThreads, 0, stream()>>>(out, bias, OC, total);
        CUDA_CHECK_LAUNCH();
        beta = 1.0f;
    }
    // out^T[OC,N] = W[OC,IC] inp^T[IC,N]; W's column-major view is W^T, hence op T.
    gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, 1.0f, weight, IC, inp, IC, beta, out, OC);
}

void cuda_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, int N, int IC, int OC) {
    if (N <= 0 || IC <= 0 || OC <= 0) return;
    cublasHandle_t h = matmul_handle();
    // dinp^T[IC,N] = W^T[IC,OC] dout^T[OC,N]  (overwritten)
    if (dinp) gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, 1.0f, weight, IC, dout, OC, 0.0f,
                   dinp, IC);
    // dweight^T[IC,OC] += inp^T[IC,N] dout[N,OC]  (accumulated: beta = 1)
    if (dweight) gemm(h, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, 1.0f, inp, IC, dout, OC, 1.0f,
                      dweight, IC);
    if (dbias) column_sums(dbias, (float *)nullptr, plain_rows{dout}, N, OC);
}

// ---- attention
// --------------------------------------------------------------------------------

void cuda_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                            int NH) {
    if (B <= 0 || T <= 0 || C <= 0 || NH <= 0) return;
    const int hs = C / NH, ld_qkv = 3 * C;
    const float scale = (float)(1.0 / sqrt((double)hs));
    const head_walk w = plan_heads(B, T, C, NH);
    cublasHandle_t h = matmul_handle();
    // scores: S[t,j] = scale * q_t . k_j, as column-major S^T = K Q^T (full T x T; the
    // softmax then masks the upper triangle)
    for (int o = 0; o < w.outer; o++) {
        const float *q = qkv + o * w.qkv_outer, *k = q + C;
        gemm_batched(h, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, scale, k, ld_qkv, w.qkv_inner,
                     q, ld_qkv, w.qkv_inner, 0.0f, att + o * w.att_outer, T, w.att_inner,
                     w.inner);
    }
    const size_t rows = (size_t)B * NH * T;
    causal_softmax_kernel<<<row_blocks(rows), kRowsPerBlock * 32, 0, stream()>>>(att, T,
                                                                                 rows);
    CUDA_CHECK_LAUNCH();
    // out[t,:] = sum_j P[t,j] v_j: column-major out^T = V^T P^T
    for (int o = 0; o < w.outer; o++) {
        const float *v = qkv + o * w.qkv_outer + 2 * C;
        gemm_batched(h, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, v, ld_qkv, w.qkv_inner,
                     att + o * w.att_outer, T, w.att_inner, 0.0f, out + o * w.y_outer, C,
                     w.y_inner, w.inner);
    }
}

void cuda_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                             const float *att, int B, int T, int C, int NH) {
    if (B <= 0 || T <= 0 || C <= 0 || NH <= 0) return;
    const int hs = C / NH, ld_qkv = 3 * C;
    const float scale = (float)(1.0 / sqrt((double)hs));
    const head_walk w = plan_heads(B, T, C, NH);
    cublasHandle_t h = matmul_handle();
    for (int o = 0; o < w.outer; o++) {
        const float *v = qkv + o * w.qkv_outer + 2 * C;
        const float *dy = dout + o * w.y_outer;
        const float *p = att + o * w.att_outer;
        float *dp = datt + o * w.att_outer;
        float *dv = dqkv + o * w.qkv_outer + 2 * C;
        // dP = dY V^T  (column-major dP^T = V dY^T)
        gemm_batched(h, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, 1.0f, v, ld_qkv, w.qkv_inner,
                     dy, C, w.y_inner, 0.0f, dp, T, w.att_inner, w.inner);
        // dV = P^T dY  (column-major dV^T = dY^T P)
        gemm_batched(h, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, 1.0f, dy, C, w.y_inner, p, T,
                     w.att_inner, 0.0f, dv, ld_qkv, w.qkv_inner, w.inner);
    }
    const size_t rows = (size_t)B * NH * T;
    causal_softmax_backward_kernel<<<row_blocks(rows), kRowsPerBlock * 32, 0, stream()>>>(
        datt, att, T, rows);
    CUDA_CHECK_LAUNCH();
    for (int o = 0; o < w.outer; o++) {
        const float *q = qkv + o * w.qkv_outer, *k = q + C;
        const float *ds = datt + o * w.att_outer;
        float *dq = dqkv + o * w.qkv_outer, *dk = dq + C;
        // dQ = scale dS K  (column-major dQ^T = K^T dS^T)
        gemm_batched(h, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, scale, k, ld_qkv, w.qkv_inner,
                     ds, T, w.att_inner, 0.0f, dq, ld_qkv, w.qkv_inner, w.inner);
        // dK = scale dS^T Q  (column-major dK^T = Q^T dS)
        gemm_batched(h, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, scale, q, ld_qkv, w.qkv_inner,
                     ds, T, w.att_inner, 0.0f, dk, ld_qkv, w.qkv_inner, w.inner);
    }
}

// ---- GELU
// --------------------------------------------------------------------------------

void cuda_gelu_forward(float *out, float *x, size_t n) {
    if (n == 0) return;
    gelu_forward_kernel<<<grid_for(n), kThreads, 0, stream()>>>(out, x, n);
    CUDA_CHECK_LAUNCH();
}

void cuda_gelu_backward(float *dinp, const float *dgelu, const float *dout, size_t n) {
    if (n == 0) return;
    gelu_backward_kernel<<<grid_for(n), kThreads, 0, stream()>>>(dinp, dgelu, dout, n);
    CUDA_CHECK_LAUNCH();
}

// ---- cross-entropy
// -------------------------------------------------------------------------

void cuda_crossentropy_forward(float *losses, float *probs, const float *logits,
                               const int *targets, int N, int V) {
    if (N <= 0 || V <= 0) return;
    // Small vocabularies: fewer idle threads; large ones: more loads in flight.
    const int threads = V <= 1024 ? 128 : 512;
    crossentropy_forward_kernel<<<N, threads, 0, stream()>>>(losses, probs, logits, targets,
                                                             V);
    CUDA_CHECK_LAUNCH();
}

void cuda_crossentropy_backward(float *dlogits, const float *probs, const int *targets,
                                float dloss, int N, int V) {
    const size_t total = (size_t)N * V;
    if (N <= 0 || V <= 0) return;
    crossentropy_backward_kernel<<<grid_for(total), kThreads, 0, stream()>>>(
        dlogits, probs, targets, dloss, V, total);
    CUDA_CHECK_LAUNCH();
}

// ---- AdamW
// ------------------------------------------------------------------------------------

void cuda_adamw_update(float *params, const float *grads, float *m, float *v, size_t n,
                       const adamw_config *cfg, int step) {
    if (n == 0) return;
    const float bias_correction1 = (float)(1.0 - pow(cfg->beta1, step));
    const float bias_correction2 = (float)(1.0 - pow(cfg->beta2, step));
    adamw_kernel<<<grid_for(n), kThreads, 0, stream()>>>(
        params, grads, m, v, n, cfg->lr, cfg->beta1, cfg->beta2, cfg->eps,
        cfg->weight_decay, bias_correction1, bias_correction2);
    CUDA_CHECK_LAUNCH();
}

// ---- vectors
// ------------------------------------------------------------------------------

void cuda_vec_zero(float *x, size_t n) {
    if (n == 0) return;
    CUDA_CHECK(cudaMemsetAsync(x, 0, n * sizeof(float), stream()));
}

// memmove semantics, as cpu_vec_copy: overlapping ranges go through the scratch.
void cuda_vec_copy(float *dst, const float *src, size_t n) {
    if (n == 0 || dst == src) return;
    const size_t bytes = n * sizeof(float);
    if (ranges_overlap(dst, src, bytes)) {
        float *staged = (float *)cuda_thread_scratch(bytes);
        CUDA_CHECK(cudaMemcpyAsync(staged, src, bytes, cudaMemcpyDeviceToDevice, stream()));
        src = staged;
    }
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()));
}

void cuda_vec_add(float *y, const float *x, size_t n) {
    if (n == 0) return;
    vec_add_kernel<<<grid_for(n), kThreads, 0, stream()>>>(y, x, n);
    CUDA_CHECK_LAUNCH();
}

void cuda_residual_forward(float *out, const float *a, const float *b, size_t n) {
    if (n == 0) return;
    residual_kernel<<<grid_for(n), kThreads, 0, stream()>>>(out, a, b, n);
    CUDA_CHECK_LAUNCH();
}

void cuda_vec_scale(float *x, float alpha, size_t n) {
    if (n == 0) return;
    vec_scale_kernel<<<grid_for(n), kThreads, 0, stream()>>>(x, alpha, n);
    CUDA_CHECK_LAUNCH();
}

double cuda_vec_sum(const float *x, size_t n) {
    if (n == 0) return 0.0;
    // The block count depends on n only, so the summation order is fixed.
    const int blocks = (int)std::min<size_t>((n + kSumThreads * 4 - 1) / (kSumThreads * 4),
                                             kSumBlocksMax);
    double *partials = (double *)cuda_thread_scratch(sizeof(double) * (blocks + 1));
    double *result = partials + blocks;
    sum_partials_kernel<<<blocks, kSumThreads, 0, stream()>>>(partials, x, n);
    CUDA_CHECK_LAUNCH();
    sum_finish_kernel<<<1, kSumThreads, 0, stream()>>>(result, partials, blocks);
    CUDA_CHECK_LAUNCH();
    double host = 0.0;
    CUDA_CHECK(
        cudaMemcpyAsync(&host, result, sizeof host, cudaMemcpyDeviceToHost, stream()));
    CUDA_CHECK(cudaStreamSynchronize(stream()));
    return host;
}

// ---- host <-> device
// ----------------------------------------------------------------------

// Blocking, like cudaMemcpy, but ordered on the thread's (non-blocking) stream: a plain
// cudaMemcpy runs on the legacy stream and would not wait for this rank's kernels.
void cuda_ops_upload(void *device_dst, const void *host_src, size_t bytes) {
    if (bytes == 0) return;
    CUDA_CHECK(
        cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, stream()));
    CUDA_CHECK(cudaStreamSynchronize(stream()));
}

void cuda_ops_download(void *host_dst, const void *device_src, size_t bytes) {
    if (bytes == 0) return;
    CUDA_CHECK(
        cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, stream()));
    CUDA_CHECK(cudaStreamSynchronize(stream()));
}

void cuda_ops_synchronize(void) { CUDA_CHECK(cudaStreamSynchronize(stream())); }

}  // extern "C"
