/* The whole model (fp32, one stage; Megatron's TP inside the blocks when given a TP
 * group) on one rank's chunk of every sequence, for context parallelism: B sequences,
 * the positions of a position_span each (Tc rows).
 *
 * Everything but attention is per token, so it runs on the chunk alone with the
 * model's own ops: the embedding adds each row's own position (the span's start, not 0),
 * LayerNorms, linears, the MLP and the loss see only their rows. Attention is
 * cp_attention's, which talks to the other chunks. Parameters and gradients are the
 * shape's vectors (gpt_shape's slabs), every CP rank a full replica of its TP slice:
 * each rank's gradients are its chunk's share, summed over the CP group (and DP) by the
 * caller.
 *
 * Activations are tagged (MEM_ACTIVATIONS): per layer the block's inputs, LayerNorm
 * outputs and statistics, qkv, the attention output, what attention saved, the MLP's
 * hidden units; no layer holds a T x T matrix here but Ulysses' (its heads only). */
#ifndef CP_MODEL_H
#define CP_MODEL_H
#include "cp_attention.h"
#include "model.h"

typedef struct cp_model cp_model;

/* shape: the whole model, or with tp its TP slice (heads and MLP units split, the
 * vocabulary not: every TP rank embeds and scores the whole of it); attention: the CP
 * group's over this rank's heads, shared by the layers one after the other. */
cp_model *cp_model_create(const gpt_shape *shape, int B, position_span span,
                          cp_attention *attention, comm *tp);
void cp_model_free(cp_model *m);
/* Takes this rank's rows of a batch of B whole sequences (tokens, targets: B x T). */
void cp_model_set_batch(cp_model *m, const int *tokens, const int *targets);
/* Forward over the chunk; returns the SUM of its tokens' losses (the caller divides by
 * the global batch's tokens: every token weighs the same whatever chunk it is in). */
double cp_model_forward(cp_model *m, const float *params);
/* Accumulates this chunk's gradients into grads; dloss: d(objective)/d(one token's loss). */
void cp_model_backward(cp_model *m, const float *params, float *grads, float dloss);

#endif
