/* ZeRO-3's forward all-gather of a block in FP8 (fsdp_fp8.h). */
#include "fsdp_fp8.h"

#include <math.h>
#include <string.h>

#include "alloc.h"
#include "fp8_linear.h"
#include "number_formats.h"
#include "zeropp.h"

/* The four linears of a block slab: offsets, [out, in] shapes. */
typedef struct {
    size_t off[4];
    int rows[4], cols[4];
    size_t scale_base[4], scales;    /* where each weight's scales start; in all */
    int br[4], bc[4];
} block_weights;

static block_weights weights_of(const gpt_shape *s, fp8_recipe recipe) {
    const gpt_block_layout o = gpt_block_offsets(s);
    const int C = s->cfg.dim, Cl = (int)((o.proj_w - o.qkv_b) / 3);
    const int Hl = (int)((o.fc_b - o.fc_w) / (size_t)C);
    block_weights w = {.off = {o.qkv_w, o.proj_w, o.fc_w, o.fc2_w},
                       .rows = {3 * Cl, C, Hl, C}, .cols = {C, Cl, C, Hl}};
    for (int k = 0; k < 4; k++) {
        fp8_recipe_blocks(recipe, FP8_WEIGHT, w.rows[k], w.cols[k], &w.br[k], &w.bc[k]);
        w.scale_base[k] = w.scales;
        w.scales += fp8_scale_count(w.rows[k], w.cols[k], w.br[k], w.bc[k]);
    }
    return w;
}

static size_t weight_size(const block_weights *w, int k) {
    return (size_t)w->rows[k] * (size_t)w->cols[k];
}

/* Which weight slab element i belongs to (-1: none), and its scale's index. */
static int weight_at(const block_weights *w, size_t i, size_t *scale) {
    for (int k = 0; k < 4; k++)
        if (i >= w->off[k] && i < w->off[k] + weight_size(w, k)) {
            const size_t e = i - w->off[k];
            const int row = (int)(e / (size_t)w->cols[k]), col = (int)(e % (size_t)w->cols[k]);
            const int grid_cols = (w->cols[k] + w->bc[k] - 1) / w->bc[k];
            *scale = w->scale_base[k] + (size_t)(row / w->br[k]) * grid_cols + col / w->bc[k];
            return k;
        }
    return -1;
}

/* Elements before slab element i that are no weight's: its index among the others. */
static size_t other_index(const block_weights *w, size_t i) {
    size_t before = 0;
    for (int k = 0; k < 4; k++)
        if (i > w->off[k]) before += i - w->off[k] < weight_size(w, k) ? i - w->off[k] : weight_size(w, k);
    return i - before;
}

static int local_amax;   /* test hook: each rank's own amax */
void fsdp_fp8_test_local_amax(int on) { local_amax = on; }

int fsdp_fp8_gathers(const dp_grads *g) {
    return g->zero == 3 && g->precision == PRECISION_BF16 && fp8_linear_takes_given_weights();
}

/* Delayed: a weight is one block; its scale is its linear's history's (the same on every
 * rank, the amax all-reduced first), and the whole weight's amax goes into it. */
static void delayed_weight_scales(const dp_grads *g, int slab, float *scales) {
    const gpt_shape *s = &g->shape;
    int layer = s->layer_begin;
    while (layer < s->layer_end && gpt_block_slab(s, layer) != slab) layer++;
    for (int k = 0; k < 4; k++)   /* model.c's sites: 4 a layer, in the block's order */
        scales[k] = fp8_linear_delayed_weight_scale(4 * layer + k, scales[k]);
}

/* Each scale from the amax over every rank's elements of its block (delayed: through
 * the history). */
static void whole_weight_scales(dp_grads *g, int slab, fp8_recipe recipe, const block_weights *w,
                                const uint16_t *piece, size_t poff, size_t plen, float *scales) {
    memset(scales, 0, w->scales * sizeof *scales);
    for (size_t j = 0; j < plen; j++) {
        size_t b;
        if (weight_at(w, poff + j, &b) < 0) continue;
        const float v = fabsf(number_from_bf16(piece[j]));
        if (v > scales[b]) scales[b] = v;
    }
    if (local_amax) comm_allreduce(g->group, scales, w->scales, COMM_F32, COMM_SUM);
    else comm_allreduce(g->group, scales, w->scales, COMM_F32, COMM_MAX);
    if (recipe == FP8_DELAYED) delayed_weight_scales(g, slab, scales);
    else
        for (size_t b = 0; b < w->scales; b++) scales[b] = fp8_scale_for(FP8_E4M3, scales[b], 0);
}

void fsdp_fp8_gather(dp_grads *g, int slab, uint16_t *whole, fsdp_fp8_block *b) {
    fp8_recipe recipe;
    fp8_linear_active(&recipe);
    const block_weights w = weights_of(&g->shape, recipe);
    const shard_layout *l = &g->layout;
    const size_t S = l->slab_numel[slab], poff = l->piece_offset[slab], plen = l->piece_len[slab];
    size_t linear = 0;
    for (int k = 0; k < 4; k++) linear += weight_size(&w, k);
    const size_t others = S - linear;
    const uint16_t *piece = dp_grads_compute_piece(g, slab);
    b->codes = mem_alloc_on(MEM_DEVICE, MEM_PARAMS, S + 1);
    b->scales = mem_alloc_on(MEM_DEVICE, MEM_PARAMS, w.scales * sizeof(float));
    uint8_t *mine = mem_alloc_on(MEM_DEVICE, MEM_COMM, plen + 1);
    uint16_t *other = mem_alloc_on(MEM_DEVICE, MEM_COMM, (others + 1) * sizeof *other);
    whole_weight_scales(g, slab, recipe, &w, piece, poff, plen, b->scales);
    memset(other, 0, others * sizeof *other);
    for (size_t j = 0; j < plen; j++) {   /* my codes; my others into their vector */
        size_t s;
        if (weight_at(&w, poff + j, &s) >= 0)
            mine[j] = fp8_encode(FP8_E4M3, number_from_bf16(piece[j]) * b->scales[s]);
        else
            mine[j] = 0, other[other_index(&w, poff + j)] = piece[j];
    }
    comm_allgather(g->group, mine, b->codes, S, COMM_F8E4M3);
    comm_allreduce(g->group, other, others, COMM_BF16, COMM_SUM);   /* x + 0s: exact */
    for (size_t i = 0; i < S; i++) {
        size_t s;
        whole[i] = weight_at(&w, i, &s) >= 0 ? 0 : other[other_index(&w, i)];
    }
    for (int k = 0; k < 4; k++) {
        b->given[k] = whole + w.off[k];
        fp8_linear_give_weight(b->given[k], b->codes + w.off[k], b->scales + w.scale_base[k]);
    }
    mem_free(other);
    mem_free(mine);
}

void fsdp_fp8_release(fsdp_fp8_block *b) {
    if (!b->codes) return;
    for (int k = 0; k < 4; k++) fp8_linear_forget_weight(b->given[k]);
    mem_free(b->codes);
    mem_free(b->scales);
    memset(b, 0, sizeof *b);
}

void fsdp_fp8_gather_bytes(const gpt_shape *s, fp8_recipe recipe, int N, double out[2]) {
    const block_weights w = weights_of(s, recipe);
    size_t linear = 0;
    for (int k = 0; k < 4; k++) linear += weight_size(&w, k);
    const size_t S = gpt_slab_numel(s, gpt_block_slab(s, 0)), others = S - linear;
    const size_t E = gpt_slab_numel(s, gpt_embed_slab(s)), F = gpt_slab_numel(s, gpt_final_slab(s));
    const int L = s->cfg.layers;
    out[0] = out[1] = 0;
    for (int p = 0; p < N; p++) {
        /* forward: codes (a byte), backward: bf16; embedding twice, final LayerNorm once */
        const double gather = L * 3 * ring_allgather_elements(S, N, p) +
                              2 * 2 * ring_allgather_elements(E, N, p) +
                              2 * ring_allgather_elements(F, N, p);
        const double reduce = L * (4 * ring_allreduce_elements(w.scales, N, p) +
                                   2 * ring_allreduce_elements(others, N, p));
        out[0] = fmax(out[0], gather);
        out[1] = fmax(out[1], reduce);
    }
}
