// What the kernels of ops_cuda_kernels.cu offer the launchers of ops_cuda.cu: the
// kernels themselves, the launch geometry, and the host helpers that run a fixed
// sequence of kernels (column sums). The kernels keep one order of every sum, so that
// results depend only on the shapes (ops_cuda.cu's comment).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace ops_cuda_kernels {

constexpr int kThreads = 256;       // elementwise kernels
constexpr double kLnEps = 1e-5;     // ops.h: layer norm eps
constexpr int kRowsPerBlock = 8;    // warps per block in the row-per-warp kernels
constexpr int kSumThreads = 256;    // vec_sum's two stages
constexpr int kSumBlocksMax = 1024;

cudaStream_t stream();   // the calling thread's
// Grid for a grid-stride loop over n items: enough blocks to fill the GPU, capped so
// that huge n does not launch millions of blocks.
unsigned grid_for(size_t n, int threads = kThreads);
unsigned row_blocks(size_t rows);   // blocks of kRowsPerBlock rows

// What is summed: plain dout (bias gradients), or layernorm's dout * xhat and dout.
struct plain_rows {
    const float *dout;
};
struct layernorm_rows {
    const float *dout, *inp, *mean, *rstd;
};
// dst_a[c] += sum_n a(n, c) and, when dst_b is set, dst_b[c] += sum_n b(n, c), in a
// fixed order, accumulated in double.
template <typename Rows>
void column_sums(float *dst_a, float *dst_b, Rows rows, int N, int C);

// How the B*NH (batch, head) matrices are walked: an outer host loop and an inner
// strided batch. Heads of one batch row are hs apart in qkv and T*T apart in att;
// batch rows are T*3C and NH*T*T apart: neither alone gives one uniform stride for
// all B*NH, so the shorter of the two becomes the host loop.
struct head_walk {
    int outer, inner;
    long long qkv_outer, qkv_inner, att_outer, att_inner, y_outer, y_inner;
};
head_walk plan_heads(int B, int T, int C, int NH);

__global__ void column_finish_kernel(float *dst_a, float *dst_b, const double *partial_a,
                                     const double *partial_b, int block_rows, int C);
__global__ void embedding_forward_kernel(float *out, const int *tokens, const float *wte,
                                         int N, int C, int vocab_start, int vocab_len);
__global__ void position_forward_kernel(float *out, const float *wpe, size_t total,
                                        size_t TC);
__global__ void position_backward_kernel(float *dwpe, const float *dout, int B, size_t TC);
__global__ void gelu_forward_kernel(float *out, float *x_to_dgelu, size_t n);
__global__ void gelu_backward_kernel(float *dinp, const float *dgelu, const float *dout,
                                     size_t n);
__global__ void crossentropy_backward_kernel(float *dlogits, const float *probs,
                                             const int *targets, float dloss, int V,
                                             size_t total);
__global__ void adamw_kernel(float *params, const float *grads, float *m, float *v,
                             size_t n, float lr, float beta1, float beta2, float eps,
                             float weight_decay, float bias_correction1,
                             float bias_correction2);
__global__ void vec_add_kernel(float *y, const float *x, size_t n);
__global__ void residual_kernel(float *out, const float *a, const float *b, size_t n);
__global__ void vec_scale_kernel(float *x, float alpha, size_t n);
__global__ void fill_bias_kernel(float *out, const float *bias, int OC, size_t total);
__global__ void embedding_keys_kernel(unsigned *keys, int *rows, const int *tokens, int N,
                                      int vocab_start, int vocab_len);
__global__ void embedding_backward_kernel(float *dwte, const float *dout,
                                          const unsigned *sorted_keys,
                                          const int *sorted_rows, int N, int C,
                                          unsigned vocab_len);
__global__ void layernorm_forward_kernel(float *out, float *mean, float *rstd,
                                         const float *inp, const float *weight,
                                         const float *bias, int N, int C);
__global__ void layernorm_backward_dinp_kernel(float *dinp, const float *dout,
                                               const float *inp, const float *weight,
                                               const float *mean, const float *rstd, int N,
                                               int C);
__global__ void causal_softmax_kernel(float *att, int T, size_t rows_total);
__global__ void causal_softmax_backward_kernel(float *datt, const float *att, int T,
                                               size_t rows_total);
__global__ void crossentropy_forward_kernel(float *losses, float *probs,
                                            const float *logits, const int *targets,
                                            int V);
__global__ void sum_partials_kernel(double *partials, const float *x, size_t n);
__global__ void sum_finish_kernel(double *result, const double *partials, int count);

}  // namespace ops_cuda_kernels
