#include "vocab_parallel.h"

#include <math.h>

#include "alloc.h"
#include "device.h"
#include "ops.h"
#include "ops_mixed.h"

vocab_slice vocab_slice_of(const gpt_shape *s, int N) {
    int valid = s->cfg.vocab - s->vocab_start;
    if (valid > s->vocab_local) valid = s->vocab_local;
    if (valid < 0) valid = 0;   /* a rank can hold nothing but padding (V = 5, tp = 4) */
    return (vocab_slice){.N = N, .vocab_local = s->vocab_local,
                         .vocab_start = s->vocab_start, .vocab_valid = valid};
}

/* ---- the pieces ------------------------------------------------------------------ */

void vp_row_max(float *row_max, const float *logits, vocab_slice vs) {
    for (int n = 0; n < vs.N; n++) {
        const float *z = logits + (size_t)n * vs.vocab_local;
        float mx = -INFINITY;   /* the identity of MAX: a rank of padding adds nothing */
        for (int j = 0; j < vs.vocab_valid; j++)
            if (z[j] > mx) mx = z[j];
        row_max[n] = mx;
    }
}

void vp_exp_and_sum(float *probs, float *row_sum, const float *logits,
                    const float *row_max, vocab_slice vs) {
    for (int n = 0; n < vs.N; n++) {
        const float *z = logits + (size_t)n * vs.vocab_local;
        float *p = probs + (size_t)n * vs.vocab_local;
        const double mx = row_max[n];
        double sum = 0.0;
        for (int j = 0; j < vs.vocab_valid; j++) {
            p[j] = (float)exp((double)z[j] - mx);
            sum += p[j];
        }
        for (int j = vs.vocab_valid; j < vs.vocab_local; j++) p[j] = 0.0f;
        row_sum[n] = (float)sum;
    }
}

void vp_target_logit(float *target_logit, const float *logits, const int *targets,
                     vocab_slice vs) {
    for (int n = 0; n < vs.N; n++) {
        int local = targets[n] - vs.vocab_start;
        int owned = local >= 0 && local < vs.vocab_valid;
        target_logit[n] = owned ? logits[(size_t)n * vs.vocab_local + local] : 0.0f;
    }
}

void vp_normalise(float *probs, float *losses, const float *row_max, const float *row_sum,
                  const float *target_logit, vocab_slice vs) {
    for (int n = 0; n < vs.N; n++) {
        float *p = probs + (size_t)n * vs.vocab_local;
        const double inv = 1.0 / row_sum[n];
        for (int j = 0; j < vs.vocab_valid; j++) p[j] = (float)(p[j] * inv);
        /* -log softmax from the logits: exact even where the probability underflows */
        losses[n] = (float)(log((double)row_sum[n]) + (double)row_max[n] -
                            (double)target_logit[n]);
    }
}

void vp_softmax_minus_onehot(float *dlogits, const float *probs, const int *targets,
                             float dloss, vocab_slice vs) {
    for (int n = 0; n < vs.N; n++) {
        const float *p = probs + (size_t)n * vs.vocab_local;
        float *d = dlogits + (size_t)n * vs.vocab_local;
        int local = targets[n] - vs.vocab_start;
        int owned = local >= 0 && local < vs.vocab_valid;
        float p_target = owned ? p[local] : 0.0f;   /* read before an in-place write */
        for (int j = 0; j < vs.vocab_local; j++) d[j] = p[j] * dloss;   /* padding: 0 */
        if (owned) d[local] = (p_target - 1.0f) * dloss;
    }
}

/* ---- device memory --------------------------------------------------------------- */

/* On the CPU device memory is host memory and the pieces work in place. On a GPU the
 * rows are staged through the host: correct, not fast (kernels would be the fix). */
static int staged(void) { return device_current() != DEVICE_CPU; }

static void *host_copy_of(const void *device_src, size_t bytes) {
    void *host = mem_alloc(MEM_ACTIVATIONS, bytes);
    ops_download(host, device_src, bytes);
    return host;
}

/* All-reduces n per-row numbers that live on the host. Every backend takes host
 * buffers from GPU ranks too (NCCL stages them, the threads backend reduces them on
 * the host), so there is nothing to upload. */
static void allreduce_rows(comm *tp, float *host_rows, size_t n, comm_op op) {
    if (!tp || comm_size(tp) == 1) return;
    comm_allreduce(tp, host_rows, n, COMM_F32, op);
}

/* ---- forward and backward ---------------------------------------------------------- */

void vocab_parallel_crossentropy_forward(comm *tp, float *losses, float *probs,
                                         const float *logits, const int *targets,
                                         vocab_slice vs) {
    const size_t N = (size_t)vs.N, cells = N * (size_t)vs.vocab_local;
    const int stage = staged();
    float *z = stage ? host_copy_of(logits, cells * sizeof(float)) : (float *)logits;
    float *p = stage ? z : probs;
    const int *tg = stage ? host_copy_of(targets, N * sizeof(int)) : targets;
    float *loss = stage ? mem_alloc(MEM_ACTIVATIONS, N * sizeof(float)) : losses;
    /* per row: max, then [sum of exp, target logit] side by side for one all-reduce */
    float *rows = mem_alloc(MEM_ACTIVATIONS, 3 * N * sizeof(float));
    float *row_max = rows, *row_sum = rows + N, *target_logit = rows + 2 * N;

    vp_row_max(row_max, z, vs);
    allreduce_rows(tp, row_max, N, COMM_MAX);
    vp_target_logit(target_logit, z, tg, vs);       /* before probs may overwrite z */
    vp_exp_and_sum(p, row_sum, z, row_max, vs);
    allreduce_rows(tp, row_sum, 2 * N, COMM_SUM);   /* sums of exp, and target logits */
    vp_normalise(p, loss, row_max, row_sum, target_logit, vs);

    mem_free(rows);
    if (stage) {
        ops_upload(probs, p, cells * sizeof(float));
        ops_upload(losses, loss, N * sizeof(float));
        mem_free(z);
        mem_free((void *)tg);
        mem_free(loss);
    }
}

void vocab_parallel_crossentropy_backward(float *dlogits, const float *probs,
                                          const int *targets, float dloss,
                                          vocab_slice vs) {
    const size_t N = (size_t)vs.N, cells = N * (size_t)vs.vocab_local;
    if (!staged()) {
        vp_softmax_minus_onehot(dlogits, probs, targets, dloss, vs);
        return;
    }
    float *p = host_copy_of(probs, cells * sizeof(float));
    int *tg = host_copy_of(targets, N * sizeof(int));
    vp_softmax_minus_onehot(p, p, tg, dloss, vs);
    ops_upload(dlogits, p, cells * sizeof(float));
    mem_free(p);
    mem_free(tg);
}

/* ---- in 16 bits --------------------------------------------------------------------- */

void mixed_vocab_parallel_crossentropy_forward(comm *tp, precision p, float *losses,
                                               void *probs, const void *logits,
                                               const int *targets, vocab_slice vs,
                                               float *scratch32) {
    if (p == PRECISION_FP32) {
        vocab_parallel_crossentropy_forward(tp, losses, probs, logits, targets, vs);
        return;
    }
    const size_t cells = (size_t)vs.N * vs.vocab_local;
    mixed_widen(p, scratch32, logits, cells);
    vocab_parallel_crossentropy_forward(tp, losses, scratch32, scratch32, targets, vs);
    mixed_round(p, probs, scratch32, cells);
}

void mixed_vocab_parallel_crossentropy_backward(precision p, void *dlogits, const void *probs,
                                                const int *targets, float dloss,
                                                vocab_slice vs, float *scratch32) {
    if (p == PRECISION_FP32) {
        vocab_parallel_crossentropy_backward(dlogits, probs, targets, dloss, vs);
        return;
    }
    const size_t cells = (size_t)vs.N * vs.vocab_local;
    mixed_widen(p, scratch32, probs, cells);
    vocab_parallel_crossentropy_backward(scratch32, scratch32, targets, dloss, vs);
    mixed_round(p, dlogits, scratch32, cells);
}
