#include "grad_vector.h"

#include <math.h>
#include <stdint.h>

#include "loss_scale.h"
#include "number_formats.h"
#include "ops.h"
#include "ops_mixed.h"

grad_vector grad_vector_fp32(float *data, size_t length) {
    return (grad_vector){.data = data, .length = length, .precision = PRECISION_FP32};
}

grad_vector grad_vector_16(precision p, void *data, size_t length, float *unscale) {
    return (grad_vector){.data = data, .length = length, .precision = p, .unscale = unscale};
}

int grad_vector_finite(const grad_vector *g) {
    if (g->precision == PRECISION_FP32) return grads_finite(g->data, g->length);
    return mixed_vec_finite(g->precision, g->data, g->length);
}

void grad_vector_unscale(const grad_vector *g, float factor) {
    if (g->precision == PRECISION_FP32) vec_scale(g->data, factor, g->length);
    else *g->unscale = factor;
}

void grad_vector_overflow_first(const grad_vector *g) {
    const float inf = INFINITY;
    if (g->precision == PRECISION_FP32) {
        ops_upload(g->data, &inf, sizeof inf);
        return;
    }
    /* rounded here, then uploaded: the vector may be a GPU's */
    const uint16_t bits =
        g->precision == PRECISION_BF16 ? number_to_bf16(inf) : number_to_f16(inf);
    ops_upload(g->data, &bits, sizeof bits);
}
