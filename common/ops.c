/* The public ops.h functions: each runs the GPU backend's version when this thread
 * computes on a GPU (device_ops() is its table) and the CPU version otherwise. The
 * choice is made per call because the device is per thread (= per rank); on the CPU it
 * costs one call and a branch, and the CPU op is called directly. An observer, when
 * this thread has one, sees each op begin and end. */
#include "ops.h"

#include "device.h"
#include "ops_cpu.h"

/* This thread's observer (ops_observe), or NULL. */
static _Thread_local const ops_observer *observer;

void ops_observe(const ops_observer *o) { observer = o; }

int op_is_kernel(op_kind kind) { return kind == OP_LINEAR || kind == OP_ATTENTION; }

#define DISPATCH(kind, name, ...)                            \
    do {                                                     \
        const ops_observer *watch_ = observer;               \
        if (watch_) watch_->begin(watch_->ctx, kind);        \
        const ops_table *gpu_ops_ = device_ops();            \
        if (gpu_ops_) gpu_ops_->name(__VA_ARGS__);           \
        else cpu_##name(__VA_ARGS__);                        \
        if (watch_) watch_->end(watch_->ctx, kind);          \
    } while (0)

void embedding_forward(float *out, const int *tokens, const float *wte, int N, int C,
                       int vocab_start, int vocab_len) {
    DISPATCH(OP_EMBEDDING, embedding_forward, out, tokens, wte, N, C, vocab_start, vocab_len);
}

void embedding_backward(float *dwte, const float *dout, const int *tokens, int N,
                        int C, int vocab_start, int vocab_len) {
    DISPATCH(OP_EMBEDDING, embedding_backward, dwte, dout, tokens, N, C, vocab_start, vocab_len);
}

void position_forward(float *out, const float *wpe, int B, int T, int C) {
    DISPATCH(OP_EMBEDDING, position_forward, out, wpe, B, T, C);
}

void position_backward(float *dwpe, const float *dout, int B, int T, int C) {
    DISPATCH(OP_EMBEDDING, position_backward, dwpe, dout, B, T, C);
}

void layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                       const float *weight, const float *bias, int N, int C) {
    DISPATCH(OP_LAYERNORM, layernorm_forward, out, mean, rstd, inp, weight, bias, N, C);
}

void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, const float *mean,
                        const float *rstd, int N, int C) {
    DISPATCH(OP_LAYERNORM, layernorm_backward, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N,
             C);
}

void linear_forward(float *out, const float *inp, const float *weight,
                    const float *bias, int N, int IC, int OC) {
    DISPATCH(OP_LINEAR, linear_forward, out, inp, weight, bias, N, IC, OC);
}

void linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                     const float *inp, const float *weight, int N, int IC, int OC) {
    DISPATCH(OP_LINEAR, linear_backward, dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
}

void attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                       int NH) {
    DISPATCH(OP_ATTENTION, attention_forward, out, att, qkv, B, T, C, NH);
}

void attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                        const float *att, int B, int T, int C, int NH) {
    DISPATCH(OP_ATTENTION, attention_backward, dqkv, datt, dout, qkv, att, B, T, C, NH);
}

void gelu_forward(float *out, const float *inp, size_t n) {
    DISPATCH(OP_GELU, gelu_forward, out, inp, n);
}

void gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    DISPATCH(OP_GELU, gelu_backward, dinp, inp, dout, n);
}

void crossentropy_forward(float *losses, float *probs, const float *logits,
                          const int *targets, int N, int V) {
    DISPATCH(OP_CROSSENTROPY, crossentropy_forward, losses, probs, logits, targets, N, V);
}

void crossentropy_backward(float *dlogits, const float *probs, const int *targets,
                           float dloss, int N, int V) {
    DISPATCH(OP_CROSSENTROPY, crossentropy_backward, dlogits, probs, targets, dloss, N, V);
}

void adamw_update(float *params, const float *grads, float *m, float *v, size_t n,
                  const adamw_config *cfg, int step) {
    adamw_config scheduled = *cfg;
    if (step < cfg->warmup_steps) scheduled.lr = cfg->lr * (float)step / (float)cfg->warmup_steps;
    DISPATCH(OP_ADAMW, adamw_update, params, grads, m, v, n, &scheduled, step);
}

void vec_zero(float *x, size_t n) {
    DISPATCH(OP_VECTOR, vec_zero, x, n);
}

void vec_copy(float *dst, const float *src, size_t n) {
    DISPATCH(OP_VECTOR, vec_copy, dst, src, n);
}

void vec_add(float *y, const float *x, size_t n) {
    DISPATCH(OP_VECTOR, vec_add, y, x, n);
}

void residual_forward(float *out, const float *a, const float *b, size_t n) {
    DISPATCH(OP_VECTOR, residual_forward, out, a, b, n);
}

void vec_scale(float *x, float alpha, size_t n) {
    DISPATCH(OP_VECTOR, vec_scale, x, alpha, n);
}

double vec_sum(const float *x, size_t n) {
    const ops_observer *watch = observer;
    if (watch) watch->begin(watch->ctx, OP_VECTOR);
    const ops_table *gpu_ops = device_ops();
    double sum = gpu_ops ? gpu_ops->vec_sum(x, n) : cpu_vec_sum(x, n);
    if (watch) watch->end(watch->ctx, OP_VECTOR);
    return sum;
}

void ops_upload(void *device_dst, const void *host_src, size_t bytes) {
    DISPATCH(OP_TRANSFER, ops_upload, device_dst, host_src, bytes);
}

void ops_download(void *host_dst, const void *device_src, size_t bytes) {
    DISPATCH(OP_TRANSFER, ops_download, host_dst, device_src, bytes);
}

void ops_synchronize(void) {
    const ops_table *gpu_ops = device_ops();
    if (gpu_ops) gpu_ops->ops_synchronize();
    else cpu_ops_synchronize();
}
