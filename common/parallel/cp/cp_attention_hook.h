/* The CP group's attention as the model's attention core (gpt_attention_hook, model.h):
 * with it and the rank's span of positions (gpt_model_options.positions) the one model
 * trains on a chunk of every sequence. Everything else in a block is per token, so the
 * model's own ops run it on the chunk's rows; attention alone talks to the other chunks
 * (cp_attention.h).
 *
 * One cp_attention serves the layers one after the other; what each layer's backward
 * needs (the ring's log-sum-exp, or Ulysses' head-sharded Q, K, V, output and
 * probabilities) is kept here, one buffer per micro-batch slot and layer, allocated at
 * its first forward and tagged as activations, so a pipeline stage can hold several
 * micro-batches in flight.
 *
 * In bf16 and fp16 the model's 16-bit q, k, v are widened (exactly) to fp32, the
 * attention computes in fp32 (scores, online softmax, sums: what the 16-bit attention
 * op does, ops_mixed.h) and its output and d qkv are rounded once to 16 bits. The K/V
 * blocks and all-to-alls travel in 16 bits (cp_options.wire, which parallelize sets to
 * the model's precision): the same bits for half the bytes; dK/dV stay fp32. */
#ifndef CP_ATTENTION_HOOK_H
#define CP_ATTENTION_HOOK_H
#include "cp_attention.h"
#include "model.h"

typedef struct cp_attention_hook cp_attention_hook;

/* For `layers` blocks; attention is the caller's and outlives the hook. */
cp_attention_hook *cp_attention_hook_create(cp_attention *attention, int layers);
void cp_attention_hook_free(cp_attention_hook *h);
/* What gpt_model_options.attention points to, for as long as h lives. */
const gpt_attention_hook *cp_attention_hook_of(const cp_attention_hook *h);

#endif
