/* The gradient an optimizer step reads, as the training loop's loss scale sees it: an
 * fp32 vector, or one held in 16 bits (--grad-dtype, grads16.h). A 16-bit one is never
 * widened whole: the check reads it a chunk at a time, and fp16's unscale is not applied
 * to it but handed to its update (`unscale`), which multiplies each widened chunk by it
 * (mixed_adamw_update): the products an fp32 copy unscaled in place would hold. */
#ifndef GRAD_VECTOR_H
#define GRAD_VECTOR_H
#include <stddef.h>

#include "precision.h"

typedef struct {
    void *data;            /* on the current device */
    size_t length;
    precision precision;   /* fp32, or the 16 bits of --grad-dtype */
    float *unscale;        /* 16-bit: the factor its owner's update applies; else NULL */
} grad_vector;

grad_vector grad_vector_fp32(float *data, size_t length);
/* unscale: the owner's factor, 1 until a step sets it; the update puts it back to 1. */
grad_vector grad_vector_16(precision p, void *data, size_t length, float *unscale);

/* Is every element finite (grads_finite's test, on 16 bits a chunk at a time)? */
int grad_vector_finite(const grad_vector *g);
/* g *= factor: in place in fp32; in 16 bits, handed to the update (*unscale = factor). */
void grad_vector_unscale(const grad_vector *g, float factor);
/* The test hook: the first element becomes inf, as an fp16 overflow in backward would
 * make it. */
void grad_vector_overflow_first(const grad_vector *g);

#endif
