/* ZeRO++'s quantised collectives on the block codecs (quant_blocks.h):
 *   qwZ  all-gather of each rank's shard of the weights, sent as int8 blocks: every rank
 *        encodes its shard, the encodings are all-gathered, every rank decodes them all;
 *   qgZ  reduce-scatter of the gradients as an all-to-all of int4 blocks: every rank
 *        encodes each destination's piece of its full vector, the pieces cross in one
 *        all-to-all, and each rank decodes the n pieces of its own shard and sums them in
 *        fp32, in rank order (ZeRO++ does this in two hops, inside a node first; here
 *        one). A ring reduce-scatter would decode, add and encode again at every step:
 *        the all-to-all quantises once.
 * Shards are comm_shard's; every rank's encoding takes the bytes of the largest shard's
 * (E = quant_encoded_bytes of ceil(count / n)), so each collective is even. Bytes sent
 * per rank: all-gather (n-1) E (a ring), all-to-all (n-1) E. */
#ifndef QUANT_COLLECTIVES_H
#define QUANT_COLLECTIVES_H
#include <stddef.h>

#include "comm.h"
#include "quant_blocks.h"

typedef struct {
    quant_bits bits;
    size_t block;      /* elements per scale */
    int wrong_scale;   /* negative control: every encoding's first scale sent doubled */
} quant_wire;

/* E: the encoded bytes of one shard of count elements on c. */
size_t quant_shard_bytes(const comm *c, size_t count, quant_wire w);
/* The scratch a call needs: 2 n E bytes and a decoded shard's floats. */
size_t quant_scratch_bytes(const comm *c, size_t count, quant_wire w);
/* full[count] = every rank's shard[len_r], through the codec. */
void quant_allgather(comm *c, quant_wire w, const float *shard, float *full, size_t count,
                     void *scratch);
/* shard[len_r] = the sum over ranks of their full[count]'s piece r, each through the
 * codec. */
void quant_reduce_scatter(comm *c, quant_wire w, const float *full, float *shard,
                          size_t count, void *scratch);

/* qgZ in two hops, as ZeRO++ runs it: a group of N = K d ranks as d nodes of K (rank
 * j K + l: node j, local index l); `node` holds this rank's node (K ranks, by local
 * index), `cross` the d ranks of its local index (by node). Hop 1, inside the node: each
 * rank encodes every one of the N shards of its full vector and sends local rank l' the
 * d shards its column owns (j' K + l' for every node j'), an all-to-all of d E bytes a
 * block; each decodes the K pieces of its column's shards and sums them in fp32, local
 * rank order. Hop 2, across: those d partial sums encoded again and crossed in an
 * all-to-all of E a block; each rank decodes the d pieces of its own shard and sums them,
 * node order. The shards are comm_shard's over N, so the result lands where the flat
 * quant_reduce_scatter puts it. Bytes sent per rank: (K-1) d E inside the node, (d-1) E
 * across (the flat one sends (N-K) E across: K times as much). */
size_t quant_hier_scratch_bytes(const comm *node, const comm *cross, size_t count,
                                quant_wire w);
void quant_reduce_scatter_hier(comm *node, comm *cross, quant_wire w, const float *full,
                               float *shard, size_t count, void *scratch);

#endif
