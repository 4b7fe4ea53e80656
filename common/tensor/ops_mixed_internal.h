/* What the 16-bit ops' files share (ops_mixed.c, ops_mixed_optimizer.c): the calling
 * thread's scratch and the begin and end of an op. Not for callers of ops_mixed.h. */
#ifndef OPS_MIXED_INTERNAL_H
#define OPS_MIXED_INTERNAL_H
#include <stddef.h>

#include "ops_observe.h"

/* Floats per widened array in a chunk of rows (64 KiB: a chunk's arrays stay in L2). */
#define MIXED_CHUNK_FLOATS 16384

/* The calling thread's scratch, at least n floats (64-byte aligned); its contents are
 * not kept between ops. */
float *mixed_scratch(size_t n);
/* A 16-bit op begins: refused on a GPU thread, told to the watchers (bytes: its
 * traffic). Returns whether the thread is watched, for mixed_end. */
int mixed_begin(const char *op, op_kind kind, double bytes);
void mixed_end(int watched, op_kind kind);

#endif
