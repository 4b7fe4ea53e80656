/* The numerical ops of the model, forward and backward, on the current device.
 *
 * Layout: row-major; B batch, T time, C channels, V vocabulary, NH heads, N = B*T
 * rows. Pointers point to memory of the current device (host memory on the CPU).
 *
 * Conventions, so that backward passes compose without extra copies:
 *   - forward outputs are overwritten;
 *   - parameter gradients (dweight, dbias, dwte, ...) are ACCUMULATED (+=), so that
 *     micro-batches add up and a tied weight collects both uses;
 *   - input gradients are OVERWRITTEN, except layernorm_backward's dinp, which is
 *     accumulated because it always meets a residual stream;
 *   - inputs are read only, except gelu_forward's, which it replaces by the derivative
 *     that gelu_backward needs.
 *
 * The CPU implementation is ops_cpu.c (OpenBLAS for matmuls). A GPU backend hands ops.c
 * an ops_table of its own versions (end of this file); ops.c calls it on threads that
 * compute on that GPU. */
#ifndef OPS_H
#define OPS_H
#include <stddef.h>

#include "adamw_config.h"
#include "ops_observe.h"

/* ---- embeddings ---------------------------------------------------------------- */
/* out[n,:] = wte[tokens[n]-vocab_start, :] when the token lies in
 * [vocab_start, vocab_start+vocab_len), else 0. With the whole vocabulary this is the
 * plain embedding; with a slice it is one rank's part of a vocab-parallel embedding. */
void embedding_forward(float *out, const int *tokens, const float *wte, int N, int C,
                       int vocab_start, int vocab_len);
void embedding_backward(float *dwte, const float *dout, const int *tokens, int N, int C,
                        int vocab_start, int vocab_len);
/* out[b,t,:] += wpe[t,:]  and  dwpe[t,:] += sum_b dout[b,t,:] */
void position_forward(float *out, const float *wpe, int B, int T, int C);
void position_backward(float *dwpe, const float *dout, int B, int T, int C);

/* ---- layer norm (eps 1e-5) ------------------------------------------------------- */
void layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                       const float *weight, const float *bias, int N, int C);
/* dinp += ..., dweight += ..., dbias += ... */
void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, const float *mean,
                        const float *rstd, int N, int C);

/* ---- linear: out[N,OC] = inp[N,IC] @ weight[OC,IC]^T + bias[OC] ------------------- */
/* bias may be NULL. */
void linear_forward(float *out, const float *inp, const float *weight, const float *bias,
                    int N, int IC, int OC);
/* dinp = dout @ weight; dweight += dout^T @ inp; dbias += column sums of dout. Each
 * is skipped when its pointer is NULL (a pipeline's zero-bubble schedule computes
 * d(input) first and the weight gradients later). */
void linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                     const float *inp, const float *weight, int N, int IC, int OC);

/* ---- causal multi-head self-attention ------------------------------------------- */
/* qkv[B,T,3C] holds Q (columns 0..C), K (C..2C) and V (2C..3C); each is NH heads of
 * C/NH channels. out[B,T,C]; att[B,NH,T,T] keeps the softmax probabilities (upper
 * triangle zero) for the backward pass. Scale 1/sqrt(C/NH). */
void attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                       int NH);
/* dqkv overwritten; datt is scratch of the size of att. */
void attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                        const float *att, int B, int T, int C, int NH);

/* ---- GELU, tanh form --------------------------------------------------------------- */
/* out = gelu(x), and x is overwritten by gelu'(x): the backward needs nothing else, and
 * the derivative shares the forward's exponential, so the backward is one multiply
 * where it would be a second exponential. out and x must not overlap. */
void gelu_forward(float *out, float *x, size_t n);
/* dinp = dgelu * dout, dgelu being what gelu_forward left in place of its input. */
void gelu_backward(float *dinp, const float *dgelu, const float *dout, size_t n);

/* ---- softmax cross-entropy ----------------------------------------------------------- */
/* probs = softmax(logits) row by row (probs may equal logits: in place);
 * losses[n] = -log probs[n, targets[n]]. */
void crossentropy_forward(float *losses, float *probs, const float *logits,
                          const int *targets, int N, int V);
/* dlogits = (probs - onehot(targets)) * dloss; dlogits may equal probs. */
void crossentropy_backward(float *dlogits, const float *probs, const int *targets,
                           float dloss, int N, int V);

/* ---- AdamW: decoupled weight decay, bias correction; step counts from 1 ---------- */
void adamw_update(float *params, const float *grads, float *m, float *v, size_t n,
                  const adamw_config *cfg, int step);
/* cfg with the learning rate of this step (the warm-up's ramp), as adamw_update uses it. */
adamw_config adamw_scheduled(const adamw_config *cfg, int step);

/* ---- vectors ------------------------------------------------------------------------- */
void vec_zero(float *x, size_t n);
void vec_copy(float *dst, const float *src, size_t n);
void vec_add(float *y, const float *x, size_t n);          /* y += x */
/* Residual connection: out = a + b. Its backward passes dout to both branches
 * unchanged (vec_copy / vec_add). */
void residual_forward(float *out, const float *a, const float *b, size_t n);
void vec_scale(float *x, float alpha, size_t n);           /* x *= alpha */
double vec_sum(const float *x, size_t n);                  /* on the host, in double */

/* ---- moving data between the host and the current device ----------------------- */
void ops_upload(void *device_dst, const void *host_src, size_t bytes);
void ops_download(void *host_dst, const void *device_src, size_t bytes);
void ops_synchronize(void);   /* wait for queued device work (no-op on the CPU) */

/* ---- what a GPU backend provides: every op above, same signature and semantics -------
 * (adamw_update receives the learning rate already scheduled: step counted from 1.) */
typedef struct ops_table {
    void (*embedding_forward)(float *out, const int *tokens, const float *wte, int N, int C,
                              int vocab_start, int vocab_len);
    void (*embedding_backward)(float *dwte, const float *dout, const int *tokens, int N,
                               int C, int vocab_start, int vocab_len);
    void (*position_forward)(float *out, const float *wpe, int B, int T, int C);
    void (*position_backward)(float *dwpe, const float *dout, int B, int T, int C);
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp,
                              const float *weight, const float *bias, int N, int C);
    void (*layernorm_backward)(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, const float *mean,
                               const float *rstd, int N, int C);
    void (*linear_forward)(float *out, const float *inp, const float *weight,
                           const float *bias, int N, int IC, int OC);
    void (*linear_backward)(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int N, int IC, int OC);
    void (*attention_forward)(float *out, float *att, const float *qkv, int B, int T, int C,
                              int NH);
    void (*attention_backward)(float *dqkv, float *datt, const float *dout,
                               const float *qkv, const float *att, int B, int T, int C,
                               int NH);
    void (*gelu_forward)(float *out, float *x, size_t n);
    void (*gelu_backward)(float *dinp, const float *dgelu, const float *dout, size_t n);
    void (*crossentropy_forward)(float *losses, float *probs, const float *logits,
                                 const int *targets, int N, int V);
    void (*crossentropy_backward)(float *dlogits, const float *probs, const int *targets,
                                  float dloss, int N, int V);
    void (*adamw_update)(float *params, const float *grads, float *m, float *v, size_t n,
                         const adamw_config *cfg, int step);
    void (*vec_zero)(float *x, size_t n);
    void (*vec_copy)(float *dst, const float *src, size_t n);
    void (*vec_add)(float *y, const float *x, size_t n);
    void (*residual_forward)(float *out, const float *a, const float *b, size_t n);
    void (*vec_scale)(float *x, float alpha, size_t n);
    double (*vec_sum)(const float *x, size_t n);
    void (*ops_upload)(void *device_dst, const void *host_src, size_t bytes);
    void (*ops_download)(void *host_dst, const void *device_src, size_t bytes);
    void (*ops_synchronize)(void);
} ops_table;

#endif
