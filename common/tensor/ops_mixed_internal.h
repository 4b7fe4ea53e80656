/* What the 16-bit ops' files share (ops_mixed.c, ops_mixed_layernorm.c,
 * ops_mixed_optimizer.c): the calling thread's scratch and chunks, and the begin and end
 * of an op. Not for callers of ops_mixed.h. */
#ifndef OPS_MIXED_INTERNAL_H
#define OPS_MIXED_INTERNAL_H
#include <stddef.h>

#include "ops_observe.h"

/* Floats per widened array in a chunk of rows (64 KiB: a chunk's arrays stay in L2). */
#define MIXED_CHUNK_FLOATS 16384

/* The calling thread's scratch, at least n floats (64-byte aligned); its contents are
 * not kept between ops. */
float *mixed_scratch(size_t n);
/* Rows of width elements per chunk: as many as MIXED_CHUNK_FLOATS holds, at least one. */
int mixed_chunk_rows(size_t width);
/* A 16-bit op begins: told to the watchers (bytes: its traffic). Returns whether the
 * thread is watched, for mixed_end. */
int mixed_begin(op_kind kind, double bytes);
void mixed_end(int watched, op_kind kind);

/* On a thread that computes on a GPU, the op runs there (device_mixed_ops(), the
 * backend's ops_mixed_table.h), its watch ends and the calling op returns. */
#define MIXED_ON_GPU(watched, kind, name, ...)                       \
    do {                                                             \
        const mixed_ops_table *gpu_mixed_ = device_mixed_ops();      \
        if (gpu_mixed_) {                                            \
            gpu_mixed_->name(__VA_ARGS__);                           \
            mixed_end(watched, kind);                                \
            return;                                                  \
        }                                                            \
    } while (0)

#endif
