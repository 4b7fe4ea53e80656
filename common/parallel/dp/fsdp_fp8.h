/* ZeRO-3's forward all-gather of a block in FP8 (--precision fp8, every recipe;
 * fp8_linear_takes_given_weights): the four linears' weights travel as 1-byte E4M3
 * codes, scaled as one device scales the whole weight (each block's amax over the
 * ranks' shards, all-reduced with MAX, then the recipe's scale; delayed: the scale from
 * the linear's amax history, the same on every rank, which then records the amax), so
 * the gathered codes and scales are exactly what the FP8 baseline
 * computes from the same bf16 weights, and fp8_linear takes them as given. The block's
 * other elements (LayerNorms, biases) travel in bf16, as an all-reduce of a vector in
 * which each rank fills its own. Backward gathers the bf16 weights (fsdp.c): its
 * products stay bf16 (fp8_linear.h).
 *
 * Per block and forward, on a ring of N: the codes' all-gather (a byte an element, the
 * others' bytes unused: S - len(right neighbour) bytes), the amaxes' all-reduce (4 B a
 * scale) and the others' (2 B each). */
#ifndef FSDP_FP8_H
#define FSDP_FP8_H
#include <stdint.h>

#include "dp_grads.h"
#include "fp8_scaling.h"

typedef struct {
    uint8_t *codes;           /* [slab numel], the linears' parts meaningful */
    float *scales;            /* the four weights' scales, one after the other */
    const uint16_t *given[4]; /* the weights handed to fp8_linear */
} fsdp_fp8_block;

/* Whether g's ZeRO-3 gathers take this path (bf16 compute weights, FP8 linears). */
int fsdp_fp8_gathers(const dp_grads *g);
/* Collective over g->group: block slab `slab` into whole[numel] (bf16; the linears'
 * weights there left 0: fp8_linear reads the codes) and b. */
void fsdp_fp8_gather(dp_grads *g, int slab, uint16_t *whole, fsdp_fp8_block *b);
/* Takes the weights back from fp8_linear and frees b (nothing when b holds none). */
void fsdp_fp8_release(fsdp_fp8_block *b);

/* Negative control (tests): the amaxes summed over the ranks, not their max (the same
 * bytes; scales no device would use). */
void fsdp_fp8_test_local_amax(int on);
/* Bytes per step the largest rank sends under this path, exactly as the threads rings
 * move them: out[0] the all-gathers (the blocks' codes in forward, bf16 blocks in
 * backward, the embedding twice and the final LayerNorm once in bf16), out[1] the
 * all-reduces of the blocks' amaxes (fp32) and other elements (bf16). */
void fsdp_fp8_gather_bytes(const gpt_shape *s, fp8_recipe recipe, int N, double out[2]);

#endif
