/* ZeRO++ (Wang et al. 2023) as options of ZeRO-3 (fsdp.h), any subset:
 *   qwZ  the weight all-gathers (forward's, and backward's unless hpZ) in int8 blocks of
 *        ZEROPP_WEIGHT_BLOCK elements with an fp32 scale each (quant_allgather);
 *   hpZ  forward keeps this rank's node-piece of every block it gathered (a secondary
 *        shard: the slab cut over the K ranks of a node), so backward all-gathers the
 *        block inside the node (fp32: the weights forward used, bit for bit);
 *   qgZ  each slab's gradient reduce-scattered in int4 blocks of ZEROPP_GRAD_BLOCK, in
 *        two hops, inside the node then across (quant_reduce_scatter_hier).
 * Nodes are the two-tier network's (comm.h: K = ranks_per_node; 0: one node of all).
 * fp32 weights and gradients only: the codecs read and write fp32. */
#ifndef ZEROPP_H
#define ZEROPP_H

#include "dp_grads.h"
#include "quant_collectives.h"

enum { ZEROPP_QWZ = 1, ZEROPP_HPZ = 2, ZEROPP_QGZ = 4, ZEROPP_ALL = 7 };
/* ZeRO++'s published blocks are larger (its own kernels); these keep one large value
 * from spoiling more than a few rows of this small model's weights. */
enum { ZEROPP_WEIGHT_BLOCK = 128, ZEROPP_GRAD_BLOCK = 32 };

/* Negative controls: the tests must catch each. */
typedef enum {
    ZEROPP_FAULT_NONE,
    ZEROPP_FAULT_HPZ_ACROSS,     /* hpZ: backward gathers over every node after all */
    ZEROPP_FAULT_WRONG_SCALE,    /* qwZ and qgZ: an encoding's first scale doubled */
} zeropp_fault;

/* "qwz,hpz,qgz" (any subset, any order) into *pieces; the reason on failure, else NULL. */
const char *zeropp_parse(const char *text, int *pieces, char *err, size_t n);
/* "qwZ+hpZ", "qwZ+hpZ+qgZ", ... ("-" for none). */
const char *zeropp_name(int pieces, char *buf, size_t n);
/* Why `pieces` cannot run with these (NULL when they can): ZeRO-3 only, fp32 weights and
 * gradients, no prefetch (the quantised gathers block), hpZ on two or more nodes. */
const char *zeropp_check(int pieces, int stage, precision p, precision gp, int prefetch,
                         int ranks, int ranks_per_node, char *err, size_t n);

typedef struct zeropp zeropp;
/* Collective over g->group (the world of zero_train: a rank's number is its world
 * rank): the node and cross groups, hpZ's secondary shards (tagged params). */
zeropp *zeropp_create(dp_grads *g, int pieces, int ranks_per_node, zeropp_fault fault);
void zeropp_free(zeropp *z);
/* whole[slab's numel] = the slab's weights: forward's gather (qwZ: int8; hpZ keeps the
 * node-piece of a block) or backward's (hpZ: inside the node). Blocking. */
void zeropp_gather(zeropp *z, dp_grads *g, int slab, int backward, float *whole);
/* The slab's gradient into this rank's shard (qgZ: int4, two hops; else fp32, as
 * dp_grads_reduce_slab), then the buffer freed. */
void zeropp_reduce_slab(zeropp *z, dp_grads *g, int slab, float *slab_grad);

/* ---- formulas (zeropp_bytes.c) ------------------------------------------------------ */
/* Bytes a step sends per tier, the largest rank of each tier, to the byte (the threads
 * rings' and all-to-alls' exact pieces): FSDP (pieces 0), ZeRO++'s pieces, or HSDP
 * (hsdp: FSDP inside each node, each piece of the gradient then all-reduced across),
 * on N ranks as nodes of K (K = N: one node). */
void zeropp_tier_bytes(const gpt_shape *s, int pieces, int hsdp, int N, int K, double out[2]);
/* Each tier's alpha (seconds a transfer) and beta (bytes a second). */
typedef struct {
    double alpha[2], beta[2];
} zeropp_links;
/* The tiers of o as comm_tier_seconds times them (link_scale included). */
zeropp_links zeropp_links_of(const comm_options *o);
/* The same and, on `links`, the step's alpha-beta seconds on the slowest rank, nothing
 * hidden: each call's transfers in sequence on the slowest link it waits on (a ring
 * over both nodes: the inter-node link), alpha per transfer plus bytes / beta. */
double zeropp_step_predict(const gpt_shape *s, int pieces, int hsdp, int N, int K,
                           const zeropp_links *links, double bytes[2]);
/* Elements rank p of a threads ring of n sends in an all-gather / all-reduce of c. */
double ring_allgather_elements(size_t c, int n, int p);
double ring_allreduce_elements(size_t c, int n, int p);
/* hpZ's secondary shards on the rank holding the most: 4 x its node-pieces of the blocks. */
double zeropp_hpz_extra_bytes(const gpt_shape *s, int K);

#endif
