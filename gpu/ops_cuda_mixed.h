/* The 16-bit ops on the GPU (gpu/ops_cuda_mixed.cu): ops_mixed_table.h's functions,
 * which gpu/backend.c puts into the backend's table. Each has the signature and the
 * semantics of its mixed_<name> twin in ops_mixed.h; pointers are device memory of the
 * calling thread's GPU, work is queued on its stream (vec_finite waits for its answer). */
#ifndef OPS_CUDA_MIXED_H
#define OPS_CUDA_MIXED_H
#include <stddef.h>

#include "adamw_config.h"
#include "precision.h"

#ifdef __cplusplus
extern "C" {
#endif

void cuda_mixed_round(precision p, void *dst, const float *src, size_t n);
void cuda_mixed_widen(precision p, float *dst, const void *src, size_t n);
void cuda_mixed_embedding_forward(precision p, void *out, const int *tokens,
                                  const void *wte, int N, int C, int vocab_start,
                                  int vocab_len);
void cuda_mixed_embedding_backward(precision p, float *dwte, const void *dout,
                                   const int *tokens, int N, int C, int vocab_start,
                                   int vocab_len);
void cuda_mixed_position_forward(precision p, void *out, const void *wpe, int B, int T,
                                 int C);
void cuda_mixed_position_backward(precision p, float *dwpe, const void *dout, int B, int T,
                                  int C);
void cuda_mixed_layernorm_forward(precision p, void *out, float *mean, float *rstd,
                                  const void *inp, const void *weight, const void *bias,
                                  int N, int C);
void cuda_mixed_layernorm_backward(precision p, void *dinp, float *dweight, float *dbias,
                                   const void *dout, const void *inp, const void *weight,
                                   const float *mean, const float *rstd, int N, int C);
void cuda_mixed_linear_forward(precision p, void *out, const void *inp, const void *weight,
                               const void *bias, int N, int IC, int OC);
void cuda_mixed_linear_backward(precision p, void *dinp, float *dweight, float *dbias,
                                const void *dout, const void *inp, const void *weight,
                                int N, int IC, int OC);
void cuda_mixed_attention_forward(precision p, void *out, void *att, const void *qkv,
                                  int B, int T, int C, int NH);
void cuda_mixed_attention_backward(precision p, void *dqkv, void *datt, const void *dout,
                                   const void *qkv, const void *att, int B, int T, int C,
                                   int NH);
void cuda_mixed_gelu_forward(precision p, void *out, void *x, size_t n);
void cuda_mixed_gelu_backward(precision p, void *dinp, const void *dgelu, const void *dout,
                              size_t n);
void cuda_mixed_crossentropy_forward(precision p, float *losses, void *probs,
                                     const void *logits, const int *targets, int N, int V);
void cuda_mixed_crossentropy_backward(precision p, void *dlogits, const void *probs,
                                      const int *targets, float dloss, int N, int V);
void cuda_mixed_vec_zero(precision p, void *x, size_t n);
void cuda_mixed_vec_copy(precision p, void *dst, const void *src, size_t n);
void cuda_mixed_vec_add(precision p, void *y, const void *x, size_t n);
int cuda_mixed_vec_finite(precision p, const void *x, size_t n);
/* cfg: the learning rate already scheduled (ops_mixed_table.h) */
void cuda_mixed_adamw_update(precision p, float *params, const void *grads,
                             float grad_scale, float *m, float *v, size_t n,
                             const adamw_config *cfg, int step);
void cuda_mixed_round_in_place(precision p, float *x, size_t n);

#ifdef __cplusplus
}
#endif
#endif
