// The kernels of ops.h's CUDA ops, and the helpers that run fixed sequences of them
// (column sums, the vec_sum stages); ops_cuda.cu launches them. How sums are ordered
// so that results depend only on the shapes: see ops_cuda.cu.

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cuda_check.h"
#include "grid_limits.h"
#include "ops_cuda.h"
#include "ops_cuda_kernels.cuh"
#include "overlap.h"

namespace ops_cuda_kernels {

cudaStream_t stream() { return cuda_thread_stream(); }

// Grid for a grid-stride loop over n items: enough blocks to fill the GPU, capped so
// that huge n does not launch millions of blocks.
unsigned grid_for(size_t n, int threads) {
    size_t blocks = (n + threads - 1) / threads;
    return (unsigned)std::min<size_t>(std::max<size_t>(blocks, 1), size_t(1) << 16);
}

// ---- reductions -------------------------------------------------------------------------

template <typename T>
__device__ T warp_sum(T v) {
    for (int offset = 16; offset > 0; offset >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32); every thread gets the result.
// `shared` holds 32 values; the leading barrier lets a kernel reuse it call after call.
template <typename T>
__device__ T block_sum(T v, T *shared) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? shared[lane] : T(0);
    return warp_sum(v);
}

__device__ float block_max(float v, float *shared) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? shared[lane] : -INFINITY;
    return warp_max(v);
}

// ---- column sums: dst[c] += sum over rows of f(row, c), in a fixed order ---------------
// Stage 1: a block of 32 columns x kColRows row lanes sums chunks of COLUMN_CHUNK_ROWS
// rows (block row y: chunks y, y + gridDim.y, ..., see grid_limits.h) into
// partials[y][c]. Stage 2: one thread per column adds the block rows in order.
// Coalesced along columns, and no atomics, so the result depends only on the shape.
// Accumulated in double, as the CPU version does, so that many rows lose nothing.
constexpr int kColRows = 16;
constexpr int kChunkRows = COLUMN_CHUNK_ROWS;

__device__ inline void row_terms(const plain_rows &r, size_t n, int c, int C, double &a,
                                 double &b) {
    a = r.dout[n * C + c];
    b = 0.0;
}
__device__ inline void row_terms(const layernorm_rows &r, size_t n, int c, int C, double &a,
                                 double &b) {
    const float d = r.dout[n * C + c];
    const float xhat = (r.inp[n * C + c] - r.mean[n]) * r.rstd[n];
    a = (double)d * xhat;   // -> dweight
    b = d;                  // -> dbias
}

template <typename Rows>
__global__ void column_partials_kernel(double *partial_a, double *partial_b, Rows rows,
                                       int N, int C, size_t chunks) {
    __shared__ double sa[kColRows][33], sb[kColRows][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    double acc_a = 0.0, acc_b = 0.0;
    if (c < C) {
        for (size_t chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y) {
            const size_t row0 = chunk * kChunkRows;
            const size_t row_end = row0 + kChunkRows < (size_t)N ? row0 + kChunkRows : N;
            for (size_t n = row0 + threadIdx.y; n < row_end; n += kColRows) {
                double a, b;
                row_terms(rows, n, c, C, a, b);
                acc_a += a;
                acc_b += b;
            }
        }
    }
    sa[threadIdx.y][threadIdx.x] = acc_a;
    sb[threadIdx.y][threadIdx.x] = acc_b;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        double sum_a = 0.0, sum_b = 0.0;
        for (int k = 0; k < kColRows; k++) {
            sum_a += sa[k][threadIdx.x];
            sum_b += sb[k][threadIdx.x];
        }
        partial_a[(size_t)blockIdx.y * C + c] = sum_a;
        if (partial_b) partial_b[(size_t)blockIdx.y * C + c] = sum_b;
    }
}

__global__ void column_finish_kernel(float *dst_a, float *dst_b, const double *partial_a,
                                     const double *partial_b, int block_rows, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double sum_a = 0.0, sum_b = 0.0;
    for (int p = 0; p < block_rows; p++) {
        sum_a += partial_a[(size_t)p * C + c];
        if (dst_b) sum_b += partial_b[(size_t)p * C + c];
    }
    dst_a[c] += (float)sum_a;
    if (dst_b) dst_b[c] += (float)sum_b;
}

// dst_a[c] += sum_n a(n, c) and, when dst_b is set, dst_b[c] += sum_n b(n, c).
template <typename Rows>
void column_sums(float *dst_a, float *dst_b, Rows rows, int N, int C) {
    if (N <= 0 || C <= 0) return;
    const size_t chunks = column_chunks((size_t)N);
    const unsigned block_rows = column_grid_y(chunks);
    double *partial =
        (double *)cuda_thread_scratch(sizeof(double) * 2 * (size_t)block_rows * C);
    double *partial_a = partial,
           *partial_b = dst_b ? partial + (size_t)block_rows * C : nullptr;
    dim3 grid((C + 31) / 32, block_rows), block(32, kColRows);
    column_partials_kernel<<<grid, block, 0, stream()>>>(partial_a, partial_b, rows, N, C,
                                                         chunks);
    CUDA_CHECK_LAUNCH();
    column_finish_kernel<<<(C + kThreads - 1) / kThreads, kThreads, 0, stream()>>>(
        dst_a, dst_b, partial_a, partial_b, (int)block_rows, C);
    CUDA_CHECK_LAUNCH();
}

// ---- elementwise kernels
// ------------------------------------------------------------------

#define GRID_STRIDE(i, n)                                                          \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);        \
         i += (size_t)gridDim.x * blockDim.x)

__global__ void embedding_forward_kernel(float *out, const int *tokens, const float *wte,
                                         int N, int C, int vocab_start, int vocab_len) {
    GRID_STRIDE(i, (size_t)N * C) {
        const size_t n = i / C, c = i % C;
        const unsigned row = (unsigned)(tokens[n] - vocab_start);   // < 0 wraps: outside
        out[i] = row < (unsigned)vocab_len ? wte[(size_t)row * C + c] : 0.0f;
    }
}

__global__ void position_forward_kernel(float *out, const float *wpe, size_t total,
                                        size_t TC) {
    GRID_STRIDE(i, total) { out[i] += wpe[i % TC]; }
}

// One thread per (t, c), walking the batch in order (in double, like the CPU):
// coalesced and deterministic.
__global__ void position_backward_kernel(float *dwpe, const float *dout, int B, size_t TC) {
    GRID_STRIDE(j, TC) {
        double acc = 0.0;
        for (int b = 0; b < B; b++) acc += dout[(size_t)b * TC + j];
        dwpe[j] += (float)acc;
    }
}

// GELU, tanh form, written as 0.5 x (1 + tanh u) = x / (1 + e^(-2u)),
// u = sqrt(2/pi) (x + 0.044715 x^3): one exp and no cancellation for negative x.
constexpr float kGeluK0 = 0.7978845608028654f;   // sqrt(2/pi)
constexpr float kGeluK1 = 0.044715f;

// e^(-2u), with -2u clamped so that e stays finite (e s^2 below would be inf * 0);
// the comparisons keep a NaN a NaN.
__device__ inline float gelu_exp(float x) {
    float z = -2.0f * kGeluK0 * (x + kGeluK1 * x * x * x);
    z = z < -80.0f ? -80.0f : z;
    z = z > 80.0f ? 80.0f : z;
    return expf(z);
}

// out = gelu(x) = x s, and x replaced by gelu'(x) (ops.h), with s = 1 / (1 + e):
// d/dx [x s] = s + 2 x u' e s^2
__global__ void gelu_forward_kernel(float *out, float *x_to_dgelu, size_t n) {
    GRID_STRIDE(i, n) {
        const float x = x_to_dgelu[i];
        const float du = kGeluK0 * (1.0f + 3.0f * kGeluK1 * x * x);
        const float e = gelu_exp(x);
        const float s = 1.0f / (1.0f + e);
        const float es = e * s;   // = 1 - s, first, so that e s^2 cannot overflow
        out[i] = x * s;
        x_to_dgelu[i] = s + 2.0f * x * du * es * s;
    }
}

__global__ void gelu_backward_kernel(float *dinp, const float *dgelu, const float *dout,
                                     size_t n) {
    GRID_STRIDE(i, n) dinp[i] = dgelu[i] * dout[i];
}

__global__ void crossentropy_backward_kernel(float *dlogits, const float *probs,
                                             const int *targets, float dloss, int V,
                                             size_t total) {
    GRID_STRIDE(i, total) {
        const size_t n = i / V;
        const int v = (int)(i % V);
        const float indicator = v == targets[n] ? 1.0f : 0.0f;
        dlogits[i] = (probs[i] - indicator) * dloss;
    }
}

__global__ void adamw_kernel(float *params, const float *grads, float *m, float *v,
                             size_t n, float lr, float beta1, float beta2, float eps,
                             float weight_decay, float bias_correction1,
                             float bias_correction2) {
    GRID_STRIDE(i, n) {
        const float g = grads[i];
        const float mi = beta1 * m[i] + (1.0f - beta1) * g;
        const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        const float p = params[i];
        // decoupled: the decay acts on the parameter, not through the moments
        params[i] =
            p - lr * ((mi / bias_correction1) / (sqrtf(vi / bias_correction2) + eps) +
                      weight_decay * p);
    }
}

__global__ void vec_add_kernel(float *y, const float *x, size_t n) {
    GRID_STRIDE(i, n) { y[i] += x[i]; }
}

__global__ void residual_kernel(float *out, const float *a, const float *b, size_t n) {
    GRID_STRIDE(i, n) { out[i] = a[i] + b[i]; }
}

__global__ void vec_scale_kernel(float *x, float alpha, size_t n) {
    GRID_STRIDE(i, n) { x[i] *= alpha; }
}

__global__ void fill_bias_kernel(float *out, const float *bias, int OC, size_t total) {
    GRID_STRIDE(i, total) { out[i] = bias[i % OC]; }
}

// ---- embedding backward: group rows by token, then add each group in row order ---------

// Key = row of the slice (vocab_len for tokens outside it, which sort last); value = n.
__global__ void embedding_keys_kernel(unsigned *keys, int *rows, const int *tokens, int N,
                                      int vocab_start, int vocab_len) {
    GRID_STRIDE(i, (size_t)N) {
        const unsigned row = (unsigned)(tokens[i] - vocab_start);
        keys[i] = row < (unsigned)vocab_len ? row : (unsigned)vocab_len;
        rows[i] = (int)i;
    }
}

// One block per sorted position; only the first position of each token's run works,
// so every dwte row is written by exactly one block, adding rows in ascending n.
__global__ void embedding_backward_kernel(float *dwte, const float *dout,
                                          const unsigned *sorted_keys,
                                          const int *sorted_rows, int N, int C,
                                          unsigned vocab_len) {
    const int start = blockIdx.x;
    const unsigned key = sorted_keys[start];
    if (key >= vocab_len || (start > 0 && sorted_keys[start - 1] == key)) return;
    int end = start + 1;
    while (end < N && sorted_keys[end] == key) end++;
    float *dst = dwte + (size_t)key * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = dst[c];
        for (int j = start; j < end; j++) acc += dout[(size_t)sorted_rows[j] * C + c];
        dst[c] = acc;
    }
}

// ---- layer norm: one warp per row ------------------------------------------------------

__global__ void layernorm_forward_kernel(float *out, float *mean, float *rstd,
                                         const float *inp, const float *weight,
                                         const float *bias, int N, int C) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (row >= N) return;
    const float *x = inp + (size_t)row * C;
    // Two passes in double, as on the CPU (the row is in L1 by the second): the
    // variance without cancellation.
    double sum = 0.0;
    for (int c = lane; c < C; c += 32) sum += x[c];
    const double mu = warp_sum(sum) / C;
    double sq = 0.0;
    for (int c = lane; c < C; c += 32) {
        const double d = x[c] - mu;
        sq += d * d;
    }
    // the output uses the stored float mean and rstd, exactly as backward will
    const float m = (float)mu;
    const float r = (float)(1.0 / sqrt(warp_sum(sq) / C + kLnEps));
    float *o = out + (size_t)row * C;
    for (int c = lane; c < C; c += 32) o[c] = (x[c] - m) * r * weight[c] + bias[c];
    if (lane == 0) {
        if (mean) mean[row] = m;
        if (rstd) rstd[row] = r;
    }
}

// dinp += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * w; the means in double.
__global__ void layernorm_backward_dinp_kernel(float *dinp, const float *dout,
                                               const float *inp, const float *weight,
                                               const float *mean, const float *rstd, int N,
                                               int C) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (row >= N) return;
    const size_t base = (size_t)row * C;
    const float m = mean[row], r = rstd[row];
    double sum_g = 0.0, sum_gx = 0.0;
    for (int c = lane; c < C; c += 32) {
        const float xhat = (inp[base + c] - m) * r;
        const float g = dout[base + c] * weight[c];
        sum_g += g;
        sum_gx += (double)g * xhat;
    }
    const float mean_g = (float)(warp_sum(sum_g) / C);
    const float mean_gx = (float)(warp_sum(sum_gx) / C);
    for (int c = lane; c < C; c += 32) {
        const float xhat = (inp[base + c] - m) * r;
        const float g = dout[base + c] * weight[c];
        dinp[base + c] += r * (g - mean_g - xhat * mean_gx);
    }
}

// ---- attention ------------------------------------------------------------------------

// Causal softmax of each row of att in place (rows of T; row t keeps columns 0..t).
// One warp per row; rows_total = B*NH*T.
__global__ void causal_softmax_kernel(float *att, int T, size_t rows_total) {
    const size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (row >= rows_total) return;
    const int t = (int)(row % T);
    float *a = att + row * T;
    float mx = -INFINITY;
    for (int j = lane; j <= t; j += 32) mx = fmaxf(mx, a[j]);
    mx = warp_max(mx);
    double sum = 0.0;   // of the float exponentials, in double, like the CPU
    for (int j = lane; j <= t; j += 32) sum += expf(a[j] - mx);
    const double inv = 1.0 / warp_sum(sum);
    for (int j = lane; j < T; j += 32)
        a[j] = j <= t ? (float)(expf(a[j] - mx) * inv) : 0.0f;
}

// datt holds dP = d(probabilities); turn it into d(scores / scale) in place:
// P * (dP - sum_k P dP), zero above the diagonal (the scale goes into the next gemms,
// as on the CPU).
__global__ void causal_softmax_backward_kernel(float *datt, const float *att, int T,
                                               size_t rows_total) {
    const size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (row >= rows_total) return;
    const int t = (int)(row % T);
    float *d = datt + row * T;
    const float *p = att + row * T;
    double dot = 0.0;
    for (int j = lane; j <= t; j += 32) dot += (double)p[j] * d[j];
    const float s = (float)warp_sum(dot);
    for (int j = lane; j < T; j += 32) d[j] = j <= t ? p[j] * (d[j] - s) : 0.0f;
}

head_walk plan_heads(int B, int T, int C, int NH) {
    const long long hs = C / NH, TT = (long long)T * T;
    if (B <= NH)
        return {B, NH, (long long)T * 3 * C, hs, NH * TT, TT, (long long)T * C, hs};
    return {NH, B, hs, (long long)T * 3 * C, TT, NH * TT, hs, (long long)T * C};
}

unsigned row_blocks(size_t rows) {
    return (unsigned)((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

// ---- cross-entropy: one block per row --------------------------------------------------

__global__ void crossentropy_forward_kernel(float *losses, float *probs,
                                            const float *logits, const int *targets,
                                            int V) {
    __shared__ float shared[32];
    const size_t n = blockIdx.x;
    const float *x = logits + n * V;
    float *p = probs + n * V;   // may be x itself: each element is read, then written,
                                // by the same thread, after the block's reductions
    __shared__ double shared_sum[32];
    // read what the loss needs before an in-place softmax overwrites it
    const float x_target = threadIdx.x == 0 ? x[targets[n]] : 0.0f;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, x[j]);
    mx = block_max(mx, shared);
    double sum = 0.0;   // of the float exponentials, in double, like the CPU
    for (int j = threadIdx.x; j < V; j += blockDim.x) sum += expf(x[j] - mx);
    sum = block_sum(sum, shared_sum);
    const double inv = 1.0 / sum;
    for (int j = threadIdx.x; j < V; j += blockDim.x) p[j] = (float)(expf(x[j] - mx) * inv);
    // -log softmax from the logits: exact even where the probability underflows
    if (threadIdx.x == 0) losses[n] = (float)(log(sum) - ((double)x_target - mx));
}

// ---- vec_sum: fixed two-stage reduction in double
// ----------------------------------------

__global__ void sum_partials_kernel(double *partials, const float *x, size_t n) {
    __shared__ double shared[32];
    double acc = 0.0;
    GRID_STRIDE(i, n) { acc += (double)x[i]; }
    acc = block_sum(acc, shared);
    if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__global__ void sum_finish_kernel(double *result, const double *partials, int count) {
    __shared__ double shared[32];
    double acc = 0.0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
    acc = block_sum(acc, shared);
    if (threadIdx.x == 0) *result = acc;
}

template void column_sums<plain_rows>(float *, float *, plain_rows, int, int);
template void column_sums<layernorm_rows>(float *, float *, layernorm_rows, int, int);

}  // namespace ops_cuda_kernels
