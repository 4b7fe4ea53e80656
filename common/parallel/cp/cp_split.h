/* How context parallelism splits a sequence of T positions over the P ranks of a CP
 * group, into P or 2P pieces:
 *   contiguous  rank i holds [i T/P, (i+1) T/P): under the causal mask rank P-1 works
 *               P times as much as rank 0 (it sees every earlier chunk)
 *   balanced    rank i holds pieces i and 2P-1-i of T/2P (Megatron-LM's and Llama 3's
 *               load balancing): every rank the same work (the ring only) */
#ifndef CP_SPLIT_H
#define CP_SPLIT_H

#include "attention_block.h"

typedef enum { CP_CONTIGUOUS, CP_BALANCED } cp_split;
const char *cp_split_name(cp_split split);   /* "contiguous", "balanced" */

/* The positions rank `rank` of P holds of every sequence of T. */
position_span cp_span_of(int T, int P, int rank, cp_split split);
/* A rank's rows of B whole sequences: whole [B, T] -> rows [B, rows of span], each
 * sequence's pieces one after the other (tokens or targets alike). */
void cp_span_rows(const position_span *span, int B, int T, const int *whole, int *rows);

#endif
