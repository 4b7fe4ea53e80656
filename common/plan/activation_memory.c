/* Activation bytes per layer per rank, re-derived for this model (activation_memory.h). */
#include "activation_memory.h"

#include <stdio.h>

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
