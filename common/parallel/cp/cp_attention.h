/* Context parallelism's one communicating op: causal attention over a sequence whose
 * positions are spread over the ranks of a CP group. Everything else in a block
 * (LayerNorm, the linears, the MLP, the loss) works token by token on a rank's own
 * chunk (cp_attention_hook.h); attention alone needs the other chunks. Two ways:
 *
 *   ring     K/V blocks travel around the group (P-1 sends forward) while each rank
 *            accumulates its queries' attention with an online softmax
 *            (attention_block.h); backward recomputes each block's probabilities from
 *            the saved log-sum-exp and sends dK/dV around the ring back to their owner.
 *   ulysses  (DeepSpeed) an all-to-all turns [s/P tokens, all heads] into [all s tokens,
 *            H/P heads]; plain attention over the whole sequence on those heads; an
 *            all-to-all back. Backward: the same all-to-alls the other way. Needs the
 *            heads to divide by P.
 *
 * How the positions are split over the ranks: cp_split.h.
 *
 * Layout: a rank's rows are its B sequences' chunks, qkv [B, Tc, 3C] (Q, K, V side by
 * side as the model's qkv linear writes them), out [B, Tc, C]; Tc = T / P. */
#ifndef CP_ATTENTION_H
#define CP_ATTENTION_H
#include <stddef.h>
#include <stdint.h>

#include "attention_block.h"
#include "comm.h"
#include "cp_split.h"

#include "cp_attention_kind.h"

const char *cp_attention_name(cp_attention_kind kind);   /* cp_attention_names[kind] */

typedef struct {
    cp_attention_kind kind;
    cp_split split;
    /* What K/V blocks and Ulysses' all-to-alls travel in: the model's precision. In bf16
     * or fp16 they are its 16-bit values widened, exact in 16 bits again, and what
     * Ulysses sends back (output, d qkv) is rounded to 16 bits once as one device's
     * attention rounds it: the same bits for half the bytes. The ring's dK/dV, sums that
     * grow on every hop, stay fp32. */
    precision wire;
    /* negative controls (ring), which the tests show fail the comparison: */
    int test_unmasked_diagonal;   /* the diagonal block without its causal mask */
    int test_stale_kv;            /* backward computes with the previous step's K/V block */
} cp_options;

typedef struct cp_attention cp_attention;
/* For B sequences of T tokens, C channels, NH heads, on the group cp (NULL: one rank). */
cp_attention *cp_attention_create(comm *cp, const cp_options *opts, int B, int T, int C,
                                  int NH);
void cp_attention_free(cp_attention *a);
/* The rows of a rank's chunk, B x Tc, and the channels C of its q, k, v and out. */
size_t cp_attention_rows(const cp_attention *a);
int cp_attention_channels(const cp_attention *a);
/* What one layer's attention keeps for its backward, in floats: the log-sum-exp per
 * query and head (ring), or the head-sharded Q, K, V, output and probabilities (ulysses). */
size_t cp_attention_saved_numel(const cp_attention *a);
void cp_attention_forward(cp_attention *a, float *out, float *saved, const float *qkv);
/* dqkv [B, Tc, 3C] overwritten. */
void cp_attention_backward(cp_attention *a, float *dqkv, const float *dout, const float *qkv,
                           const float *out, const float *saved);
/* Score entries this rank has computed since create, forward and backward alike: its
 * share of the attention's work. Ring: q x k of every block pair it computes (a
 * diagonal pair whole, masked after); Ulysses: the causal triangle T (T+1) / 2 of each of
 * its heads. */
uint64_t cp_attention_work(const cp_attention *a);

/* Bytes one rank sends per layer per step (forward and backward), by the formula, a
 * block being B x Tc x 2C elements:
 *   ring     forward (P-1) K/V blocks; backward (P-1) K/V blocks again (in wire's
 *            precision) and P dK/dV blocks in fp32 (the last hop takes them home)
 *   ulysses  4 all-to-alls each way (Q, K, V, output; dO, dQ, dK, dV), each sending
 *            (P-1)/P of B x Tc x C elements in wire's precision */
double cp_attention_bytes_formula(cp_attention_kind kind, int P, int B, int T, int C,
                                  precision wire);

/* ---- the two implementations (cp_ring_attention.c, cp_ulysses.c) ------------------- */
typedef struct cp_ring cp_ring;
cp_ring *cp_ring_create(comm *cp, const cp_options *opts, int B, int T, int C, int NH);
void cp_ring_free(cp_ring *r);
void cp_ring_forward(cp_ring *r, float *out, float *lse, const float *qkv);
void cp_ring_backward(cp_ring *r, float *dqkv, const float *dout, const float *qkv,
                      const float *out, const float *lse);
uint64_t cp_ring_work(const cp_ring *r);
int cp_ring_size(const cp_ring *r);   /* P */

typedef struct cp_ulysses cp_ulysses;
cp_ulysses *cp_ulysses_create(comm *cp, int B, int T, int C, int NH, precision wire);
void cp_ulysses_free(cp_ulysses *u);
size_t cp_ulysses_saved_numel(const cp_ulysses *u);
void cp_ulysses_forward(cp_ulysses *u, float *out, float *saved, const float *qkv);
void cp_ulysses_backward(cp_ulysses *u, float *dqkv, const float *dout, const float *saved);
uint64_t cp_ulysses_work(const cp_ulysses *u);

#endif
