/* Activation bytes per layer per rank, re-derived for this model (activation_memory.h). */
#include "activation_memory.h"

#include <stdio.h>

#include "plan_cp.h"

activation_terms activation_terms_of(activation_setup c, precision p) {
    const double e = (double)precision_bytes(p), t = c.tp;
    const double split = c.sp && c.tp > 1 ? t : 1;   /* SP splits what TP leaves whole */
    const double stats = 4.0 * sizeof(float);       /* mean and 1/std of ln1 and ln2 */
    if (c.recompute == RECOMPUTE_FULL)              /* the block input alone */
        return (activation_terms){.sbh = e / split};
    activation_terms r = {.sbh = e * (4 / split + 12 / t), .sb = stats / split};
    if (c.recompute != RECOMPUTE_SELECTIVE) r.as2b = e / t;   /* the probabilities */
    return r;
}

static double bytes_of(activation_terms r, const gpt_config *m, int B) {
    const double s = m->ctx, b = B, h = m->dim, a = m->heads;
    return r.sbh * s * b * h + r.as2b * a * s * s * b + r.sb * s * b;
}

double activation_bytes_per_layer(const gpt_config *m, int B, precision p, activation_setup c) {
    return bytes_of(activation_terms_of(c, p), m, B);
}

double activation_bytes_paper(const gpt_config *m, int B, activation_setup c) {
    const plan_model pm = {.layers = m->layers, .hidden = m->dim, .heads = m->heads,
                           .vocab = m->vocab, .seq = m->ctx};
    return plan_layer_activations(&pm, B, c.tp, c.sp, c.recompute);
}

void activation_expression(activation_setup c, char *buf, size_t len) {
    const int t = c.tp, split = c.sp && t > 1, probabilities = c.recompute == RECOMPUTE_NONE;
    char over_t[16] = "";
    if (split) snprintf(over_t, sizeof over_t, "/%d", t);
    if (c.recompute == RECOMPUTE_FULL) {
        snprintf(buf, len, "e sbh%s", over_t);
    } else if (split || t == 1) {
        if (probabilities) snprintf(buf, len, "e sbh(16 + as/h)%s + 16sb%s", over_t, over_t);
        else snprintf(buf, len, "16e sbh%s + 16sb%s", over_t, over_t);
    } else {
        char attention[32] = "";
        if (probabilities) snprintf(attention, sizeof attention, " + as/(%dh)", t);
        snprintf(buf, len, "e sbh(4 + 12/%d%s) + 16sb", t, attention);
    }
}

/* The vocabulary rows of a rank's head: ceil(V / t), padded as the vocab-parallel
 * embedding splits it (tp_split_vocab). */
static double vocab_rows(const plan_model *m, int tp) {
    return (double)((m->vocab + tp - 1) / tp);
}

/* Scores of the whole sequence for a rank's heads after Ulysses' all-to-all, a / (t cp)
 * of them: b a s^2 / (t cp) floats. */
static double ulysses_scores(const plan_model *m, const plan_mesh *mesh) {
    const double s = m->seq;
    return (double)mesh->micro_batch * m->heads * s * s / (mesh->tp * plan_cp_size(mesh));
}

/* What a layer's CP attention saves a micro-batch (cp_attention_saved_numel), fp32: ring
 * attention the lse of each query row and head; Ulysses its heads' Q, K, V and output
 * over the whole sequence (4 r h / t) and their probabilities. */
static double cp_saved_per_layer(const plan_model *m, const plan_mesh *mesh, double r) {
    const double t = mesh->tp, f32 = sizeof(float);
    if (plan_cp_size(mesh) == 1) return 0;
    if (mesh->cp_attention == CP_ULYSSES)
        return f32 * (4 * r * m->hidden / t + ulysses_scores(m, mesh));
    return f32 * r * m->heads / t;
}

/* The layers' table, the per-micro-batch buffers and the head of one micro-batch, on
 * r rows (b s / cp). With CP the chunk's table without the probabilities, and what the
 * CP attention saves. */
static double per_micro_batch(const plan_model *m, const plan_mesh *mesh, double e, double r) {
    const double h = m->hidden, t = mesh->tp, cp = plan_cp_size(mesh);
    const double rows_held = mesh->sequence_parallel && t > 1 ? r / t : r;
    const gpt_config c = {.layers = m->layers, .dim = m->hidden, .heads = m->heads,
                          .vocab = m->vocab, .ctx = (int)(m->seq / cp)};
    activation_setup setup = {mesh->tp, mesh->sequence_parallel, mesh->recompute};
    if (cp > 1 && setup.recompute == RECOMPUTE_NONE) setup.recompute = RECOMPUTE_SELECTIVE;
    const precision p = e == 4 ? PRECISION_FP32 : PRECISION_BF16;
    double bytes = plan_layers_per_stage(m, mesh->pp) *
                   (activation_bytes_per_layer(&c, mesh->micro_batch, p, setup) +
                    cp_saved_per_layer(m, mesh, r));
    bytes += e * rows_held * h * (mesh->pp > 1 ? 2 : 1) + 2 * r * sizeof(int);
    if (mesh->pp == 1)
        bytes += e * r * h + 2 * r * sizeof(float) + e * r * vocab_rows(m, mesh->tp) +
                 r * sizeof(float);
    return bytes;
}

/* What tensor parallelism adds once, on a one-stage pipeline's rank (it holds the head):
 * the vocab-parallel loss's row maxima, sums and target logits (3 r fp32, held while it
 * runs) and in 16 bits its slice of the logits widened to fp32; with SP the layers'
 * shared scratch (tp_sequence_create): the stacked, gathered and partial rows, e r h
 * each, and a LayerNorm's weight and bias gradients, 2 h fp32. */
static double tp_buffers(const plan_model *m, const plan_mesh *mesh, double e, double r) {
    if (mesh->tp == 1) return 0;
    const double f32 = sizeof(float);
    double bytes = 0;
    if (mesh->pp == 1)
        bytes += 3 * r * f32 + (e < f32 ? f32 * r * vocab_rows(m, mesh->tp) : 0);
    if (mesh->sequence_parallel) bytes += 3 * e * r * m->hidden + 2 * m->hidden * f32;
    return bytes;
}

/* Ring attention's buffers, once (cp_ring_create): K/V and dK/dV blocks, each received
 * into a second, of r rows of 2 h / t floats; the running max, sum and delta of every
 * query row; two score tiles of the longest piece, s / cp in chapter 11's contiguous
 * split. */
static double ring_buffers(const plan_model *m, const plan_mesh *mesh, double r) {
    const double t = mesh->tp, f32 = sizeof(float), tile = (double)m->seq / plan_cp_size(mesh);
    return f32 * (4 * r * 2 * m->hidden / t + 3 * r * m->heads / t + 2 * tile * tile);
}

/* Ulysses' buffers, once (cp_ulysses_create): the all-to-all's send and receive staging,
 * a chunk's Q, K, V (r rows of 3 h / t floats) each; backward's output and Q K V
 * gradients for the rank's heads over the whole sequence (4 r h / t) and their
 * probabilities'. */
static double ulysses_buffers(const plan_model *m, const plan_mesh *mesh, double r) {
    const double f32 = sizeof(float), h_t = m->hidden / (double)mesh->tp;
    return f32 * (2 * 3 * r * h_t + 4 * r * h_t + ulysses_scores(m, mesh));
}

/* In 16 bits CP adds, once: the attention hook's fp32 widenings of a chunk's q, k, v and
 * output and of their gradients (8 r h / t floats), and the 16-bit wire's staging, a
 * block sent and one received: the ring's K/V (2 r h / t elements each), Ulysses'
 * all-to-all (3 r h / t). */
static double cp_16_bit_buffers(const plan_model *m, const plan_mesh *mesh, double e,
                                double r) {
    if (e == sizeof(float) || plan_cp_size(mesh) == 1) return 0;
    const double rh = r * m->hidden / mesh->tp;
    const double staged = mesh->cp_attention == CP_ULYSSES ? 3 * rh : 2 * rh;
    return sizeof(float) * 8 * rh + e * 2 * staged;
}

double plan_this_model_activations(const plan_model *m, const plan_mesh *mesh,
                                   double element_bytes) {
    const int cp = plan_cp_size(mesh);
    const double e = element_bytes, t = mesh->tp, h = m->hidden;
    const double r = (double)mesh->micro_batch * m->seq / cp;
    const int in_flight = plan_micro_batches_in_flight(mesh);
    /* the probabilities' gradient: none where CP's attention keeps its own */
    const double d_probabilities = cp > 1 ? 0 : (double)m->heads * m->seq * r / t;
    const double backward = e * (2 * r * h + 12 * r * h / t + d_probabilities);
    const double cp_buffers = cp == 1                            ? 0
                              : mesh->cp_attention == CP_ULYSSES ? ulysses_buffers(m, mesh, r)
                                                                 : ring_buffers(m, mesh, r);
    return in_flight * per_micro_batch(m, mesh, e, r) + backward + cp_buffers +
           cp_16_bit_buffers(m, mesh, e, r) + tp_buffers(m, mesh, e, r);
}
