/* What a GPU backend provides for the 16-bit ops of ops_mixed.h: each with exactly the
 * signature and semantics of its mixed_<name> twin, for p = PRECISION_BF16 or
 * PRECISION_FP16 (fp32 never reaches it: ops_mixed.c calls the ops.h twin, which has a
 * table of its own). ops_mixed.c calls it on threads that compute on a GPU, inside the
 * op's watch, so a watcher sees one op per mixed op on either device.
 *
 * The GPU versions mirror the CPU ones (ops_mixed.c): inputs widened to fp32 exactly,
 * the fp32 op run on them, the outputs rounded once (nearest even, number_formats.h);
 * products take the 16-bit values themselves and accumulate in fp32 (cuBLAS). */
#ifndef OPS_MIXED_TABLE_H
#define OPS_MIXED_TABLE_H
#include <stddef.h>

#include "adamw_config.h"
#include "precision.h"

typedef struct mixed_ops_table {
    void (*round)(precision p, void *dst, const float *src, size_t n);
    void (*widen)(precision p, float *dst, const void *src, size_t n);
    void (*embedding_forward)(precision p, void *out, const int *tokens, const void *wte,
                              int N, int C, int vocab_start, int vocab_len);
    void (*embedding_backward)(precision p, float *dwte, const void *dout,
                               const int *tokens, int N, int C, int vocab_start,
                               int vocab_len);
    void (*position_forward)(precision p, void *out, const void *wpe, int B, int T, int C);
    void (*position_backward)(precision p, float *dwpe, const void *dout, int B, int T,
                              int C);
    void (*layernorm_forward)(precision p, void *out, float *mean, float *rstd,
                              const void *inp, const void *weight, const void *bias, int N,
                              int C);
    void (*layernorm_backward)(precision p, void *dinp, float *dweight, float *dbias,
                               const void *dout, const void *inp, const void *weight,
                               const float *mean, const float *rstd, int N, int C);
    void (*linear_forward)(precision p, void *out, const void *inp, const void *weight,
                           const void *bias, int N, int IC, int OC);
    void (*linear_backward)(precision p, void *dinp, float *dweight, float *dbias,
                            const void *dout, const void *inp, const void *weight, int N,
                            int IC, int OC);
    void (*attention_forward)(precision p, void *out, void *att, const void *qkv, int B,
                              int T, int C, int NH);
    void (*attention_backward)(precision p, void *dqkv, void *datt, const void *dout,
                               const void *qkv, const void *att, int B, int T, int C,
                               int NH);
    void (*gelu_forward)(precision p, void *out, void *x, size_t n);
    void (*gelu_backward)(precision p, void *dinp, const void *dgelu, const void *dout,
                          size_t n);
    void (*crossentropy_forward)(precision p, float *losses, void *probs,
                                 const void *logits, const int *targets, int N, int V);
    void (*crossentropy_backward)(precision p, void *dlogits, const void *probs,
                                  const int *targets, float dloss, int N, int V);
    void (*vec_zero)(precision p, void *x, size_t n);
    void (*vec_copy)(precision p, void *dst, const void *src, size_t n);
    void (*vec_add)(precision p, void *y, const void *x, size_t n);
    /* the optimizer's (ops_mixed_optimizer.c); p may be fp32 in adamw_update (a loss
     * scale's grad_scale on fp32 gradients), whose cfg holds the learning rate already
     * scheduled (adamw_scheduled), as ops.h's table receives it */
    int (*vec_finite)(precision p, const void *x, size_t n);
    void (*adamw_update)(precision p, float *params, const void *grads, float grad_scale,
                         float *m, float *v, size_t n, const adamw_config *cfg, int step);
    void (*round_in_place)(precision p, float *x, size_t n);
} mixed_ops_table;

#endif
