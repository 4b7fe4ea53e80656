/* The public ops.h functions: each runs the GPU backend's version when this thread
 * computes on a GPU (device_ops() is its table) and the CPU version otherwise. The
 * choice is made per call because the device is per thread (= per rank); on the CPU it
 * costs one call and a branch, and the CPU op is called directly. An observer, when
 * this thread has one, sees each op begin and end (ops_observe.c). */
#include "ops.h"

#include "device.h"
#include "ops_cpu.h"

/* Floats to bytes, for the traffic each op reports. */
#define F32(n) (4.0 * (double)(n))

/* bytes: what the op reads and writes at least, evaluated only while watched. */
#define DISPATCH(kind, bytes, name, ...)                     \
    do {                                                     \
        const int watched_ = ops_watched();                  \
        if (watched_) ops_watch_begin(kind, bytes);              \
        const ops_table *gpu_ops_ = device_ops();            \
        if (gpu_ops_) gpu_ops_->name(__VA_ARGS__);           \
        else cpu_##name(__VA_ARGS__);                        \
        if (watched_) ops_watch_end(kind);                       \
    } while (0)

void embedding_forward(float *out, const int *tokens, const float *wte, int N, int C,
                       int vocab_start, int vocab_len) {
    DISPATCH(OP_EMBEDDING, F32(2.0 * N * C), embedding_forward,
             out, tokens, wte, N, C, vocab_start, vocab_len);
}

void embedding_backward(float *dwte, const float *dout, const int *tokens, int N,
                        int C, int vocab_start, int vocab_len) {
    DISPATCH(OP_EMBEDDING, F32(3.0 * N * C), embedding_backward,
             dwte, dout, tokens, N, C, vocab_start, vocab_len);
}

void position_forward(float *out, const float *wpe, int B, int T, int C) {
    DISPATCH(OP_EMBEDDING, F32(2.0 * B * T * C), position_forward, out, wpe, B, T, C);
}

void position_backward(float *dwpe, const float *dout, int B, int T, int C) {
    DISPATCH(OP_EMBEDDING, F32((double)B * T * C), position_backward, dwpe, dout, B, T, C);
}

void layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                       const float *weight, const float *bias, int N, int C) {
    DISPATCH(OP_LAYERNORM, F32(2.0 * N * C), layernorm_forward,
             out, mean, rstd, inp, weight, bias, N, C);
}

void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, const float *mean,
                        const float *rstd, int N, int C) {
    DISPATCH(OP_LAYERNORM, F32(4.0 * N * C), layernorm_backward,
             dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}

void linear_forward(float *out, const float *inp, const float *weight,
                    const float *bias, int N, int IC, int OC) {
    DISPATCH(OP_LINEAR_FORWARD, F32((double)N * IC + (double)N * OC + (double)OC * IC),
             linear_forward, out, inp, weight, bias, N, IC, OC);
}

void linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                     const float *inp, const float *weight, int N, int IC, int OC) {
    DISPATCH(OP_LINEAR_BACKWARD, F32(2.0 * N * OC + 2.0 * N * IC + 2.0 * OC * IC),
             linear_backward, dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
}

void attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                       int NH) {
    DISPATCH(OP_ATTENTION_FORWARD, F32(4.0 * B * T * C + (double)B * NH * T * T),
             attention_forward, out, att, qkv, B, T, C, NH);
}

void attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                        const float *att, int B, int T, int C, int NH) {
    DISPATCH(OP_ATTENTION_BACKWARD, F32(7.0 * B * T * C + 2.0 * B * NH * T * T),
             attention_backward, dqkv, datt, dout, qkv, att, B, T, C, NH);
}

void gelu_forward(float *out, float *x, size_t n) {
    DISPATCH(OP_GELU, F32(3.0 * n), gelu_forward, out, x, n);
}

void gelu_backward(float *dinp, const float *dgelu, const float *dout, size_t n) {
    DISPATCH(OP_GELU, F32(3.0 * n), gelu_backward, dinp, dgelu, dout, n);
}

void crossentropy_forward(float *losses, float *probs, const float *logits,
                          const int *targets, int N, int V) {
    DISPATCH(OP_CROSSENTROPY, F32(2.0 * N * V), crossentropy_forward,
             losses, probs, logits, targets, N, V);
}

void crossentropy_backward(float *dlogits, const float *probs, const int *targets,
                           float dloss, int N, int V) {
    DISPATCH(OP_CROSSENTROPY, F32(2.0 * N * V), crossentropy_backward,
             dlogits, probs, targets, dloss, N, V);
}

adamw_config adamw_scheduled(const adamw_config *cfg, int step) {
    adamw_config scheduled = *cfg;
    if (step < cfg->warmup_steps) scheduled.lr = cfg->lr * (float)step / (float)cfg->warmup_steps;
    return scheduled;
}

void adamw_update(float *params, const float *grads, float *m, float *v, size_t n,
                  const adamw_config *cfg, int step) {
    const adamw_config scheduled = adamw_scheduled(cfg, step);
    DISPATCH(OP_ADAMW, F32(7.0 * n), adamw_update, params, grads, m, v, n, &scheduled, step);
}

void vec_zero(float *x, size_t n) {
    DISPATCH(OP_VECTOR, F32(n), vec_zero, x, n);
}

void vec_copy(float *dst, const float *src, size_t n) {
    DISPATCH(OP_VECTOR, F32(2.0 * n), vec_copy, dst, src, n);
}

void vec_add(float *y, const float *x, size_t n) {
    DISPATCH(OP_RESIDUAL, F32(3.0 * n), vec_add, y, x, n);
}

void residual_forward(float *out, const float *a, const float *b, size_t n) {
    DISPATCH(OP_RESIDUAL, F32(3.0 * n), residual_forward, out, a, b, n);
}

void vec_scale(float *x, float alpha, size_t n) {
    DISPATCH(OP_VECTOR, F32(2.0 * n), vec_scale, x, alpha, n);
}

double vec_sum(const float *x, size_t n) {
    const int watched = ops_watched();
    if (watched) ops_watch_begin(OP_VECTOR, F32(n));
    const ops_table *gpu_ops = device_ops();
    double sum = gpu_ops ? gpu_ops->vec_sum(x, n) : cpu_vec_sum(x, n);
    if (watched) ops_watch_end(OP_VECTOR);
    return sum;
}

void ops_upload(void *device_dst, const void *host_src, size_t bytes) {
    DISPATCH(OP_TRANSFER, (double)bytes, ops_upload, device_dst, host_src, bytes);
}

void ops_download(void *host_dst, const void *device_src, size_t bytes) {
    DISPATCH(OP_TRANSFER, (double)bytes, ops_download, host_dst, device_src, bytes);
}

void ops_synchronize(void) {
    const ops_table *gpu_ops = device_ops();
    if (gpu_ops) gpu_ops->ops_synchronize();
    else cpu_ops_synchronize();
}
