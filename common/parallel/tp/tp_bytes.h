/* Tensor parallelism's textbook bytes per rank per step (ring all-reduce; chapter 3). */
#ifndef TP_BYTES_H
#define TP_BYTES_H
#include <stddef.h>

#include "model.h"
#include "precision.h"

/* The textbook bytes each rank sends per step (ring all-reduce): activations in p
 * (2 B per element in 16 bits), the vocab-parallel loss's numbers and the data-parallel
 * gradients in fp32. */
double tp_bytes_formula(const gpt_config *m, precision p, int B_local, int T, int tp, int dp,
                        size_t params_per_rank);
/* Sequence parallelism's bytes: TP's (every all-reduce of activations becomes a
 * reduce-scatter and an all-gather, (t-1)/t of the bytes each) plus what SP adds: the
 * column-parallel layers' inputs gathered again in backward (2 per block), the
 * LayerNorms' weight gradients summed over tp (2 per block and the final one, 2 C
 * fp32 each); the vocab-parallel embedding's and head's all-reduces become a
 * reduce-scatter and an all-gather as the blocks' do. Activations in p. */
double tp_sequence_bytes_formula(const gpt_config *m, precision p, int B_local, int T, int tp,
                                 int dp, size_t params_per_rank);
/* What SP adds to TP's bytes alone: the inputs gathered again, the LayerNorm
 * gradients' all-reduces, and both together. */
double tp_sequence_bytes_gathered_again(const gpt_config *m, precision p, int B_local, int T,
                                        int tp);
double tp_sequence_bytes_layernorm_grads(const gpt_config *m, int tp);
double tp_sequence_bytes_added(const gpt_config *m, precision p, int B_local, int T, int tp);
/* The same for one pipeline stage of `layers` blocks (final_ln: it holds the final
 * LayerNorm) and one backward of `tokens` rows: what each micro-batch adds. */
double tp_sequence_stage_bytes_added(const gpt_config *m, precision p, double tokens,
                                     int layers, int final_ln, int tp);
/* Full recomputation runs each block's forward again in backward, and its collectives
 * with it: 2 all-reduces of activations per block (with SP: 2 all-gathers and 2
 * reduce-scatters, the same bytes). */
double tp_recompute_bytes(const gpt_config *m, precision p, int B_local, int T, int tp);

#endif
