#include "fsdp.h"

#include "alloc.h"
#include "fsdp_fp8.h"
#include "ops_mixed.h"

/* One slab gathered from every rank's piece into a temporary whole copy. */
typedef struct {
    void *whole;            /* tagged params; exists only while the slab is in use (the
                               compute weights: 16-bit in mixed precision) */
    comm_request *pending;  /* a prefetch still in flight */
    fsdp_fp8_block fp8;     /* forward's block in FP8 (fsdp_fp8.h), else empty */
} gathered_slab;

/* backward: the gather for backward's use (ZeRO++'s hpZ gathers inside the node). */
static void gather_start(zero_rank *z, gathered_slab *g, int slab, int async, int backward) {
    const size_t n = z->dp->layout.slab_numel[slab];
    const precision p = z->dp->precision;
    const void *piece = dp_grads_compute_piece(z->dp, slab);
    g->whole = mem_alloc_on(MEM_DEVICE, MEM_PARAMS, n * precision_bytes(p));
    g->pending = NULL;
    g->fp8 = (fsdp_fp8_block){0};
    const int block = slab != gpt_embed_slab(&z->dp->shape) && slab != gpt_final_slab(&z->dp->shape);
    if (!backward && block && fsdp_fp8_gathers(z->dp)) fsdp_fp8_gather(z->dp, slab, g->whole, &g->fp8);
    else if (z->zpp) zeropp_gather(z->zpp, z->dp, slab, backward, g->whole);   /* blocking */
    else if (async) g->pending = comm_allgather_start(z->dp->group, piece, g->whole, n, comm_dtype_of(p));
    else comm_allgather(z->dp->group, piece, g->whole, n, comm_dtype_of(p));
}

static void *gather_ready(gathered_slab *g) {
    if (g->pending) comm_wait(g->pending);
    g->pending = NULL;
    return g->whole;
}

static void gather_free(gathered_slab *g) {
    fsdp_fp8_release(&g->fp8);
    mem_free(g->whole);
    g->whole = NULL;
}

static void reduce_slab(zero_rank *z, int slab, float *grad) {
    if (z->zpp) zeropp_reduce_slab(z->zpp, z->dp, slab, grad);
    else dp_grads_reduce_slab(z->dp, slab, grad);
}

/* The forward pass in units: 0 the embedding, 1..L the blocks, L+1 the head. The head
 * needs two slabs, the final LayerNorm and the tied embedding (the LM head's weight). */
typedef struct {
    gathered_slab slab[2];
    int count;
} unit_params;

static void unit_gather(zero_rank *z, unit_params *u, int unit, int async) {
    const int layers = z->dp->shape.cfg.layers;
    if (unit == 0) {
        u->count = 1;
        gather_start(z, &u->slab[0], 0, async, 0);
    } else if (unit <= layers) {
        u->count = 1;
        gather_start(z, &u->slab[0], gpt_block_slab(&z->dp->shape, unit - 1), async, 0);
    } else {
        u->count = 2;
        gather_start(z, &u->slab[0], gpt_final_slab(&z->dp->shape), async, 0);
        gather_start(z, &u->slab[1], 0, async, 0);
    }
}

static void unit_ready(unit_params *u) {
    for (int i = 0; i < u->count; i++) gather_ready(&u->slab[i]);
}

static void unit_free(unit_params *u) {
    for (int i = 0; i < u->count; i++) gather_free(&u->slab[i]);
    u->count = 0;
}

/* Forward: gather a unit, compute it, free it. The head's slabs are handed back
 * still gathered: its backward comes next, so freeing and re-gathering them would
 * only cost a transfer. */
static float forward(zero_rank *z, unit_params *head) {
    gpt_model *m = z->model;
    const int layers = z->dp->shape.cfg.layers, units = layers + 2;
    const int prefetch = z->opts.prefetch;
    unit_params current = {0}, next = {0};
    float loss = 0.0f;
    unit_gather(z, &current, 0, 0);
    for (int unit = 0; unit < units; unit++) {
        if (prefetch && unit + 1 < units) unit_gather(z, &next, unit + 1, 1);
        unit_ready(&current);
        if (unit == 0) gpt_embed_forward(m, current.slab[0].whole);
        else if (unit <= layers) gpt_block_forward(m, unit - 1, current.slab[0].whole);
        else loss = gpt_head_forward(m, current.slab[0].whole, current.slab[1].whole);
        if (unit + 1 == units) break;
        unit_free(&current);   /* this unit's whole parameters are gone again */
        if (prefetch) current = next;
        else unit_gather(z, &current, unit + 1, 0);
    }
    *head = current;
    return loss;
}

/* Backward: head, blocks from last to first, embedding. Each block is gathered
 * again, its gradient goes into a whole-slab buffer that is reduce-scattered into
 * this rank's shard and freed. */
static void backward(zero_rank *z, unit_params *head, float dloss) {
    gpt_model *m = z->model;
    const int layers = z->dp->shape.cfg.layers, final = gpt_final_slab(&z->dp->shape);
    const int prefetch = z->opts.prefetch;
    gathered_slab next = {0};

    /* The tied embedding's gradient comes from the head now and from the embedding at
     * the end, so its whole buffer lives through the backward pass. */
    float *embed_grad = dp_grads_slab_grad_alloc(z->dp, 0);
    float *final_grad = dp_grads_slab_grad_alloc(z->dp, final);
    if (prefetch) gather_start(z, &next, gpt_block_slab(&z->dp->shape, layers - 1), 1, 1);
    gpt_head_backward(m, head->slab[0].whole, head->slab[1].whole, final_grad, embed_grad,
                      dloss);
    unit_free(head);
    /* The prefetch is finished before the next blocking collective, so that a rank's
     * collectives never overlap one another: only with computation. */
    if (prefetch) gather_ready(&next);
    reduce_slab(z, final, final_grad);

    for (int layer = layers - 1; layer >= 0; layer--) {
        const int slab = gpt_block_slab(&z->dp->shape, layer);
        gathered_slab current;
        if (prefetch) current = next;
        else gather_start(z, &current, slab, 0, 1);
        if (prefetch && layer > 0) gather_start(z, &next, gpt_block_slab(&z->dp->shape, layer - 1), 1, 1);
        float *block_grad = dp_grads_slab_grad_alloc(z->dp, slab);
        gpt_block_backward(m, layer, gather_ready(&current), block_grad);
        gather_free(&current);
        if (prefetch && layer > 0) gather_ready(&next);
        reduce_slab(z, slab, block_grad);
    }
    /* The embedding's backward adds rows of d(input) to the rows of the tokens used:
     * it needs no parameters, so nothing is gathered for it. */
    gpt_embed_backward(m, embed_grad);
    reduce_slab(z, 0, embed_grad);
}

float fsdp_forward_backward(zero_rank *z, float dloss) {
    unit_params head;
    trace_begin(z->dp->group, "forward");
    float loss = forward(z, &head);
    trace_end(z->dp->group);
    trace_begin(z->dp->group, "backward");
    backward(z, &head, dloss);
    trace_end(z->dp->group);
    return loss;
}
