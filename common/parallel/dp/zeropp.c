/* ZeRO++'s three pieces on ZeRO-3's gathers and reductions (zeropp.h). */
#include "zeropp.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"

static const char *const piece_flags[3] = {"qwz", "hpz", "qgz"};
static const char *const piece_titles[3] = {"qwZ", "hpZ", "qgZ"};

const char *zeropp_parse(const char *text, int *pieces, char *err, size_t n) {
    *pieces = 0;
    const char *at = text;
    while (1) {
        const size_t len = strcspn(at, ",");
        int found = -1;
        for (int i = 0; i < 3; i++)
            if (len == strlen(piece_flags[i]) && strncmp(at, piece_flags[i], len) == 0) found = i;
        if (found < 0 || (*pieces & (1 << found))) {
            snprintf(err, n, "--zeropp %s: %s '%.*s' (valid: qwz, hpz, qgz, comma-separated,"
                     " each once)", text, found < 0 ? "no piece" : "twice", (int)len, at);
            return err;
        }
        *pieces |= 1 << found;
        if (at[len] == '\0') return NULL;
        at += len + 1;
    }
}

const char *zeropp_name(int pieces, char *buf, size_t n) {
    snprintf(buf, n, "%s", pieces ? "" : "-");
    for (int i = 0; i < 3; i++)
        if (pieces & (1 << i))
            snprintf(buf + strlen(buf), n - strlen(buf), "%s%s", strlen(buf) ? "+" : "",
                     piece_titles[i]);
    return buf;
}

const char *zeropp_check(int pieces, int stage, precision p, precision gp, int prefetch,
                         int ranks, int ranks_per_node, char *err, size_t n) {
    char name[32];
    zeropp_name(pieces, name, sizeof name);
    if (!pieces) return NULL;
    if (stage != 3)
        snprintf(err, n, "--zeropp %s: ZeRO++ is an option of ZeRO-3 (valid with --stage 3)",
                 name);
    else if (p != PRECISION_FP32 || gp != PRECISION_FP32)
        snprintf(err, n, "--zeropp %s: the int8 and int4 block codecs take fp32 weights and"
                 " gradients (valid: --precision fp32, fp32 gradients)", name);
    else if (prefetch)
        snprintf(err, n, "--prefetch with --zeropp %s: the quantised gathers block, so"
                 " nothing would be prefetched (leave one out)", name);
    else if ((pieces & ZEROPP_HPZ) && (ranks_per_node <= 0 || ranks / ranks_per_node < 2))
        snprintf(err, n, "--zeropp %s: hpZ's secondary shard lives inside a node, and on one"
                 " node it is the primary shard (valid: two or more nodes, --link-intra,"
                 " --link-inter and --ranks-per-node)", name);
    else
        return NULL;
    return err;
}

struct zeropp {
    int pieces, K;
    zeropp_fault fault;
    comm *node, *cross;           /* this rank's node; its local index across nodes */
    float *secondary;             /* hpZ: node-pieces of the blocks, slab by slab */
    size_t *secondary_pos;        /* per slab: where its node-piece starts, or SIZE_MAX */
};

static quant_wire wire(const zeropp *z, quant_bits bits, size_t block) {
    return (quant_wire){.bits = bits, .block = block,
                        .wrong_scale = z->fault == ZEROPP_FAULT_WRONG_SCALE};
}

/* hpZ: room for this rank's node-piece of every block (the slabs backward gathers). */
static void secondary_create(zeropp *z, const dp_grads *g) {
    const int slabs = g->layout.num_slabs, local = comm_rank(z->node);
    z->secondary_pos = mem_alloc(MEM_OTHER, (size_t)slabs * sizeof(size_t));
    size_t total = 0, offset;
    for (int slab = 0; slab < slabs; slab++) z->secondary_pos[slab] = SIZE_MAX;
    for (int layer = 0; layer < g->shape.cfg.layers; layer++) {
        const int slab = gpt_block_slab(&g->shape, layer);
        z->secondary_pos[slab] = total;
        total += comm_shard(g->layout.slab_numel[slab], z->K, local, &offset);
    }
    if (z->pieces & ZEROPP_HPZ)
        z->secondary = mem_alloc_on(MEM_DEVICE, MEM_PARAMS, total * sizeof(float));
}

zeropp *zeropp_create(dp_grads *g, int pieces, int ranks_per_node, zeropp_fault fault) {
    zeropp *z = mem_alloc(MEM_OTHER, sizeof *z);
    const int N = comm_size(g->group), rank = comm_rank(g->group);
    *z = (zeropp){.pieces = pieces, .K = ranks_per_node > 0 ? ranks_per_node : N,
                  .fault = fault};
    z->node = comm_split(g->group, rank / z->K, rank, "zeropp-node");
    z->cross = comm_split(g->group, rank % z->K, rank, "zeropp-cross");
    secondary_create(z, g);
    return z;
}

void zeropp_free(zeropp *z) {
    if (!z) return;
    mem_free(z->secondary);
    mem_free(z->secondary_pos);
    comm_free(z->node);
    comm_free(z->cross);
    mem_free(z);
}

void zeropp_gather(zeropp *z, dp_grads *g, int slab, int backward, float *whole) {
    const size_t n = g->layout.slab_numel[slab], pos = z->secondary_pos[slab];
    const int secondary = (z->pieces & ZEROPP_HPZ) && pos != SIZE_MAX;
    if (backward && secondary && z->fault != ZEROPP_FAULT_HPZ_ACROSS) {
        comm_allgather(z->node, z->secondary + pos, whole, n, COMM_F32);
        return;
    }
    const float *piece = dp_grads_compute_piece(g, slab);
    if (z->pieces & ZEROPP_QWZ) {
        const quant_wire w = wire(z, QUANT_INT8, ZEROPP_WEIGHT_BLOCK);
        void *scratch = mem_alloc_on(MEM_DEVICE, MEM_COMM, quant_scratch_bytes(g->group, n, w));
        quant_allgather(g->group, w, piece, whole, n, scratch);
        mem_free(scratch);
    } else {
        comm_allgather(g->group, piece, whole, n, COMM_F32);
    }
    if (!backward && secondary) {   /* the weights forward used, for backward's gather */
        size_t offset, len = comm_shard(n, z->K, comm_rank(z->node), &offset);
        vec_copy(z->secondary + pos, whole + offset, len);
    }
}

void zeropp_reduce_slab(zeropp *z, dp_grads *g, int slab, float *slab_grad) {
    if (!(z->pieces & ZEROPP_QGZ)) {
        dp_grads_reduce_slab(g, slab, slab_grad);
        return;
    }
    const size_t n = g->layout.slab_numel[slab];
    const quant_wire w = wire(z, QUANT_INT4, ZEROPP_GRAD_BLOCK);
    void *scratch = mem_alloc_on(MEM_DEVICE, MEM_COMM,
                                 quant_hier_scratch_bytes(z->node, z->cross, n, w));
    quant_reduce_scatter_hier(z->node, z->cross, w, slab_grad,
                              g->grads + g->layout.shard_pos[slab], n, scratch);
    mem_free(scratch);
    mem_free(slab_grad);
}
