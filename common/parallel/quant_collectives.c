/* ZeRO++'s qwZ all-gather and qgZ reduce-scatter on the block codecs
 * (quant_collectives.h). The encodings travel as 1-byte elements (COMM_F8E4M3's size;
 * all-gather and all-to-all only copy them). */
#include "quant_collectives.h"

#include <string.h>

size_t quant_shard_bytes(const comm *c, size_t count, quant_wire w) {
    const size_t n = (size_t)comm_size(c), largest = (count + n - 1) / n;
    return quant_encoded_bytes(w.bits, largest, w.block);
}

/* Scratch: a decoded piece's floats first (aligned), then the encodings. */
static size_t piece_bytes(const comm *c, size_t count) {
    const size_t n = (size_t)comm_size(c), largest = (count + n - 1) / n;
    return (largest * sizeof(float) + 63) / 64 * 64;
}

size_t quant_scratch_bytes(const comm *c, size_t count, quant_wire w) {
    return piece_bytes(c, count) + 2 * (size_t)comm_size(c) * quant_shard_bytes(c, count, w);
}

void quant_allgather(comm *c, quant_wire w, const float *shard, float *full, size_t count,
                     void *scratch) {
    const int n = comm_size(c), me = comm_rank(c);
    const size_t E = quant_shard_bytes(c, count, w);
    unsigned char *all = (unsigned char *)scratch + piece_bytes(c, count);   /* [n][E] */
    size_t offset, len = comm_shard(count, n, me, &offset);
    memset(all + (size_t)me * E, 0, E);
    quant_encode(w.bits, w.block, shard, len, all + (size_t)me * E);
    comm_allgather(c, all + (size_t)me * E, all, (size_t)n * E, COMM_F8E4M3);
    for (int r = 0; r < n; r++) {
        len = comm_shard(count, n, r, &offset);
        quant_decode(w.bits, w.block, all + (size_t)r * E, len, full + offset);
    }
}

void quant_reduce_scatter(comm *c, quant_wire w, const float *full, float *shard,
                          size_t count, void *scratch) {
    const int n = comm_size(c), me = comm_rank(c);
    const size_t E = quant_shard_bytes(c, count, w);
    float *piece = scratch;   /* [largest shard] */
    unsigned char *send = (unsigned char *)scratch + piece_bytes(c, count);   /* [n][E] */
    unsigned char *recv = send + (size_t)n * E;                                /* [n][E] */
    size_t offset, len;
    for (int r = 0; r < n; r++) {   /* piece r of my full vector, for rank r */
        len = comm_shard(count, n, r, &offset);
        memset(send + (size_t)r * E, 0, E);
        quant_encode(w.bits, w.block, full + offset, len, send + (size_t)r * E);
    }
    comm_alltoall(c, send, recv, E, COMM_F8E4M3);
    len = comm_shard(count, n, me, &offset);
    memset(shard, 0, len * sizeof *shard);
    for (int r = 0; r < n; r++) {   /* rank order: the same sum on every rank and run */
        quant_decode(w.bits, w.block, recv + (size_t)r * E, len, piece);
        for (size_t i = 0; i < len; i++) shard[i] += piece[i];
    }
}
