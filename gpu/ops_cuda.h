/* The CUDA implementation of ops.h (gpu/ops_cuda.cu), plus the per-thread CUDA state
 * and the device layer that gpu/device_cuda.c keeps for each rank.
 *
 * Every cuda_<name> has exactly the signature and the semantics of <name> in ops.h
 * (accumulate vs overwrite, in-place cross-entropy, vocab slices); gpu/backend.c puts
 * them into the ops_table that common/ops.c calls when the calling thread's device is
 * DEVICE_CUDA. Pointers are device memory of
 * the calling thread's GPU, except the host side of upload/download. Work is queued on
 * the calling thread's stream; only vec_sum, upload, download and synchronize wait. */
#ifndef OPS_CUDA_H
#define OPS_CUDA_H
#include <stddef.h>

#include "ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the ops ------------------------------------------------------------------------ */
void cuda_embedding_forward(float *out, const int *tokens, const float *wte, int N, int C,
                            int vocab_start, int vocab_len);
void cuda_embedding_backward(float *dwte, const float *dout, const int *tokens, int N,
                             int C, int vocab_start, int vocab_len);
void cuda_position_forward(float *out, const float *wpe, int B, int T, int C);
void cuda_position_backward(float *dwpe, const float *dout, int B, int T, int C);

void cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int N, int C);
void cuda_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, const float *mean,
                             const float *rstd, int N, int C);

void cuda_linear_forward(float *out, const float *inp, const float *weight,
                         const float *bias, int N, int IC, int OC);
void cuda_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, int N, int IC, int OC);

void cuda_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                            int NH);
void cuda_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                             const float *att, int B, int T, int C, int NH);

void cuda_gelu_forward(float *out, float *x, size_t n);
void cuda_gelu_backward(float *dinp, const float *dgelu, const float *dout, size_t n);

void cuda_crossentropy_forward(float *losses, float *probs, const float *logits,
                               const int *targets, int N, int V);
void cuda_crossentropy_backward(float *dlogits, const float *probs, const int *targets,
                                float dloss, int N, int V);

void cuda_adamw_update(float *params, const float *grads, float *m, float *v, size_t n,
                       const adamw_config *cfg, int step);

void cuda_vec_zero(float *x, size_t n);
void cuda_vec_copy(float *dst, const float *src, size_t n);
void cuda_vec_add(float *y, const float *x, size_t n);
void cuda_residual_forward(float *out, const float *a, const float *b, size_t n);
void cuda_vec_scale(float *x, float alpha, size_t n);
double cuda_vec_sum(const float *x, size_t n);

void cuda_ops_upload(void *device_dst, const void *host_src, size_t bytes);
void cuda_ops_download(void *host_dst, const void *device_src, size_t bytes);
void cuda_ops_synchronize(void);

/* Let cuBLAS use TF32 tensor cores for the fp32 matmuls (--tf32). Process-wide, since
 * the flag is a property of the run; it takes effect at the next matmul of any rank. */
void cuda_set_tf32(int on);
int cuda_tf32_enabled(void);

/* ---- the device layer (gpu/device_cuda.c): device.h's backend functions -------------- */
int cuda_gpu_count(char *why, size_t why_size);   /* 0, with CUDA's reason, when none */
void cuda_select(int gpu);                        /* the calling thread's GPU */
void *cuda_device_malloc(size_t bytes);           /* zero-filled, through the cache */
void cuda_device_free(void *ptr);

/* ---- per-thread CUDA state (gpu/device_cuda.c) ----------------------------------------
 */
/* Valid after device_select(DEVICE_CUDA, i) on this thread; exits with a message
 * otherwise. Declared with the struct tags behind cudaStream_t and cublasHandle_t so
 * that this header needs no CUDA includes. */
struct CUstream_st;
struct cublasContext;
struct CUstream_st *cuda_thread_stream(void);
struct cublasContext *cuda_thread_cublas(void);
int cuda_thread_gpu(void);   /* the GPU index this thread selected */
/* The GPU's marketing name ("NVIDIA H200"), for run headers; "?" when unknown. */
void cuda_device_name(int gpu, char *out, size_t size);
/* Device scratch of at least `bytes` for this thread's ops, reused between calls (the
 * stream orders the uses). Growing it waits for the stream first. Not counted by the
 * memory accounting: it is the kernels' working space, not a model buffer. */
void *cuda_thread_scratch(size_t bytes);
/* A second such scratch, the 16-bit ops' (ops_cuda_mixed.cu): their fp32 widenings,
 * alive while the fp32 op they wrap uses the first. */
void *cuda_thread_mixed_scratch(size_t bytes);

#ifdef __cplusplus
}
#endif
#endif
