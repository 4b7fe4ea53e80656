#include "dp_grads.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "grads16.h"
#include "ops_mixed.h"
#include "zero_rule.h"

static float *device_floats(mem_tag tag, size_t n) {
    return mem_alloc_on(MEM_DEVICE, tag, n * sizeof(float));
}

float *dp_grads_piece(const dp_grads *g, float *vector, int is_whole, int slab) {
    const shard_layout *l = &g->layout;
    return vector + (is_whole ? shard_piece_begin(l, slab) : l->shard_pos[slab]);
}

/* A whole vector is computed here in full; a shard only in this rank's pieces:
 * gpt_init_params gives any index range bit-identical to the whole model's values, so
 * no rank needs another's. */
static void init_params(dp_grads *g, uint64_t seed) {
    const shard_layout *l = &g->layout;
    if (g->params_whole) {
        float *host = malloc((l->num_params + 1) * sizeof(float));
        if (!host) abort();
        gpt_init_params(&g->shape, seed, 0, l->num_params, host);
        ops_upload(g->params, host, l->num_params * sizeof(float));
        free(host);
        return;
    }
    float *host = malloc((l->shard_len + 1) * sizeof(float));
    if (!host) abort();
    for (int slab = 0; slab < l->num_slabs; slab++) {
        size_t begin = shard_piece_begin(l, slab);
        gpt_init_params(&g->shape, seed, begin, begin + l->piece_len[slab],
                        host + l->shard_pos[slab]);
    }
    ops_upload(g->params, host, l->shard_len * sizeof(float));
    free(host);
}

static size_t or_one_bucket(size_t bytes) { return bytes ? bytes : SIZE_MAX; }

void dp_grads_init(dp_grads *g, comm *group, const gpt_shape *part, uint64_t seed,
                   const dp_grads_options *opts) {
    memset(g, 0, sizeof *g);
    g->group = group;
    g->replicate = opts->replicate && comm_size(opts->replicate) > 1 ? opts->replicate : NULL;
    g->zero = opts->zero;
    g->fault = opts->fault;
    g->shape = *part;
    mem_stats *own = mem_stats_current();
    if (opts->bookkeeping) mem_stats_bind(opts->bookkeeping);
    shard_layout_init(&g->layout, part, comm_size(group), comm_rank(group));
    mem_stats_bind(own);
    const size_t P = g->layout.num_params, shard = g->layout.shard_len;
    g->precision = opts->precision;
    const int mixed = g->precision != PRECISION_FP32;
    const zero_sharded z = zero_sharded_at(g->zero);
    g->compute_whole = !z.params;
    /* the fp32 masters: the compute weights themselves in fp32; optimizer state,
     * sharded like m and v, in mixed precision */
    g->params_whole = mixed ? !z.optimizer : g->compute_whole;
    g->grads_whole = !z.grads;
    g->optimizer_whole = !z.optimizer;
    g->params = device_floats(mixed ? MEM_OPTIMIZER : MEM_PARAMS, g->params_whole ? P : shard);
    g->grad_precision = opts->grad_precision;
    if (g->grad_precision == PRECISION_FP32)
        g->grads = device_floats(MEM_GRADS, g->grads_whole ? P : shard);
    else   /* AdamW widens them as it reads them: `grads` stays NULL */
        g->grads16 = mem_alloc_on(MEM_DEVICE, MEM_GRADS, (g->grads_whole ? P : shard) *
                                                            precision_bytes(g->grad_precision));
    g->grads16_unscale = 1.0f;
    g->step_grads_fp32 = opts->step_grads_fp32;
    g->overlap = opts->overlap && g->zero == 0;
    g->adam_m = device_floats(MEM_OPTIMIZER, g->optimizer_whole ? P : shard);
    g->adam_v = device_floats(MEM_OPTIMIZER, g->optimizer_whole ? P : shard);
    g->compute = mixed ? mem_alloc_on(MEM_DEVICE, MEM_PARAMS, (g->compute_whole ? P : shard) *
                                                                  precision_bytes(g->precision))
                       : g->params;
    init_params(g, seed);
    if (g->zero == 0 && !(opts->quiet_alone && comm_size(group) == 1))
        g->buckets = grad_buckets_create_held(
            group, part, g->grads16 ? g->grads16 : (void *)g->grads,
            comm_dtype_of(g->grad_precision), or_one_bucket(opts->first_bucket_bytes),
            or_one_bucket(opts->bucket_bytes), g->grads16 ? COMM_F32 : opts->wire);
}

void dp_grads_free(dp_grads *g) {
    grad_buckets_free(g->buckets);
    if (g->compute != g->params) mem_free(g->compute);
    mem_free(g->step_compute);
    mem_free(g->step_grads);
    mem_free(g->params);
    mem_free(g->grads);
    mem_free(g->grads16);
    mem_free(g->adam_m);
    mem_free(g->adam_v);
    shard_layout_free(&g->layout);
    memset(g, 0, sizeof *g);
}

/* ---- whole gradients ------------------------------------------------------------- */

/* Every rank's pieces of a sharded vector (elements of p) into a whole one, slab by
 * slab. */
static void allgather_shard(dp_grads *g, precision p, const void *shard, void *whole) {
    const shard_layout *l = &g->layout;
    for (int slab = 0; slab < l->num_slabs; slab++)
        comm_allgather(g->group, precision_at(p, shard, l->shard_pos[slab]),
                       precision_at(p, whole, l->slab_offset[slab]), l->slab_numel[slab],
                       comm_dtype_of(p));
}

/* This rank's masters rounded into its compute weights: the whole model at zero 0, its
 * pieces at zero 1-3. */
static void round_own_masters(dp_grads *g) {
    const precision p = g->precision;
    const shard_layout *l = &g->layout;
    if (g->params_whole) {
        mixed_round(p, g->compute, g->params, l->num_params);
        return;
    }
    for (int slab = 0; slab < l->num_slabs; slab++)
        mixed_round(p, precision_at(p, g->compute, g->compute_whole ? shard_piece_begin(l, slab)
                                                                    : l->shard_pos[slab]),
                    g->params + l->shard_pos[slab], l->piece_len[slab]);
}

void dp_grads_begin_step_compute(dp_grads *g) {
    if (g->precision == PRECISION_FP32) return;
    if (!g->compute_current) round_own_masters(g);   /* else AdamW wrote them */
    g->compute_current = 1;
    if (!g->params_whole && g->compute_whole && g->fault != DP_FAULT_SKIP_PARAM_ALLGATHER)
        shard_allgather_in_place(g->group, &g->layout, g->precision, g->compute);   /* zero 1-2 */
}

const void *dp_grads_compute_piece(const dp_grads *g, int slab) {
    return precision_at(g->precision, g->compute, g->layout.shard_pos[slab]);
}

void dp_grads_step_begin(dp_grads *g) {
    const size_t P = g->layout.num_params;
    if (g->zero == 3 && !g->step_compute) {
        g->step_compute = mem_alloc_on(MEM_DEVICE, MEM_PARAMS, P * precision_bytes(g->precision));
        allgather_shard(g, g->precision, g->compute, g->step_compute);
    }
    if (g->grads16 && !g->step_grads_fp32) {
        if (!g->grads_whole) {
            fprintf(stderr, "error: 16-bit gradients at zero %d reduce per slab\n", g->zero);
            abort();
        }
        mixed_vec_zero(g->grad_precision, g->grads16, P);
        return;
    }
    if ((!g->grads_whole || g->grads16) && !g->step_grads)
        g->step_grads = device_floats(MEM_GRADS, P);
    vec_zero(dp_grads_whole_grads(g), P);
}

void *dp_grads_whole_params(const dp_grads *g) {
    return g->compute_whole ? g->compute : g->step_compute;
}

float *dp_grads_whole_grads(const dp_grads *g) {
    return g->grads_whole && !g->grads16 ? g->grads : g->step_grads;
}

/* 16-bit whole gradients summed in fp32 over the step: rounded once into grads16 (the
 * fp32 vector gone), as the baseline rounds its one backward's sums. */
static void round_step_grads(dp_grads *g) {
    mixed_round(g->grad_precision, g->grads16, g->step_grads, g->layout.num_params);
    mem_free(g->step_grads);
    g->step_grads = NULL;
}

/* HSDP: `n` reduced gradients at `at` (elements of the gradients' precision) summed
 * over the replicas, which hold the same pieces of other ranks' batches. */
static void reduce_over_replicas(dp_grads *g, void *at, size_t n) {
    if (!g->replicate || n == 0 || g->fault == DP_FAULT_SKIP_REPLICATE_REDUCE) return;
    const precision gp = g->grads16 ? g->grad_precision : PRECISION_FP32;
    comm_allreduce(g->replicate, at, n, comm_dtype_of(gp), COMM_SUM);
}

/* This rank's piece of every slab, in a whole vector of the gradients' precision. */
static void reduce_pieces_over_replicas(dp_grads *g, void *whole) {
    const shard_layout *l = &g->layout;
    const precision gp = g->grads16 ? g->grad_precision : PRECISION_FP32;
    for (int slab = 0; slab < l->num_slabs; slab++)
        reduce_over_replicas(g, precision_at(gp, whole, shard_piece_begin(l, slab)),
                             l->piece_len[slab]);
}

static void reduce_scatter_whole(dp_grads *g) {
    const shard_layout *l = &g->layout;
    if (!g->grads16) {
        shard_reduce_scatter_in_place(g->group, l, g->grads);
        return;
    }
    const precision gp = g->grad_precision;
    for (int slab = 0; slab < l->num_slabs; slab++)
        comm_reduce_scatter(g->group, precision_at(gp, g->grads16, l->slab_offset[slab]),
                            precision_at(gp, g->grads16, shard_piece_begin(l, slab)),
                            l->slab_numel[slab], comm_dtype_of(gp), COMM_SUM);
}

void dp_grads_slab_ready(void *ctx, int slab) {
    dp_grads *g = ctx;
    if (g->buckets && g->fault != DP_FAULT_SKIP_GRAD_REDUCE)
        grad_buckets_slab_ready(g->buckets, slab);
}

void dp_grads_after_backward(dp_grads *g) {
    const shard_layout *l = &g->layout;
    if (g->grads16 && g->grads_whole && g->step_grads) round_step_grads(g);
    if (g->zero >= 2) {
        for (int slab = l->num_slabs - 1; slab >= 0; slab--)
            dp_grads_reduce_slab(g, slab, g->step_grads + l->slab_offset[slab]);
        mem_free(g->step_grads);   /* the rank keeps its shard of the gradient alone */
        g->step_grads = NULL;
        mem_free(g->step_compute);  /* zero 3: gathered again for the next step */
        g->step_compute = NULL;
        return;
    }
    if (g->fault == DP_FAULT_SKIP_GRAD_REDUCE) return;
    void *grads = g->grads16 ? g->grads16 : (void *)g->grads;
    if (g->zero == 0) {
        /* plain DDP: every rank gets the whole summed gradient */
        if (g->buckets) {   /* else quiet alone: already the sum */
            for (int slab = l->num_slabs - 1; slab >= 0 && !g->overlap; slab--)
                grad_buckets_slab_ready(g->buckets, slab);
            grad_buckets_wait(g->buckets);
        }
        reduce_over_replicas(g, grads, l->num_params);
        return;
    }
    /* ZeRO-1 needs the summed gradient only where it updates: a reduce-scatter (half of
     * an all-reduce) leaves it in place, in this rank's piece of every slab. The rest of
     * the buffer keeps this rank's own unreduced gradients, which nothing reads. */
    reduce_scatter_whole(g);
    reduce_pieces_over_replicas(g, grads);
}

/* ---- per slab ------------------------------------------------------------------------ */

float *dp_grads_slab_grad_alloc(dp_grads *g, int slab) {
    return device_floats(MEM_GRADS, g->layout.slab_numel[slab]);
}

/* Reduce-scatters into the shard; buffers inside the step's whole gradient are freed
 * with it, lone slab buffers here. */
/* 16-bit gradients: the slab rounded once (its fp32 sums done), into the front of its
 * own buffer (no 16-bit copy beside it), and reduce-scattered in 16 bits into this
 * rank's 16-bit piece. */
static void reduce_into_shard16(dp_grads *g, int slab, float *slab_grad) {
    const shard_layout *l = &g->layout;
    const precision gp = g->grad_precision;
    const size_t n = l->slab_numel[slab];
    void *piece = precision_at(gp, g->grads16, l->shard_pos[slab]);
    const void *slab16 = mixed_round_in_place(gp, slab_grad, n);
    if (g->fault == DP_FAULT_SKIP_GRAD_REDUCE)
        mixed_vec_copy(gp, piece, precision_at(gp, slab16, l->piece_offset[slab]),
                       l->piece_len[slab]);
    else
        comm_reduce_scatter(g->group, slab16, piece, n, comm_dtype_of(gp), COMM_SUM);
}

static void reduce_into_shard(dp_grads *g, int slab, float *slab_grad) {
    const shard_layout *l = &g->layout;
    if (g->grads16) {
        reduce_into_shard16(g, slab, slab_grad);
        return;
    }
    float *piece = g->grads + l->shard_pos[slab];
    if (g->fault == DP_FAULT_SKIP_GRAD_REDUCE)
        vec_copy(piece, slab_grad + l->piece_offset[slab], l->piece_len[slab]);
    else
        comm_reduce_scatter(g->group, slab_grad, piece, l->slab_numel[slab], COMM_F32,
                            COMM_SUM);
}

void dp_grads_reduce_slab(dp_grads *g, int slab, float *slab_grad) {
    reduce_into_shard(g, slab, slab_grad);
    const precision gp = g->grads16 ? g->grad_precision : PRECISION_FP32;
    reduce_over_replicas(g, precision_at(gp, g->grads16 ? g->grads16 : (void *)g->grads,
                                         g->layout.shard_pos[slab]),
                         g->layout.piece_len[slab]);
    const float *step = g->step_grads;
    if (!step || slab_grad < step || slab_grad >= step + g->layout.num_params)
        mem_free(slab_grad);
}

/* 16-bit gradients at zero 1 are checked whole, its own pieces reduced among the
 * others' unreduced terms: an inf or NaN among those reaches the piece it is summed
 * into, so the flag over all ranks is the one its pieces alone would give. */
int dp_grads_optimizer_grads(dp_grads *g, grad_vector *vectors) {
    const size_t n = g->grads_whole ? g->layout.num_params : g->layout.shard_len;
    vectors[0] = g->grads16 ? grad_vector_16(g->grad_precision, g->grads16, n,
                                             &g->grads16_unscale)
                            : grad_vector_fp32(g->grads, n);
    return 1;
}

/* The gradient AdamW reads, as shard_adamw takes it. */
static shard_grads optimizer_grads_of(const dp_grads *g) {
    if (g->grads16)
        return (shard_grads){.data = g->grads16, .precision = g->grad_precision,
                             .whole = g->grads_whole, .scale = g->grads16_unscale};
    return (shard_grads){.data = g->grads, .precision = PRECISION_FP32,
                         .whole = g->grads_whole, .scale = 1.0f};
}

void dp_grads_optimizer_step(dp_grads *g, const adamw_config *cfg) {
    const shard_layout *l = &g->layout;
    const shard_grads grads = optimizer_grads_of(g);
    /* mixed precision: this rank's compute weights rounded in AdamW's pass */
    const int mixed = g->precision != PRECISION_FP32;
    const shard_compute compute = {.data = g->compute, .precision = g->precision,
                                   .whole = g->compute_whole};
    g->adam_step++;
    if (g->optimizer_whole && mixed)
        mixed_adamw_update_round(grads.precision, g->params, grads.data, grads.scale, g->adam_m,
                                 g->adam_v, l->num_params, cfg, g->adam_step, g->precision,
                                 g->compute);
    else if (g->optimizer_whole)
        mixed_adamw_update(grads.precision, g->params, grads.data, grads.scale, g->adam_m,
                           g->adam_v, l->num_params, cfg, g->adam_step);
    else
        shard_adamw(l, g->params, g->params_whole, &grads, g->adam_m, g->adam_v, cfg,
                    g->adam_step, mixed ? &compute : NULL);
    g->compute_current = mixed;
    g->grads16_unscale = 1.0f;
    /* Zero 1 and 2 keep whole parameters for the next forward: every rank sends its
     * updated piece to all the others (mixed precision: 16-bit ones, when the next
     * step begins). */
    if ((g->zero == 1 || g->zero == 2) && g->precision == PRECISION_FP32 &&
        g->fault != DP_FAULT_SKIP_PARAM_ALLGATHER)
        shard_allgather_in_place(g->group, l, PRECISION_FP32, g->params);
}

/* ---- checking and saving --------------------------------------------------------------- */

/* This rank's 16-bit gradients as AdamW reads them (widened, unscaled), into a
 * temporary tagged other: whole at zero 0, else its shard. */
static float *widened_grads16(const dp_grads *g) {
    const shard_layout *l = &g->layout;
    const precision gp = g->grad_precision;
    if (g->zero == 0) {
        float *whole = device_floats(MEM_OTHER, l->num_params);
        grads16_widen_unscaled(gp, whole, g->grads16, g->grads16_unscale, l->num_params);
        return whole;
    }
    float *shard = device_floats(MEM_OTHER, l->shard_len);
    for (int slab = 0; slab < l->num_slabs; slab++) {
        const size_t at = g->grads_whole ? shard_piece_begin(l, slab) : l->shard_pos[slab];
        grads16_widen_unscaled(gp, shard + l->shard_pos[slab], precision_at(gp, g->grads16, at),
                               g->grads16_unscale, l->piece_len[slab]);
    }
    return shard;
}

static float *gather_grads16(dp_grads *g) {
    float *mine = widened_grads16(g);
    if (g->zero == 0) return mine;
    float *out = device_floats(MEM_OTHER, g->layout.num_params);
    allgather_shard(g, PRECISION_FP32, mine, out);
    mem_free(mine);
    return out;
}

float *dp_grads_gather_whole(dp_grads *g, dp_vector which) {
    if (which == DP_GRADS && g->grads16) return gather_grads16(g);
    const int whole = which == DP_PARAMS ? g->params_whole : g->grads_whole;
    float *vector = which == DP_PARAMS ? g->params : g->grads;
    if (whole) {
        /* zero 1's gradient: the other pieces hold this rank's partial sums */
        if (which == DP_GRADS && g->zero == 1)
            shard_allgather_in_place(g->group, &g->layout, PRECISION_FP32, vector);
        return vector;
    }
    float *out = device_floats(MEM_OTHER, g->layout.num_params);
    allgather_shard(g, PRECISION_FP32, vector, out);
    return out;
}

void dp_grads_whole_free(dp_grads *g, float *whole) {
    if (whole != g->params && whole != g->grads) mem_free(whole);
}

ckpt_part dp_grads_checkpoint_part(dp_grads *g, int writes) {
    ckpt_part p = {.shape = g->shape, .params = g->params, .adam_m = g->adam_m,
                   .adam_v = g->adam_v, .writes = writes};
    if (g->zero >= 1) {
        p.layout = &g->layout;
        p.params_sharded = !g->params_whole;
        p.moments_sharded = !g->optimizer_whole;
    }
    return p;
}

void dp_grads_state_bytes(const gpt_shape *part, int zero, precision p, precision gp, int dp,
                          int dp_rank, double bytes[3]) {
    shard_layout l;
    shard_layout_init(&l, part, dp, dp_rank);
    const double whole = (double)l.num_params, shard = (double)l.shard_len;
    const double f32 = sizeof(float);
    /* mixed precision: the fp32 masters count with m and v (K = 12 B per element) */
    const double optimizer_bytes = (p == PRECISION_FP32 ? 2 : 3) * f32;
    bytes[0] = (double)precision_bytes(p) * (zero >= 3 ? shard : whole);
    bytes[1] = (double)precision_bytes(gp) * (zero >= 2 ? shard : whole);
    bytes[2] = optimizer_bytes * (zero >= 1 ? shard : whole);
    shard_layout_free(&l);
}
