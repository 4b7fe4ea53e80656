/* Activation bytes per transformer layer per rank for THIS model, re-derived from
 * Korthikanti et al. 2022 (arXiv:2205.05198), sec. 4.1-4.3 and Table 2, so that a run's
 * measured bytes (the allocator's MEM_ACTIVATIONS tag) can be checked to the byte.
 *
 * The paper counts 16-bit activations with dropout, s b h (34 + 5 a s / h):
 *   attention   11 s b h + 5 a s^2 b: QKV input 2, Q and K 4, V 2, softmax output
 *               2 a s^2 b, its dropout mask a s^2 b and output 2 a s^2 b, projection
 *               input 2, dropout mask 1
 *   MLP         19 s b h: fc input 2, GELU input 8, fc2 input 8, dropout mask 1
 *   LayerNorms  4 s b h: the two inputs, 2 each
 * This model has no dropout, keeps elements of e bytes (4 in fp32, 2 in bf16/fp16) and
 * its LayerNorm statistics (mean, 1/std per token, two per LayerNorm) in fp32:
 *   kept per layer                 elements              as in the paper
 *   block input (ln1's input)      s b h                 LayerNorm input
 *   ln1 output (QKV input)         s b h                 QKV input
 *   Q, K, V                        3 s b h / t           Q, K and V
 *   softmax probabilities          a s^2 b / t           softmax output
 *   attention output (proj input)  s b h / t             projection input
 *   x_mid (ln2's input)            s b h                 LayerNorm input
 *   ln2 output (fc input)          s b h                 fc input
 *   fc output (GELU's derivative)  4 s b h / t           GELU input (same size)
 *   GELU output (fc2 input)        4 s b h / t           fc2 input
 *   LayerNorm statistics           4 s b fp32            (the paper leaves them out)
 * Summed, per configuration (bytes; s tokens, b sequences, h channels, a heads, t TP):
 *   none                  e s b h (16 + a s / h)                  + 16 s b
 *   TP                    e s b h (4 + 12/t + a s / (h t))        + 16 s b
 *   TP + SP               e s b h (16 + a s / h) / t              + 16 s b / t
 *   TP + selective        e s b h (4 + 12/t)                      + 16 s b
 *   TP + SP + selective   e s b h 16 / t                          + 16 s b / t
 *   full recomputation    e s b h (the block input alone; / t with SP)
 * Against the paper in 2-byte units: 32 where it has 34 (no dropout masks after the
 * projection and fc2: 2 s b h fewer) and 2 a s / h where it has 5 (no dropout mask of
 * a s^2 b nor dropout output of 2 a s^2 b after the softmax), plus the statistics.
 * The MLP is 4h wide as the paper's, and the heads are split over t as its are. */
#ifndef ACTIVATION_MEMORY_H
#define ACTIVATION_MEMORY_H

#include "model.h"
#include "plan_mesh.h"

/* One configuration of the table: TP size, sequence parallelism, recomputation. */
typedef struct {
    int tp, sp;
    plan_recompute recompute;
} activation_setup;

/* The expression's coefficients: bytes = sbh s b h + as2b a s^2 b + sb s b. */
typedef struct {
    double sbh, as2b, sb;
} activation_terms;

activation_terms activation_terms_of(activation_setup c, precision p);
/* Bytes per layer per rank: B sequences of T tokens of model m (the tp group's batch). */
double activation_bytes_per_layer(const gpt_config *m, int B, precision p, activation_setup c);
/* Korthikanti et al.'s Table 2 for the same setup, in bytes (16-bit, with dropout). */
double activation_bytes_paper(const gpt_config *m, int B, activation_setup c);
/* "sbh(4 + 12/t + as/ht) e + 16sb"-style text of the setup's expression. */
void activation_expression(activation_setup c, char *buf, size_t len);

/* The planner's PLAN_ACTS_THIS_MODEL (plan_mesh.h): the first stage's peak activation
 * bytes on one rank, elements of element_bytes (4 or 2), as the model allocates them
 * (model_instance.c). With r = b s rows of a micro-batch (s / cp with CP) and
 * min(pp, m) micro-batches in flight (1F1B):
 *   per micro-batch   its stage's layers (the table above), the stage's output and
 *                     (pp > 1) the gradient the next stage sends back, e r h each; the
 *                     token ids and targets, 2 r x 4 B; on a one-stage pipeline the head:
 *                     the final LayerNorm's output e r h, its statistics 2 r x 4 B, the
 *                     logits e r V / t and the losses r x 4 B
 *   once              backward's buffers of one layer: the gradients of the block
 *                     output, a LayerNorm's output, the attention output, Q K V, the
 *                     probabilities, the fc output and GELU's: e (2 r h + 12 r h / t +
 *                     a s^2 b / t)
 * With CP (r = b s / cp) each layer keeps its chunk's table without the probabilities
 * and what its attention saves, fp32: ring attention the lse of each query row and head;
 * Ulysses its a / (t cp) heads' Q, K, V and output over the whole sequence and their
 * probabilities, 4 r h / t + b a s^2 / (t cp); the ring's or Ulysses' buffers are
 * counted once (ring_buffers, ulysses_buffers in activation_memory.c), and in 16 bits
 * the hook's fp32 widenings (8 r h / t floats) and the wire's staging of a block sent
 * and one received (cp_16_bit_buffers). With tp > 1,
 * once: on a one-stage pipeline the vocab-parallel loss's 3 r fp32 row numbers (and in
 * 16 bits its fp32 logits, r ceil(V / t) x 4 B), and with SP the layers' shared scratch,
 * 3 e r h and 2 h fp32 (tp_buffers). fp32 or 16-bit, TP with or without SP. */
double plan_this_model_activations(const plan_model *m, const plan_mesh *mesh,
                                   double element_bytes);

#endif
