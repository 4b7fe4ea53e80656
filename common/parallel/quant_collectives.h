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
    size_t block;   /* elements per scale */
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

#endif
