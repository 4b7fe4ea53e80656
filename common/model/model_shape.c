/* The model's shape: what a rank's slice of a stage holds, where each slab sits in its
 * vector, and every parameter's initial value (model.h). */
#include "model.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "rng.h"

/* ---- shape and layout ------------------------------------------------------------ */

int gpt_config_check(const gpt_config *cfg, int tp_size, char *err, size_t err_len) {
    const struct { const char *name; int value; } sizes[] = {
        {"vocab", cfg->vocab}, {"ctx", cfg->ctx}, {"layers", cfg->layers},
        {"heads", cfg->heads}, {"dim", cfg->dim}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        if (sizes[i].value <= 0) {
            snprintf(err, err_len, "--%s %d: must be a positive integer", sizes[i].name,
                     sizes[i].value);
            return 0;
        }
    }
    if (cfg->dim > INT_MAX / 4) {   /* the MLP's width 4 x dim is an int */
        snprintf(err, err_len, "--dim %d: at most %d (the MLP is 4 x dim wide)", cfg->dim,
                 INT_MAX / 4);
        return 0;
    }
    /* Every element count is a size_t: keep the largest products far from 2^64. */
    const double C = cfg->dim, params = (double)cfg->layers * (12 * C * C + 13 * C) +
                                        ((double)cfg->vocab + cfg->ctx + 2) * C;
    const double attention = (double)cfg->heads * cfg->ctx * cfg->ctx;
    if (params > 1e18 || attention > 1e18) {
        snprintf(err, err_len, "--layers %d --dim %d --vocab %d --ctx %d --heads %d: %.3g"
                 " parameters and %.3g attention scores a sequence overflow this program's"
                 " counts (at most 1e18 each)", cfg->layers, cfg->dim, cfg->vocab, cfg->ctx,
                 cfg->heads, params, attention);
        return 0;
    }
    if (cfg->dim % cfg->heads != 0) {
        snprintf(err, err_len, "--heads %d does not divide --dim %d (try heads = 1, 2, 4 or"
                 " a dim that is a multiple of %d)", cfg->heads, cfg->dim, cfg->heads);
        return 0;
    }
    if (tp_size < 1 || cfg->heads % tp_size != 0) {
        snprintf(err, err_len, "tensor-parallel size %d does not divide --heads %d",
                 tp_size, cfg->heads);
        return 0;
    }
    return 1;
}

gpt_shape gpt_shape_make(const gpt_config *cfg, int tp_size, int tp_rank) {
    gpt_shape s = {.cfg = *cfg, .tp_size = tp_size, .tp_rank = tp_rank};
    s.dim_local = cfg->dim / tp_size;
    s.heads_local = cfg->heads / tp_size;
    s.hidden_local = 4 * cfg->dim / tp_size;
    s.vocab_start = 0;
    s.vocab_local = cfg->vocab;
    gpt_shape_set_stage(&s, 0, cfg->layers);
    return s;
}

void gpt_shape_split_vocab(gpt_shape *s) {
    s->vocab_parallel = 1;
    s->vocab_local = (s->cfg.vocab + s->tp_size - 1) / s->tp_size;
    s->vocab_start = s->tp_rank * s->vocab_local;
}

void gpt_shape_set_stage(gpt_shape *s, int layer_begin, int layer_end) {
    s->layer_begin = layer_begin;
    s->layer_end = layer_end;
    s->has_embed = layer_begin == 0;
    s->has_head = layer_end == s->cfg.layers;
}

void gpt_shape_split_stages(gpt_shape *s, int stages, int stage) {
    const long L = s->cfg.layers;
    gpt_shape_set_stage(s, (int)(stage * L / stages), (int)((stage + 1) * L / stages));
}

int gpt_stage_layers(const gpt_shape *s) { return s->layer_end - s->layer_begin; }

void gpt_shape_drop_moe_mlps(gpt_shape *s, int every) { s->moe_every = every; }

int gpt_block_has_mlp(const gpt_shape *s, int layer) {
    return !s->moe_every || layer % s->moe_every != s->moe_every - 1;
}

/* The MLP's part of a block slab: fc, fc2 and their biases (last in the slab). */
static size_t mlp_numel(const gpt_shape *s) {
    size_t C = s->cfg.dim, Hl = s->hidden_local;
    return (Hl * C + Hl) + (C * Hl + C);
}

/* A block with its MLP. */
static size_t block_numel(const gpt_shape *s) {
    size_t C = s->cfg.dim, Cl = s->dim_local;
    return 2 * C + (3 * Cl * C + 3 * Cl) + (C * Cl + C) + 2 * C + mlp_numel(s);
}

/* Blocks in [begin, end) without their MLP: the l with l % every == every - 1. */
static size_t blocks_without_mlp(const gpt_shape *s, int begin, int end) {
    if (!s->moe_every) return 0;
    return (size_t)(end / s->moe_every - begin / s->moe_every);
}

/* Elements of blocks [layer_begin, layer_begin + count) of the stage. */
static size_t blocks_numel(const gpt_shape *s, int count) {
    return (size_t)count * block_numel(s) -
           blocks_without_mlp(s, s->layer_begin, s->layer_begin + count) * mlp_numel(s);
}

static size_t wte_numel(const gpt_shape *s) { return (size_t)s->vocab_local * s->cfg.dim; }
static size_t embed_numel(const gpt_shape *s) {
    return wte_numel(s) + (size_t)s->cfg.ctx * s->cfg.dim;
}

int gpt_embed_slab(const gpt_shape *s) { return s->has_embed ? 0 : -1; }

int gpt_block_slab(const gpt_shape *s, int layer) {
    if (layer < s->layer_begin || layer >= s->layer_end) return -1;
    return s->has_embed + layer - s->layer_begin;
}

int gpt_final_slab(const gpt_shape *s) {
    return s->has_head ? s->has_embed + gpt_stage_layers(s) : -1;
}

int gpt_head_slab(const gpt_shape *s) {
    return s->has_head && !s->has_embed ? gpt_final_slab(s) + 1 : -1;
}

int gpt_num_slabs(const gpt_shape *s) {
    return s->has_embed + gpt_stage_layers(s) + s->has_head + (gpt_head_slab(s) >= 0);
}

gpt_slab_kind gpt_slab_kind_of(const gpt_shape *s, int slab) {
    if (slab == gpt_embed_slab(s)) return GPT_SLAB_EMBED;
    if (slab == gpt_final_slab(s)) return GPT_SLAB_FINAL;
    if (slab == gpt_head_slab(s)) return GPT_SLAB_HEAD;
    return GPT_SLAB_BLOCK;
}

size_t gpt_slab_numel(const gpt_shape *s, int slab) {
    switch (gpt_slab_kind_of(s, slab)) {
    case GPT_SLAB_EMBED: return embed_numel(s);
    case GPT_SLAB_FINAL: return 2 * (size_t)s->cfg.dim;
    case GPT_SLAB_HEAD: return wte_numel(s);
    default: return blocks_numel(s, slab - s->has_embed + 1) -
                    blocks_numel(s, slab - s->has_embed);
    }
}

size_t gpt_slab_offset(const gpt_shape *s, int slab) {
    const size_t blocks_start = s->has_embed ? embed_numel(s) : 0;
    const int first_block = s->has_embed, after_blocks = first_block + gpt_stage_layers(s);
    if (slab <= first_block) return slab == 0 ? 0 : blocks_start;
    if (slab <= after_blocks) return blocks_start + blocks_numel(s, slab - first_block);
    return blocks_start + blocks_numel(s, gpt_stage_layers(s)) +
           2 * (size_t)s->cfg.dim;   /* the HEAD copy, after the final LayerNorm */
}

size_t gpt_num_params(const gpt_shape *s) {
    const int last = gpt_num_slabs(s) - 1;
    return last < 0 ? 0 : gpt_slab_offset(s, last) + gpt_slab_numel(s, last);
}

int gpt_slab_in_whole(const gpt_shape *s, int slab) {
    switch (gpt_slab_kind_of(s, slab)) {
    case GPT_SLAB_EMBED:
    case GPT_SLAB_HEAD: return 0;
    case GPT_SLAB_FINAL: return s->cfg.layers + 1;
    default: return 1 + s->layer_begin + slab - s->has_embed;
    }
}

float *gpt_tied_weight(const gpt_shape *s, float *vec) {
    if (s->has_embed) return vec + gpt_slab_offset(s, gpt_embed_slab(s));
    if (s->has_head) return vec + gpt_slab_offset(s, gpt_head_slab(s));
    return NULL;
}

size_t gpt_tied_weight_numel(const gpt_shape *s) {
    return s->has_embed || s->has_head ? wte_numel(s) : 0;
}

gpt_block_layout gpt_block_offsets(const gpt_shape *s) {
    size_t C = s->cfg.dim, Cl = s->dim_local, Hl = s->hidden_local;
    gpt_block_layout t;
    size_t p = 0;
    t.ln1_w = p;  p += C;
    t.ln1_b = p;  p += C;
    t.qkv_w = p;  p += 3 * Cl * C;
    t.qkv_b = p;  p += 3 * Cl;
    t.proj_w = p; p += C * Cl;
    t.proj_b = p; p += C;
    t.ln2_w = p;  p += C;
    t.ln2_b = p;  p += C;
    t.fc_w = p;   p += Hl * C;
    t.fc_b = p;   p += Hl;
    t.fc2_w = p;  p += C * Hl;
    t.fc2_b = p;
    return t;
}

gpt_block_tensors gpt_block_view(const gpt_shape *s, float *slab) {
    const gpt_block_layout o = gpt_block_offsets(s);
    return (gpt_block_tensors){
        .ln1_w = slab + o.ln1_w, .ln1_b = slab + o.ln1_b, .qkv_w = slab + o.qkv_w,
        .qkv_b = slab + o.qkv_b, .proj_w = slab + o.proj_w, .proj_b = slab + o.proj_b,
        .ln2_w = slab + o.ln2_w, .ln2_b = slab + o.ln2_b, .fc_w = slab + o.fc_w,
        .fc_b = slab + o.fc_b, .fc2_w = slab + o.fc2_w, .fc2_b = slab + o.fc2_b};
}

/* ---- initialisation ---------------------------------------------------------------- */

/* What a parameter element is, found from its place in the vector, and how many
 * elements from it on are the same kind in a row: for the random kinds, the next
 * indices of the same unsplit tensor (a row of a TP slice, a whole tensor). */
enum init_kind { INIT_ZERO, INIT_ONE, INIT_NORMAL, INIT_NORMAL_RESIDUAL };
typedef struct {
    enum init_kind kind;
    uint64_t stream;        /* which unsplit tensor */
    uint64_t global_index;  /* index in the unsplit tensor */
    size_t run;             /* elements from here on that continue it */
} init_site;

static init_site constant(enum init_kind kind, size_t run) {
    return (init_site){kind, 0, 0, run};
}

static init_site random_run(enum init_kind kind, uint64_t stream, uint64_t global_index,
                            size_t run) {
    return (init_site){kind, stream, global_index, run};
}

/* The tied weight's element `index` (of this rank's vocab_local rows; the rows past the
 * vocabulary, a vocab-parallel slice's padding, come last). */
static init_site locate_wte(const gpt_shape *s, size_t index) {
    const size_t C = s->cfg.dim;
    const size_t real = s->cfg.vocab > s->vocab_start   /* real rows' elements here */
                            ? (size_t)(s->cfg.vocab - s->vocab_start) * C : 0;
    if (index >= real) return constant(INIT_ZERO, wte_numel(s) - index);
    const size_t end = real < wte_numel(s) ? real : wte_numel(s);
    return random_run(INIT_NORMAL, 1, (size_t)s->vocab_start * C + index, end - index);
}

/* Element `index` of block `layer` (in the whole model), this rank's TP slice. */
static init_site locate_in_block(const gpt_shape *s, int layer, size_t index) {
    const size_t C = s->cfg.dim;
    const size_t Cl = s->dim_local, Hl = s->hidden_local, r = s->tp_rank;
    const uint64_t base = 16 * ((uint64_t)layer + 1);
    if (index < C) return constant(INIT_ONE, C - index);                 /* ln1_w */
    index -= C;
    if (index < C) return constant(INIT_ZERO, C - index);                /* ln1_b */
    index -= C;
    if (index < 3 * Cl * C) {                                            /* qkv_w */
        /* Local rows are [this rank's Q heads, K heads, V heads]. */
        size_t row = index / C, col = index % C;
        size_t part = row / Cl, within = row % Cl;
        size_t global_row = part * C + r * Cl + within;
        return random_run(INIT_NORMAL, base + 0, global_row * C + col, C - col);
    }
    index -= 3 * Cl * C;
    if (index < 3 * Cl) return constant(INIT_ZERO, 3 * Cl - index);     /* qkv_b */
    index -= 3 * Cl;
    if (index < C * Cl) {                                                /* proj_w [C, Cl] */
        size_t row = index / Cl, col = index % Cl;
        return random_run(INIT_NORMAL_RESIDUAL, base + 1, row * C + r * Cl + col, Cl - col);
    }
    index -= C * Cl;
    if (index < C) return constant(INIT_ZERO, C - index);                /* proj_b */
    index -= C;
    if (index < C) return constant(INIT_ONE, C - index);                 /* ln2_w */
    index -= C;
    if (index < C) return constant(INIT_ZERO, C - index);                /* ln2_b */
    index -= C;
    if (index < Hl * C)                                                  /* fc_w [Hl, C] */
        return random_run(INIT_NORMAL, base + 2, r * Hl * C + index, Hl * C - index);
    index -= Hl * C;
    if (index < Hl) return constant(INIT_ZERO, Hl - index);              /* fc_b */
    index -= Hl;
    if (index < C * Hl) {                                                /* fc2_w [C, Hl] */
        size_t row = index / Hl, col = index % Hl;
        return random_run(INIT_NORMAL_RESIDUAL, base + 3, row * 4 * C + r * Hl + col, Hl - col);
    }
    index -= C * Hl;
    return constant(INIT_ZERO, C - index);                               /* fc2_b */
}

/* Streams: 1 wte (and its HEAD copy), 2 wpe, then 16 per layer (+0 qkv, +1 proj,
 * +2 fc, +3 fc2): the same value for the same element of the unsplit model, whatever
 * stage or slice holds it. `index` is in slab `slab` of the stage's vector. */
static init_site locate(const gpt_shape *s, int slab, size_t index) {
    const size_t C = s->cfg.dim;
    switch (gpt_slab_kind_of(s, slab)) {
    case GPT_SLAB_EMBED:
        if (index < wte_numel(s)) return locate_wte(s, index);
        index -= wte_numel(s);
        return random_run(INIT_NORMAL, 2, index, (size_t)s->cfg.ctx * C - index);
    case GPT_SLAB_HEAD: return locate_wte(s, index);
    case GPT_SLAB_FINAL:   /* weight then bias */
        return index < C ? constant(INIT_ONE, C - index) : constant(INIT_ZERO, 2 * C - index);
    default: return locate_in_block(s, s->layer_begin + slab - s->has_embed, index);
    }
}

/* out[0, n): n elements of the site's run */
static void fill_run(const init_site *site, uint64_t seed, float std, float residual_std,
                     size_t n, float *out) {
    switch (site->kind) {
    case INIT_ZERO: memset(out, 0, n * sizeof *out); break;
    case INIT_ONE: for (size_t k = 0; k < n; k++) out[k] = 1.0f; break;
    case INIT_NORMAL:
    case INIT_NORMAL_RESIDUAL:
        rng_normals(seed, site->stream, site->global_index, n,
                    site->kind == INIT_NORMAL ? std : residual_std, out);
        break;
    }
}

void gpt_init_params(const gpt_shape *s, uint64_t seed, size_t begin, size_t end,
                     float *out) {
    const float std = 0.02f;
    const float residual_std = 0.02f / sqrtf(2.0f * (float)s->cfg.layers);
    int slab = 0;
    for (size_t i = begin; i < end;) {
        while (i >= gpt_slab_offset(s, slab) + gpt_slab_numel(s, slab)) slab++;
        const init_site site = locate(s, slab, i - gpt_slab_offset(s, slab));
        const size_t n = site.run < end - i ? site.run : end - i;
        fill_run(&site, seed, std, residual_std, n, out + (i - begin));
        i += n;
    }
}

double gpt_flops_per_step(const gpt_config *cfg, int B, int T) {
    gpt_shape s = gpt_shape_make(cfg, 1, 0);
    double tokens = (double)B * T;
    double params = (double)gpt_num_params(&s) - (double)cfg->ctx * cfg->dim;
    double attention = 12.0 * cfg->layers * (double)T * cfg->dim;   /* per token */
    return tokens * (6.0 * params + attention);
}
