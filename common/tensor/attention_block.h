/* Causal attention one block at a time, with an online softmax: the kernels of ring
 * attention (context parallelism, common/parallel/cp/cp_ring_attention.c).
 *
 * A rank holds the queries of some positions of a sequence and sees the keys and values
 * of other positions one block after another. It never holds a whole row of scores, so
 * the softmax is accumulated as blocks arrive (the log-sum-exp trick): per query row a
 * running maximum m and sum l of exp(score - m), and the output rows O as an unnormalised
 * sum of exp(score - m) v. A block with a larger maximum rescales what is there by
 * exp(m_old - m_new). After the last block O /= l, and lse = m + log l is kept for the
 * backward, which recomputes each block's probabilities as exp(score - lse) instead of
 * storing them (what FlashAttention does, and ring attention after it).
 *
 * Which keys a query sees: key position <= query position. A pair of position ranges is
 *   full      every key is at or before every query     (an earlier chunk)
 *   diagonal  the ranges overlap: masked inside          (the chunk itself)
 *   skipped   every key is after every query             (a later chunk)
 *
 * Layout: one head of one sequence; rows of Q, K, V, O, dO, dQ, dK, dV are hs channels
 * with a leading dimension each (the heads sit side by side in a row of qkv). */
#ifndef ATTENTION_BLOCK_H
#define ATTENTION_BLOCK_H
#include <stddef.h>
#include <stdint.h>

/* The positions a rank holds of each sequence: one contiguous range, or two (the
 * balanced split's chunks i and 2P-1-i), stored one after the other in its rows. */
enum { SPAN_MAX_PIECES = 2 };
typedef struct {
    int pieces;
    int start[SPAN_MAX_PIECES], len[SPAN_MAX_PIECES];
} position_span;
int position_span_rows(const position_span *s);   /* rows held: the lengths' sum */
/* The positions of rows [first, first + rows) of s (a sequence-parallel rank's part of
 * a CP chunk): one or two pieces. Needs first + rows <= position_span_rows(s). */
position_span position_span_slice(const position_span *s, int first, int rows);

typedef enum { BLOCK_SKIPPED, BLOCK_FULL, BLOCK_DIAGONAL } block_kind;
block_kind block_kind_of(int q_start, int q_len, int k_start, int k_len);

/* One head's matrices for a pair of position ranges. */
typedef struct {
    const float *q; int ldq;
    const float *k, *v; int ldkv;
    int q_start, q_len, k_start, k_len;   /* positions of the rows */
    int hs;
    float scale;                          /* 1 / sqrt(hs) */
} attention_pair;

/* Forward of one pair: the running state of its q_len rows, O [q_len, hs] (ldo),
 * m and l [q_len], updated. scores: scratch of q_len x k_len. unmasked: the negative
 * control that forgets the diagonal's mask. Returns the score entries computed. */
uint64_t attention_block_forward(const attention_pair *p, float *o, int ldo, float *m,
                                 float *l, float *scores, int unmasked);
/* Ends a row range: O /= l, and lse = m + log l. */
void attention_block_finish(float *o, int ldo, const float *m, const float *l, float *lse,
                            int rows, int hs);
/* D = rowsum(dO * O), the softmax's backward term, per row. */
void attention_block_delta(float *delta, const float *dout, int lddo, const float *o, int ldo,
                           int rows, int hs);

/* Backward of one pair: accumulates dQ [q_len] (lddq), dK and dV [k_len] (lddkv) from
 * dO, the saved lse and delta. scores, dscores: scratch of q_len x k_len each. */
typedef struct {
    const float *dout; int lddo;
    const float *lse, *delta;
    float *dq; int lddq;
    float *dk, *dv; int lddkv;
} attention_pair_grads;
uint64_t attention_block_backward(const attention_pair *p, const attention_pair_grads *g,
                                  float *scores, float *dscores, int unmasked);

#endif
