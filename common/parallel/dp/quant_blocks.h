/* Block quantisation for ZeRO++'s collectives (Wang et al. 2023, "ZeRO++: Extremely
 * Efficient Collective Communication for Giant Model Training"): qwZ sends weights in
 * int8 and qgZ gradients in int4, each block of `block` consecutive elements with one
 * fp32 scale of its own, so that one large value spoils only its block.
 *
 * Symmetric, round to nearest: scale = max |x| over the block / Q (Q = 127 for int8, 7
 * for int4), q = round(x / scale) in [-Q, Q], x' = q x scale. An element's error is then
 * at most scale / 2 = max |x| / (2 Q) of its block (and 0 in a block of zeros), plus
 * the float rounding of the division and the product: quant_block_bound.
 *
 * Encoded layout of `count` elements: ceil(count / block) fp32 scales, then the codes
 * (int8: one byte each; int4: two a byte, the element of even index in the low
 * nibble, two's complement). The last block may be short. An encoding may start at any
 * byte (the scales are copied, never loaded in place). */
#ifndef QUANT_BLOCKS_H
#define QUANT_BLOCKS_H
#include <stddef.h>

typedef enum { QUANT_INT8, QUANT_INT4 } quant_bits;

/* Q: the largest code, 127 or 7. */
int quant_levels(quant_bits bits);
/* Bytes of the encoded form of count elements: the scales and the codes. */
size_t quant_encoded_bytes(quant_bits bits, size_t count, size_t block);
/* x[count] -> out[quant_encoded_bytes]; block >= 1. */
void quant_encode(quant_bits bits, size_t block, const float *x, size_t count, void *out);
/* in -> x[count], the inverse up to the bound below. */
void quant_decode(quant_bits bits, size_t block, const void *in, size_t count, float *x);
/* The largest |x - x'| an element of a block whose largest |x| is absmax can have. */
double quant_block_bound(quant_bits bits, float absmax);

#endif
