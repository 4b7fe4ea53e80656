/* The sizes tensor parallelism needs of a run (checked before any rank starts) and the
 * vocabulary's split over the TP ranks. */
#ifndef TP_SIZES_H
#define TP_SIZES_H
#include <stddef.h>

#include "model.h"
#include "run_config.h"

/* Checks a TP size against the model and the world before any rank starts: heads,
 * dim and world must be multiples of tp, and the global batch of the dp size (tp 0:
 * the world). On failure writes one line (naming the numbers and the sizes that would
 * work) and returns 0. */
int tp_check_sizes(const run_config *cfg, int world, int tp, char *err, size_t err_len);
/* The largest TP size that passes tp_check_sizes on cfg->comm.ranks ranks (1: none). */
int tp_largest_size(const run_config *cfg);

/* Checks --sp against cfg's model and a TP size tp: tp > 1, dividing ctx. On failure
 * writes one line and returns 0. */
int tp_sequence_check(const run_config *cfg, int tp, char *err, size_t err_len);

/* The vocabulary (embedding = tied LM head) is split over the TP ranks when tp > 1, in
 * every precision (in 16 bits the head's softmax widens its logits to fp32). */
void tp_split_vocab(gpt_shape *s, int tp);

#endif
