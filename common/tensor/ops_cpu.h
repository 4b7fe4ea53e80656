/* The CPU implementation of ops.h: the same functions with a cpu_ prefix. ops.c calls
 * them when the current device is the CPU; see ops.h for what each one computes. */
#ifndef OPS_CPU_H
#define OPS_CPU_H
#include <stddef.h>

#include "adamw_config.h"

void cpu_embedding_forward(float *out, const int *tokens, const float *wte, int N, int C,
                           int vocab_start, int vocab_len);
void cpu_embedding_backward(float *dwte, const float *dout, const int *tokens, int N,
                            int C, int vocab_start, int vocab_len);
void cpu_position_forward(float *out, const float *wpe, int B, int T, int C);
void cpu_position_backward(float *dwpe, const float *dout, int B, int T, int C);

void cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                           const float *weight, const float *bias, int N, int C);
void cpu_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, const float *mean,
                            const float *rstd, int N, int C);
/* Rows [0, N) of the above (dinp += their gradient), the dbias and dweight terms added
 * in row order to the caller's doubles sum_b and sum_w (C each, or both NULL for none),
 * so that rows fed a chunk at a time sum in the whole op's order. cpu_layernorm_backward
 * sums this way for C <= CPU_LAYERNORM_SUM_MAX_C. */
#define CPU_LAYERNORM_SUM_MAX_C 1024
void cpu_layernorm_backward_rows(float *dinp, const float *dout, const float *inp,
                                 const float *weight, const float *mean, const float *rstd,
                                 int N, int C, double *sum_b, double *sum_w);

void cpu_linear_forward(float *out, const float *inp, const float *weight,
                        const float *bias, int N, int IC, int OC);
void cpu_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                         const float *inp, const float *weight, int N, int IC, int OC);

void cpu_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                           int NH);
void cpu_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                            const float *att, int B, int T, int C, int NH);

void cpu_gelu_forward(float *out, float *x, size_t n);
void cpu_gelu_backward(float *dinp, const float *dgelu, const float *dout, size_t n);

void cpu_crossentropy_forward(float *losses, float *probs, const float *logits,
                              const int *targets, int N, int V);
void cpu_crossentropy_backward(float *dlogits, const float *probs, const int *targets,
                               float dloss, int N, int V);

void cpu_adamw_update(float *params, const float *grads, float *m, float *v, size_t n,
                      const adamw_config *cfg, int step);

void cpu_vec_zero(float *x, size_t n);
void cpu_vec_copy(float *dst, const float *src, size_t n);
void cpu_vec_add(float *y, const float *x, size_t n);
void cpu_residual_forward(float *out, const float *a, const float *b, size_t n);
void cpu_vec_scale(float *x, float alpha, size_t n);
double cpu_vec_sum(const float *x, size_t n);

void cpu_ops_upload(void *device_dst, const void *host_src, size_t bytes);
void cpu_ops_download(void *host_dst, const void *device_src, size_t bytes);
void cpu_ops_synchronize(void);

#endif
