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

static void spoil_scale(quant_wire w, void *encoding, size_t len);

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
    spoil_scale(w, all + (size_t)me * E, len);
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

/* ---- qgZ in two hops (quant_collectives.h) ------------------------------------------ */

static size_t hier_piece_floats(size_t count, size_t N) { return ((count + N - 1) / N + 15) / 16 * 16; }

size_t quant_hier_scratch_bytes(const comm *node, const comm *cross, size_t count,
                                quant_wire w) {
    const size_t K = (size_t)comm_size(node), d = (size_t)comm_size(cross), N = K * d;
    const size_t E = quant_encoded_bytes(w.bits, (count + N - 1) / N, w.block);
    return (d + 1) * hier_piece_floats(count, N) * sizeof(float) + 2 * N * E;
}

/* The doubled first scale of an encoding (quant_wire.wrong_scale). */
static void spoil_scale(quant_wire w, void *encoding, size_t len) {
    if (!w.wrong_scale || len == 0) return;
    float scale;
    memcpy(&scale, encoding, sizeof scale);
    scale *= 2;
    memcpy(encoding, &scale, sizeof scale);
}

/* out[len] = the sum of `sources` encodings E bytes apart (`stride` bytes), in order. */
static void decode_sum(quant_wire w, const unsigned char *first, size_t stride, int sources,
                       size_t len, float *piece, float *out) {
    memset(out, 0, len * sizeof *out);
    for (int s = 0; s < sources; s++) {
        quant_decode(w.bits, w.block, first + (size_t)s * stride, len, piece);
        for (size_t i = 0; i < len; i++) out[i] += piece[i];
    }
}

void quant_reduce_scatter_hier(comm *node, comm *cross, quant_wire w, const float *full,
                               float *shard, size_t count, void *scratch) {
    const int K = comm_size(node), d = comm_size(cross), N = K * d;
    const int l = comm_rank(node), j = comm_rank(cross);
    const size_t E = quant_encoded_bytes(w.bits, (count + (size_t)N - 1) / (size_t)N, w.block);
    const size_t floats = hier_piece_floats(count, (size_t)N);
    float *piece = scratch, *partial = piece + floats;   /* [floats], [d][floats] */
    unsigned char *send = (unsigned char *)(partial + (size_t)d * floats);   /* [N][E] */
    unsigned char *recv = send + (size_t)N * E;                               /* [N][E] */
    size_t offset, len;
    /* hop 1: send[l'][j'] = shard j' K + l' of my vector, for local rank l' */
    for (int lp = 0; lp < K; lp++)
        for (int jp = 0; jp < d; jp++) {
            unsigned char *at = send + ((size_t)lp * d + jp) * E;
            len = comm_shard(count, N, jp * K + lp, &offset);
            memset(at, 0, E);
            quant_encode(w.bits, w.block, full + offset, len, at);
        }
    comm_alltoall(node, send, recv, (size_t)d * E, COMM_F8E4M3);
    /* recv[source l][j']: shard j' K + l (my column) from local rank `source` */
    for (int jp = 0; jp < d; jp++) {
        len = comm_shard(count, N, jp * K + l, &offset);
        decode_sum(w, recv + (size_t)jp * E, (size_t)d * E, K, len, piece,
                   partial + (size_t)jp * floats);
    }
    /* hop 2: the partial sums to the nodes that own them */
    for (int jp = 0; jp < d; jp++) {
        len = comm_shard(count, N, jp * K + l, &offset);
        memset(send + (size_t)jp * E, 0, E);
        quant_encode(w.bits, w.block, partial + (size_t)jp * floats, len, send + (size_t)jp * E);
        spoil_scale(w, send + (size_t)jp * E, len);
    }
    comm_alltoall(cross, send, recv, E, COMM_F8E4M3);
    len = comm_shard(count, N, j * K + l, &offset);
    decode_sum(w, recv, E, d, len, piece, shard);
}
