/* Megatron's vocab-parallel softmax cross-entropy.
 *
 * With the LM head split over the vocabulary, tensor-parallel rank r holds the logits
 * of vocabulary ids [vocab_start, vocab_start + vocab_local) for every token. The loss
 * of a token needs the whole row, loss = log sum_v exp(z_v) - z_target, but not the
 * whole row in one place: it needs three numbers per token, each of which is a sum or
 * a maximum over ranks:
 *
 *   m   = max_v z_v                  local max, all-reduce MAX
 *   s   = sum_v exp(z_v - m)         local sum, all-reduce SUM
 *   z_t = the target's logit         0 on every rank but its owner, all-reduce SUM
 *
 * so a step moves 3 floats per token instead of all-gathering vocab floats per token.
 * (s and z_t travel in one all-reduce of 2N floats.) The gradient of the loss with
 * respect to this rank's logits is softmax - onehot on the slice: no communication.
 *
 * Padding: when tp does not divide the vocabulary the last slices are padded with
 * rows of zeros; their columns are never a target and are left out of the max and the
 * sum (their probability is 0 and so is their gradient).
 *
 * Buffers live on the current device. The per-row work runs on the host (on the CPU
 * device that is the same memory; elsewhere rows are staged through the host). */
#ifndef VOCAB_PARALLEL_H
#define VOCAB_PARALLEL_H
#include <stddef.h>

#include "comm.h"
#include "model.h"

/* One rank's columns of a [N, vocab] logit matrix. */
typedef struct {
    int N;              /* rows: tokens */
    int vocab_local;    /* columns on this rank, padding included (the row stride) */
    int vocab_start;    /* vocabulary id of the first column */
    int vocab_valid;    /* columns that are real ids: min(vocab_local, V - start), >= 0 */
} vocab_slice;

vocab_slice vocab_slice_of(const gpt_shape *s, int N);

/* losses[n] = -log softmax(z[n, :])[targets[n]] over the WHOLE vocabulary, the same on
 * every rank of tp (NULL or size 1: the plain cross-entropy). probs (may equal logits)
 * receives this rank's slice of the softmax, zero in the padding columns. */
void vocab_parallel_crossentropy_forward(comm *tp, float *losses, float *probs,
                                         const float *logits, const int *targets,
                                         vocab_slice vs);
/* dlogits = (probs - onehot(targets)) * dloss on this rank's slice; may equal probs. */
void vocab_parallel_crossentropy_backward(float *dlogits, const float *probs,
                                          const int *targets, float dloss,
                                          vocab_slice vs);

/* The same in the model's precision p: logits, probs and dlogits of p (bf16, fp16;
 * fp32: the two functions above). The logits are widened (exactly) into scratch32
 * [N, vocab_local] fp32, the maxima, sums, softmax and losses are computed in fp32 as
 * above, and the probabilities rounded once to p, as mixed_crossentropy_forward keeps
 * them; backward widens them again, forms softmax - onehot in fp32 and rounds it. On
 * the CPU (16-bit ops are). */
void mixed_vocab_parallel_crossentropy_forward(comm *tp, precision p, float *losses,
                                               void *probs, const void *logits,
                                               const int *targets, vocab_slice vs,
                                               float *scratch32);
void mixed_vocab_parallel_crossentropy_backward(precision p, void *dlogits, const void *probs,
                                                const int *targets, float dloss,
                                                vocab_slice vs, float *scratch32);

/* ---- the pieces, on host memory (rows of vs.vocab_local floats) ---------------------- */
void vp_row_max(float *row_max, const float *logits, vocab_slice vs);
/* probs = exp(z - row_max) on the valid columns, 0 on the padding; row_sum = their sum */
void vp_exp_and_sum(float *probs, float *row_sum, const float *logits,
                    const float *row_max, vocab_slice vs);
/* z[n, targets[n]] when this rank owns the target, else 0 */
void vp_target_logit(float *target_logit, const float *logits, const int *targets,
                     vocab_slice vs);
/* probs /= row_sum; losses = log(row_sum) + row_max - target_logit */
void vp_normalise(float *probs, float *losses, const float *row_max, const float *row_sum,
                  const float *target_logit, vocab_slice vs);
void vp_softmax_minus_onehot(float *dlogits, const float *probs, const int *targets,
                             float dloss, vocab_slice vs);

#endif
