// The 16-bit ops (ops_mixed_table.h) on the calling thread's GPU, mirroring the CPU's
// ops_mixed.c op for op: the 16-bit inputs widened to fp32 (exact) into the thread's
// 16-bit scratch, the fp32 op of ops_cuda.cu run on them, what it writes rounded once
// to 16 bits (nearest even). The conversions are number_formats.h's, the very code the
// CPU path and the wire run, so a value rounds to the same bits on either device.
// Products are the exception, as on the CPU: cuBLAS multiplies the 16-bit values on the
// tensor cores and sums in fp32 (cublasGemmEx, CUBLAS_COMPUTE_32F), fp32 output; a
// linear's output gets its bias added in fp32 and is rounded once.
//
// Everything is queued on the thread's stream; only vec_finite waits (for its answer).
// The scratch is requested once per op at its full size: growing it waits for the
// stream, so a run that repeats its shapes settles after its first step.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_check.h"
#include "number_formats.h"
#include "ops_cuda.h"
#include "ops_cuda_kernels.cuh"
#include "ops_cuda_mixed.h"
#include "overlap.h"

using namespace ops_cuda_kernels;

namespace {

// ---- element conversions: number_formats.h on the device ------------------------------

__device__ __forceinline__ float widen16(bool bf16, uint16_t h) {
    return bf16 ? number_from_bf16(h) : number_from_f16(h);
}
__device__ __forceinline__ uint16_t round16(bool bf16, float x) {
    return bf16 ? number_to_bf16(x) : number_to_f16(x);
}

#define GRID_STRIDE(i, n)                                                          \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);        \
         i += (size_t)gridDim.x * blockDim.x)

__global__ void widen_kernel(float *dst, const uint16_t *src, size_t n, bool bf16) {
    GRID_STRIDE(i, n) dst[i] = widen16(bf16, src[i]);
}

__global__ void round_kernel(uint16_t *dst, const float *src, size_t n, bool bf16) {
    GRID_STRIDE(i, n) dst[i] = round16(bf16, src[i]);
}

// y += x: widened, added in fp32, rounded once (ops_mixed.c's add_bf16 and fp16 loop)
__global__ void add16_kernel(uint16_t *y, const uint16_t *x, size_t n, bool bf16) {
    GRID_STRIDE(i, n) y[i] = round16(bf16, widen16(bf16, y[i]) + widen16(bf16, x[i]));
}

// out = round(acc + bias): a linear's fp32 product and its widened bias, rounded once
__global__ void bias_round_kernel(uint16_t *out, const float *acc, const uint16_t *bias,
                                  int OC, size_t total, bool bf16) {
    GRID_STRIDE(i, total) {
        float x = acc[i];
        if (bias) x += widen16(bf16, bias[i % (size_t)OC]);
        out[i] = round16(bf16, x);
    }
}

// out[n,:] = wte[tokens[n] - vocab_start, :] in its 16 bits, or +0 outside the slice
__global__ void embedding16_kernel(uint16_t *out, const int *tokens, const uint16_t *wte,
                                   int N, int C, int vocab_start, int vocab_len) {
    GRID_STRIDE(i, (size_t)N * C) {
        const size_t n = i / (size_t)C, c = i % (size_t)C;
        const unsigned row = (unsigned)(tokens[n] - vocab_start);
        out[i] = row < (unsigned)vocab_len ? wte[(size_t)row * C + c] : (uint16_t)0;
    }
}

// *flag = 1 when some element is inf or NaN (an all-ones exponent in either format)
__global__ void nonfinite16_kernel(int *flag, const uint16_t *x, size_t n, bool bf16) {
    const uint16_t exponent = bf16 ? 0x7f80u : 0x7c00u;
    GRID_STRIDE(i, n) {
        if ((x[i] & exponent) == exponent) *flag = 1;   // any writer: the same 1
    }
}

bool is_bf16(precision p) {
    if (p != PRECISION_BF16 && p != PRECISION_FP16) {
        fprintf(stderr, "error: a 16-bit GPU op called with precision %d\n", (int)p);
        exit(1);
    }
    return p == PRECISION_BF16;
}

cudaDataType_t type16(precision p) { return is_bf16(p) ? CUDA_R_16BF : CUDA_R_16F; }

// The thread's 16-bit scratch as at least n floats.
float *scratch(size_t n) { return (float *)cuda_thread_mixed_scratch(n * sizeof(float)); }

void widen(precision p, float *dst, const void *src, size_t n) {
    if (n == 0) return;
    widen_kernel<<<grid_for(n), kThreads, 0, stream()>>>(dst, (const uint16_t *)src, n,
                                                          is_bf16(p));
    CUDA_CHECK_LAUNCH();
}

void round_to(precision p, void *dst, const float *src, size_t n) {
    if (n == 0) return;
    round_kernel<<<grid_for(n), kThreads, 0, stream()>>>((uint16_t *)dst, src, n,
                                                          is_bf16(p));
    CUDA_CHECK_LAUNCH();
}

// Column-major C[m,n] (fp32) = op(A) op(B) + beta C with A and B 16-bit: tensor cores,
// fp32 sums. (Row-major operands turned around as in ops_cuda.cu.)
void gemm16(precision p, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
            const void *A, int lda, const void *B, int ldb, float beta, float *C, int ldc) {
    const float alpha = 1.0f;
    cublasHandle_t h = cuda_thread_cublas();
    CUBLAS_CHECK(cublasGemmEx(h, ta, tb, m, n, k, &alpha, A, type16(p), lda, B, type16(p),
                              ldb, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
}

}  // namespace

extern "C" {

// ---- whole vectors ----------------------------------------------------------------------

void cuda_mixed_round(precision p, void *dst, const float *src, size_t n) {
    round_to(p, dst, src, n);
}

void cuda_mixed_widen(precision p, float *dst, const void *src, size_t n) {
    widen(p, dst, src, n);
}

// ---- embeddings -------------------------------------------------------------------------

void cuda_mixed_embedding_forward(precision p, void *out, const int *tokens,
                                  const void *wte, int N, int C, int vocab_start,
                                  int vocab_len) {
    const size_t total = (size_t)N * C;
    if (N <= 0 || C <= 0) return;
    (void)is_bf16(p);   // a copy of rows: the bits as they are
    embedding16_kernel<<<grid_for(total), kThreads, 0, stream()>>>(
        (uint16_t *)out, tokens, (const uint16_t *)wte, N, C, vocab_start, vocab_len);
    CUDA_CHECK_LAUNCH();
}

void cuda_mixed_embedding_backward(precision p, float *dwte, const void *dout,
                                   const int *tokens, int N, int C, int vocab_start,
                                   int vocab_len) {
    if (N <= 0 || C <= 0) return;
    float *g = scratch((size_t)N * C);
    widen(p, g, dout, (size_t)N * C);
    cuda_embedding_backward(dwte, g, tokens, N, C, vocab_start, vocab_len);
}

void cuda_mixed_position_forward(precision p, void *out, const void *wpe, int B, int T,
                                 int C) {
    const size_t tc = (size_t)T * C, n = (size_t)B * tc;
    if (n == 0) return;
    float *pos = scratch(tc + n), *o = pos + tc;
    widen(p, pos, wpe, tc);
    widen(p, o, out, n);   // out += wpe: widened, added in fp32, rounded once
    cuda_position_forward(o, pos, B, T, C);
    round_to(p, out, o, n);
}

void cuda_mixed_position_backward(precision p, float *dwpe, const void *dout, int B, int T,
                                  int C) {
    const size_t n = (size_t)B * T * C;
    if (n == 0) return;
    float *g = scratch(n);
    widen(p, g, dout, n);
    cuda_position_backward(dwpe, g, B, T, C);
}

// ---- layer norm -------------------------------------------------------------------------

void cuda_mixed_layernorm_forward(precision p, void *out, float *mean, float *rstd,
                                  const void *inp, const void *weight, const void *bias,
                                  int N, int C) {
    const size_t n = (size_t)N * C;
    if (n == 0) return;
    float *wgt = scratch(2 * (size_t)C + 2 * n), *b = wgt + C, *x = b + C, *y = x + n;
    widen(p, wgt, weight, (size_t)C);
    widen(p, b, bias, (size_t)C);
    widen(p, x, inp, n);
    cuda_layernorm_forward(y, mean, rstd, x, wgt, b, N, C);
    round_to(p, out, y, n);
}

void cuda_mixed_layernorm_backward(precision p, void *dinp, float *dweight, float *dbias,
                                   const void *dout, const void *inp, const void *weight,
                                   const float *mean, const float *rstd, int N, int C) {
    const size_t n = (size_t)N * C;
    if (n == 0) return;
    float *wgt = scratch((size_t)C + 3 * n), *dx = wgt + C, *dy = dx + n, *x = dy + n;
    widen(p, wgt, weight, (size_t)C);
    widen(p, dx, dinp, n);   // dinp accumulates: widened, added in fp32, rounded once
    widen(p, dy, dout, n);
    widen(p, x, inp, n);
    cuda_layernorm_backward(dx, dweight, dbias, dy, x, wgt, mean, rstd, N, C);
    round_to(p, dinp, dx, n);
}

// ---- linear: 16-bit products, fp32 sums -------------------------------------------------

void cuda_mixed_linear_forward(precision p, void *out, const void *inp, const void *weight,
                               const void *bias, int N, int IC, int OC) {
    const size_t total = (size_t)N * OC;
    if (total == 0) return;
    float *acc = scratch(total);
    // acc^T[OC,N] = W[OC,IC] inp^T[IC,N], as cuda_linear_forward
    gemm16(p, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, weight, IC, inp, IC, 0.0f, acc, OC);
    bias_round_kernel<<<grid_for(total), kThreads, 0, stream()>>>(
        (uint16_t *)out, acc, (const uint16_t *)bias, OC, total, is_bf16(p));
    CUDA_CHECK_LAUNCH();
}

void cuda_mixed_linear_backward(precision p, void *dinp, float *dweight, float *dbias,
                                const void *dout, const void *inp, const void *weight,
                                int N, int IC, int OC) {
    if (N <= 0 || IC <= 0 || OC <= 0) return;
    const size_t n_in = (size_t)N * IC, n_out = (size_t)N * OC;
    float *work = scratch(n_in > n_out ? n_in : n_out);
    if (dinp) {   // dinp^T[IC,N] = W^T[IC,OC] dout^T[OC,N], rounded once
        gemm16(p, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, weight, IC, dout, OC, 0.0f, work, IC);
        round_to(p, dinp, work, n_in);
    }
    // dweight^T[IC,OC] += inp^T[IC,N] dout[N,OC], straight into the fp32 gradient
    if (dweight)
        gemm16(p, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, inp, IC, dout, OC, 1.0f, dweight, IC);
    if (dbias) {   // the fp32 op's column sums of dout widened (the stream orders the reuse)
        widen(p, work, dout, n_out);
        cuda_linear_backward(nullptr, nullptr, dbias, work, nullptr, nullptr, N, IC, OC);
    }
}

// ---- attention ---------------------------------------------------------------------------

void cuda_mixed_attention_forward(precision p, void *out, void *att, const void *qkv,
                                  int B, int T, int C, int NH) {
    if (B <= 0 || T <= 0 || C <= 0 || NH <= 0) return;
    const size_t n_qkv = (size_t)B * T * 3 * C, n_out = (size_t)B * T * C;
    const size_t n_att = (size_t)B * NH * T * T;
    float *q = scratch(n_qkv + n_out + n_att), *o = q + n_qkv, *a = o + n_out;
    widen(p, q, qkv, n_qkv);
    cuda_attention_forward(o, a, q, B, T, C, NH);
    round_to(p, out, o, n_out);
    round_to(p, att, a, n_att);
}

// datt, scratch in ops.h, is not written: the fp32 op's scratch is ours (as on the CPU).
void cuda_mixed_attention_backward(precision p, void *dqkv, void *datt, const void *dout,
                                   const void *qkv, const void *att, int B, int T, int C,
                                   int NH) {
    (void)datt;
    if (B <= 0 || T <= 0 || C <= 0 || NH <= 0) return;
    const size_t n_qkv = (size_t)B * T * 3 * C, n_out = (size_t)B * T * C;
    const size_t n_att = (size_t)B * NH * T * T;
    float *q = scratch(2 * n_qkv + n_out + 2 * n_att), *dq = q + n_qkv;
    float *dy = dq + n_qkv, *a = dy + n_out, *da = a + n_att;
    widen(p, q, qkv, n_qkv);
    widen(p, dy, dout, n_out);
    widen(p, a, att, n_att);
    cuda_attention_backward(dq, da, dy, q, a, B, T, C, NH);
    round_to(p, dqkv, dq, n_qkv);
}

// ---- GELU --------------------------------------------------------------------------------

void cuda_mixed_gelu_forward(precision p, void *out, void *x, size_t n) {
    if (n == 0) return;
    float *xs = scratch(2 * n), *ys = xs + n;
    widen(p, xs, x, n);
    cuda_gelu_forward(ys, xs, n);
    round_to(p, out, ys, n);
    round_to(p, x, xs, n);   // x becomes gelu'(x), as in fp32
}

void cuda_mixed_gelu_backward(precision p, void *dinp, const void *dgelu, const void *dout,
                              size_t n) {
    if (n == 0) return;
    float *dg = scratch(2 * n), *dy = dg + n;   // dinp may be dout: both read first
    widen(p, dg, dgelu, n);
    widen(p, dy, dout, n);
    cuda_gelu_backward(dy, dg, dy, n);
    round_to(p, dinp, dy, n);
}

// ---- cross-entropy -----------------------------------------------------------------------

void cuda_mixed_crossentropy_forward(precision p, float *losses, void *probs,
                                     const void *logits, const int *targets, int N, int V) {
    const size_t n = (size_t)N * V;
    if (n == 0) return;
    float *x = scratch(n);   // probs may be logits: read, then written
    widen(p, x, logits, n);
    cuda_crossentropy_forward(losses, x, x, targets, N, V);   // in place
    round_to(p, probs, x, n);
}

void cuda_mixed_crossentropy_backward(precision p, void *dlogits, const void *probs,
                                      const int *targets, float dloss, int N, int V) {
    const size_t n = (size_t)N * V;
    if (n == 0) return;
    float *x = scratch(n);   // dlogits may be probs
    widen(p, x, probs, n);
    cuda_crossentropy_backward(x, x, targets, dloss, N, V);
    round_to(p, dlogits, x, n);
}

// ---- vectors -----------------------------------------------------------------------------

void cuda_mixed_vec_zero(precision p, void *x, size_t n) {
    (void)is_bf16(p);   // +0 in both formats
    if (n) CUDA_CHECK(cudaMemsetAsync(x, 0, n * sizeof(uint16_t), stream()));
}

// memmove semantics (ops.h's vec_copy): overlapping ranges go through the scratch
void cuda_mixed_vec_copy(precision p, void *dst, const void *src, size_t n) {
    (void)is_bf16(p);
    const size_t bytes = n * sizeof(uint16_t);
    if (n == 0 || dst == src) return;
    if (ranges_overlap(dst, src, bytes)) {
        void *staged = scratch((bytes + 3) / 4);
        CUDA_CHECK(cudaMemcpyAsync(staged, src, bytes, cudaMemcpyDeviceToDevice, stream()));
        src = staged;
    }
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()));
}

void cuda_mixed_vec_add(precision p, void *y, const void *x, size_t n) {
    if (n == 0) return;
    add16_kernel<<<grid_for(n), kThreads, 0, stream()>>>((uint16_t *)y, (const uint16_t *)x,
                                                          n, is_bf16(p));
    CUDA_CHECK_LAUNCH();
}

// ---- the optimizer's ---------------------------------------------------------------------

// The CPU sums the widened values in double (never overflowing for finite ones): the
// sum is finite exactly when every element is, which is what the device checks.
int cuda_mixed_vec_finite(precision p, const void *x, size_t n) {
    if (n == 0) return 1;
    int *flag = (int *)scratch(1), found = 0;
    CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), stream()));
    nonfinite16_kernel<<<grid_for(n), kThreads, 0, stream()>>>(flag, (const uint16_t *)x, n,
                                                                is_bf16(p));
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cudaMemcpyAsync(&found, flag, sizeof(int), cudaMemcpyDeviceToHost, stream()));
    CUDA_CHECK(cudaStreamSynchronize(stream()));
    return !found;
}

// Widen (or copy fp32), scale by grad_scale, AdamW: element by element, so the whole
// vector at once gives the CPU's chunked bits.
void cuda_mixed_adamw_update(precision p, float *params, const void *grads,
                             float grad_scale, float *m, float *v, size_t n,
                             const adamw_config *cfg, int step) {
    if (n == 0) return;
    float *g = scratch(n);
    if (p == PRECISION_FP32)
        CUDA_CHECK(cudaMemcpyAsync(g, grads, n * sizeof(float), cudaMemcpyDeviceToDevice,
                                   stream()));
    else
        widen(p, g, grads, n);
    if (grad_scale != 1.0f) cuda_vec_scale(g, grad_scale, n);
    cuda_adamw_update(params, g, m, v, n, cfg, step);
}

// Rounded into the scratch, then copied down onto x's first 2n bytes: in place, one
// kernel would race (element i's bits land where float i/2 may not yet be read).
void cuda_mixed_round_in_place(precision p, float *x, size_t n) {
    if (n == 0) return;
    uint16_t *rounded = (uint16_t *)scratch((n + 1) / 2);
    round_to(p, rounded, x, n);
    CUDA_CHECK(cudaMemcpyAsync(x, rounded, n * sizeof(uint16_t), cudaMemcpyDeviceToDevice,
                               stream()));
}

}  // extern "C"
