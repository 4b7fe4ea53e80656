#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "ops.h"
#include "rng.h"
#include "vocab_parallel.h"

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
    return s;
}

void gpt_shape_split_vocab(gpt_shape *s) {
    s->vocab_parallel = 1;
    s->vocab_local = (s->cfg.vocab + s->tp_size - 1) / s->tp_size;
    s->vocab_start = s->tp_rank * s->vocab_local;
}

int gpt_num_slabs(const gpt_shape *s) { return s->cfg.layers + 2; }

static size_t block_numel(const gpt_shape *s) {
    size_t C = s->cfg.dim, Cl = s->dim_local, Hl = s->hidden_local;
    return 2 * C + (3 * Cl * C + 3 * Cl) + (C * Cl + C) + 2 * C + (Hl * C + Hl) +
           (C * Hl + C);
}

size_t gpt_slab_numel(const gpt_shape *s, int slab) {
    size_t C = s->cfg.dim;
    if (slab == 0) return (size_t)s->vocab_local * C + (size_t)s->cfg.ctx * C;
    if (slab == gpt_final_slab(s)) return 2 * C;
    return block_numel(s);
}

size_t gpt_slab_offset(const gpt_shape *s, int slab) {
    if (slab == 0) return 0;
    return gpt_slab_numel(s, 0) + (size_t)(slab - 1) * block_numel(s);
}

size_t gpt_num_params(const gpt_shape *s) {
    return gpt_slab_offset(s, gpt_final_slab(s)) + gpt_slab_numel(s, gpt_final_slab(s));
}

gpt_block_tensors gpt_block_view(const gpt_shape *s, float *slab) {
    size_t C = s->cfg.dim, Cl = s->dim_local, Hl = s->hidden_local;
    gpt_block_tensors t;
    float *p = slab;
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

/* ---- initialisation ---------------------------------------------------------------- */

/* What a parameter element is, found from its place in the vector. */
enum init_kind { INIT_ZERO, INIT_ONE, INIT_NORMAL, INIT_NORMAL_RESIDUAL };
typedef struct {
    enum init_kind kind;
    uint64_t stream;        /* which unsplit tensor */
    uint64_t global_index;  /* index in the unsplit tensor */
} init_site;

/* Streams: 1 wte, 2 wpe, then 16 per layer (+0 qkv, +1 proj, +2 fc, +3 fc2). */
static init_site locate(const gpt_shape *s, size_t index) {
    const size_t C = s->cfg.dim, V_local = s->vocab_local;
    if (index < V_local * C) {
        size_t global_row = s->vocab_start + index / C;   /* vocab-parallel slice */
        if (global_row >= (size_t)s->cfg.vocab) return (init_site){INIT_ZERO, 0, 0};
        return (init_site){INIT_NORMAL, 1, global_row * C + index % C};
    }
    index -= V_local * C;
    if (index < (size_t)s->cfg.ctx * C) return (init_site){INIT_NORMAL, 2, index};
    index -= (size_t)s->cfg.ctx * C;
    size_t per_block = block_numel(s);
    size_t layer = index / per_block;
    if (layer >= (size_t)s->cfg.layers) {   /* final LayerNorm: weight then bias */
        index -= layer * per_block;
        return (init_site){index < C ? INIT_ONE : INIT_ZERO, 0, 0};
    }
    index -= layer * per_block;
    const size_t Cl = s->dim_local, Hl = s->hidden_local, r = s->tp_rank;
    const uint64_t base = 16 * (layer + 1);
    if (index < C) return (init_site){INIT_ONE, 0, 0};               /* ln1_w */
    index -= C;
    if (index < C) return (init_site){INIT_ZERO, 0, 0};              /* ln1_b */
    index -= C;
    if (index < 3 * Cl * C) {                                        /* qkv_w */
        /* Local rows are [this rank's Q heads, K heads, V heads]. */
        size_t row = index / C, col = index % C;
        size_t part = row / Cl, within = row % Cl;
        size_t global_row = part * C + r * Cl + within;
        return (init_site){INIT_NORMAL, base + 0, global_row * C + col};
    }
    index -= 3 * Cl * C;
    if (index < 3 * Cl) return (init_site){INIT_ZERO, 0, 0};         /* qkv_b */
    index -= 3 * Cl;
    if (index < C * Cl) {                                            /* proj_w [C, Cl] */
        size_t row = index / Cl, col = index % Cl;
        return (init_site){INIT_NORMAL_RESIDUAL, base + 1, row * C + r * Cl + col};
    }
    index -= C * Cl;
    if (index < C) return (init_site){INIT_ZERO, 0, 0};              /* proj_b */
    index -= C;
    if (index < C) return (init_site){INIT_ONE, 0, 0};               /* ln2_w */
    index -= C;
    if (index < C) return (init_site){INIT_ZERO, 0, 0};              /* ln2_b */
    index -= C;
    if (index < Hl * C)                                              /* fc_w [Hl, C] */
        return (init_site){INIT_NORMAL, base + 2, r * Hl * C + index};
    index -= Hl * C;
    if (index < Hl) return (init_site){INIT_ZERO, 0, 0};             /* fc_b */
    index -= Hl;
    if (index < C * Hl) {                                            /* fc2_w [C, Hl] */
        size_t row = index / Hl, col = index % Hl;
        return (init_site){INIT_NORMAL_RESIDUAL, base + 3, row * 4 * C + r * Hl + col};
    }
    return (init_site){INIT_ZERO, 0, 0};                             /* fc2_b */
}

void gpt_init_params(const gpt_shape *s, uint64_t seed, size_t begin, size_t end,
                     float *out) {
    const float std = 0.02f;
    const float residual_std = 0.02f / sqrtf(2.0f * (float)s->cfg.layers);
    for (size_t i = begin; i < end; i++) {
        init_site site = locate(s, i);
        float value = 0.0f;
        switch (site.kind) {
        case INIT_ZERO: value = 0.0f; break;
        case INIT_ONE: value = 1.0f; break;
        case INIT_NORMAL: value = std * rng_normal(seed, site.stream, site.global_index); break;
        case INIT_NORMAL_RESIDUAL:
            value = residual_std * rng_normal(seed, site.stream, site.global_index);
            break;
        }
        out[i - begin] = value;
    }
}

/* ---- the model instance --------------------------------------------------------- */

typedef struct {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty;
    float *x_mid;   /* residual stream after attention */
    float *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu;
} block_acts;

struct gpt_model {
    gpt_shape shape;
    gpt_model_options opts;
    int B, T;
    int *tokens, *targets;   /* on the device */
    float **x;               /* x[l]: input of block l; x[L]: output of the last block */
    block_acts *acts;        /* one per layer, or a single shared one when checkpointing */
    float *lnf, *lnf_mean, *lnf_rstd, *logits, *losses;
    /* backward scratch, shared by all layers */
    float *dx;               /* gradient of the residual stream, walked back in place */
    float *d_x_mid, *d_ln, *d_atty, *d_qkv, *d_att, *d_fch, *d_fch_gelu;
};

static float *alloc_acts(size_t n) {
    return mem_alloc_on(MEM_DEVICE, MEM_ACTIVATIONS, n * sizeof(float));
}

static void block_acts_alloc(block_acts *a, const gpt_shape *s, int B, int T) {
    size_t N = (size_t)B * T, C = s->cfg.dim;
    a->ln1 = alloc_acts(N * C);
    a->ln1_mean = alloc_acts(N);
    a->ln1_rstd = alloc_acts(N);
    a->qkv = alloc_acts(N * 3 * s->dim_local);
    a->att = alloc_acts((size_t)B * s->heads_local * T * T);
    a->atty = alloc_acts(N * s->dim_local);
    a->x_mid = alloc_acts(N * C);
    a->ln2 = alloc_acts(N * C);
    a->ln2_mean = alloc_acts(N);
    a->ln2_rstd = alloc_acts(N);
    a->fch = alloc_acts(N * s->hidden_local);
    a->fch_gelu = alloc_acts(N * s->hidden_local);
}

static void block_acts_free(block_acts *a) {
    float *all[] = {a->ln1, a->ln1_mean, a->ln1_rstd, a->qkv, a->att, a->atty,
                    a->x_mid, a->ln2, a->ln2_mean, a->ln2_rstd, a->fch, a->fch_gelu};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) mem_free(all[i]);
}

gpt_model *gpt_model_create(const gpt_shape *s, int B, int T,
                            const gpt_model_options *opts) {
    gpt_model *m = calloc(1, sizeof *m);
    if (!m) { fprintf(stderr, "error: out of memory\n"); exit(1); }
    m->shape = *s;
    if (opts) m->opts = *opts;
    m->B = B;
    m->T = T;
    const size_t N = (size_t)B * T, C = s->cfg.dim, L = s->cfg.layers;
    m->tokens = mem_alloc_on(MEM_DEVICE, MEM_ACTIVATIONS, N * sizeof(int));
    m->targets = mem_alloc_on(MEM_DEVICE, MEM_ACTIVATIONS, N * sizeof(int));
    m->x = calloc(L + 1, sizeof *m->x);
    for (size_t l = 0; l <= L; l++) m->x[l] = alloc_acts(N * C);
    size_t n_acts = m->opts.checkpoint_activations ? 1 : L;
    m->acts = calloc(n_acts, sizeof *m->acts);
    for (size_t l = 0; l < n_acts; l++) block_acts_alloc(&m->acts[l], s, B, T);
    m->lnf = alloc_acts(N * C);
    m->lnf_mean = alloc_acts(N);
    m->lnf_rstd = alloc_acts(N);
    m->logits = alloc_acts(N * (size_t)s->vocab_local);
    m->losses = alloc_acts(N);
    m->dx = alloc_acts(N * C);
    m->d_x_mid = alloc_acts(N * C);
    m->d_ln = alloc_acts(N * C);
    m->d_atty = alloc_acts(N * s->dim_local);
    m->d_qkv = alloc_acts(N * 3 * s->dim_local);
    m->d_att = alloc_acts((size_t)B * s->heads_local * T * T);
    m->d_fch = alloc_acts(N * s->hidden_local);
    m->d_fch_gelu = alloc_acts(N * s->hidden_local);
    return m;
}

void gpt_model_free(gpt_model *m) {
    if (!m) return;
    const int L = m->shape.cfg.layers;
    for (int l = 0; l <= L; l++) mem_free(m->x[l]);
    int n_acts = m->opts.checkpoint_activations ? 1 : L;
    for (int l = 0; l < n_acts; l++) block_acts_free(&m->acts[l]);
    float *rest[] = {m->lnf, m->lnf_mean, m->lnf_rstd, m->logits, m->losses, m->dx,
                     m->d_x_mid, m->d_ln, m->d_atty, m->d_qkv, m->d_att, m->d_fch,
                     m->d_fch_gelu};
    for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++) mem_free(rest[i]);
    mem_free(m->tokens);
    mem_free(m->targets);
    free(m->x);
    free(m->acts);
    free(m);
}

const gpt_shape *gpt_model_shape(const gpt_model *m) { return &m->shape; }

void gpt_set_batch(gpt_model *m, const int *tokens, const int *targets) {
    size_t bytes = (size_t)m->B * m->T * sizeof(int);
    ops_upload(m->tokens, tokens, bytes);
    ops_upload(m->targets, targets, bytes);
}

static block_acts *acts_of(gpt_model *m, int layer) {
    return &m->acts[m->opts.checkpoint_activations ? 0 : layer];
}

/* Megatron's g operator in forward and f operator in backward: sum the partial
 * results of the tensor-parallel ranks. Nothing to do without TP. */
static void tp_allreduce(gpt_model *m, float *buf, size_t count) {
    if (m->opts.tp && comm_size(m->opts.tp) > 1)
        comm_allreduce(m->opts.tp, buf, count, COMM_F32, COMM_SUM);
}

/* ---- forward ---------------------------------------------------------------------- */

void gpt_embed_forward(gpt_model *m, const float *embed) {
    const gpt_shape *s = &m->shape;
    const int N = m->B * m->T, C = s->cfg.dim;
    const float *wte = embed, *wpe = embed + (size_t)s->vocab_local * C;
    embedding_forward(m->x[0], m->tokens, wte, N, C, s->vocab_start, s->vocab_local);
    /* vocab-parallel: each rank embedded only its tokens; the sum is the embedding */
    if (s->vocab_parallel) tp_allreduce(m, m->x[0], (size_t)N * C);
    position_forward(m->x[0], wpe, m->B, m->T, C);
}

void gpt_block_forward(gpt_model *m, int layer, const float *block) {
    const gpt_shape *s = &m->shape;
    const int B = m->B, T = m->T, N = B * T, C = s->cfg.dim;
    const int Cl = s->dim_local, Hl = s->hidden_local;
    gpt_block_tensors p = gpt_block_view(s, (float *)block);
    block_acts *a = acts_of(m, layer);
    const float *x_in = m->x[layer];
    float *x_out = m->x[layer + 1];
    /* Row-parallel biases are added by one TP rank only, so the sum counts them once. */
    const int adds_bias = s->tp_rank == 0;

    layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x_in, p.ln1_w, p.ln1_b, N, C);
    linear_forward(a->qkv, a->ln1, p.qkv_w, p.qkv_b, N, C, 3 * Cl);
    attention_forward(a->atty, a->att, a->qkv, B, T, Cl, s->heads_local);
    linear_forward(a->x_mid, a->atty, p.proj_w, adds_bias ? p.proj_b : NULL, N, Cl, C);
    tp_allreduce(m, a->x_mid, (size_t)N * C);
    vec_add(a->x_mid, x_in, (size_t)N * C);

    layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->x_mid, p.ln2_w, p.ln2_b, N, C);
    linear_forward(a->fch, a->ln2, p.fc_w, p.fc_b, N, C, Hl);
    gelu_forward(a->fch_gelu, a->fch, (size_t)N * Hl);
    linear_forward(x_out, a->fch_gelu, p.fc2_w, adds_bias ? p.fc2_b : NULL, N, Hl, C);
    tp_allreduce(m, x_out, (size_t)N * C);
    vec_add(x_out, a->x_mid, (size_t)N * C);
}

float gpt_head_forward(gpt_model *m, const float *final_ln, const float *embed) {
    const gpt_shape *s = &m->shape;
    const int N = m->B * m->T, C = s->cfg.dim, V = s->cfg.vocab;
    layernorm_forward(m->lnf, m->lnf_mean, m->lnf_rstd, m->x[s->cfg.layers], final_ln,
                      final_ln + C, N, C);
    if (!s->vocab_parallel) {
        linear_forward(m->logits, m->lnf, embed, NULL, N, C, V);   /* tied: wte is [V, C] */
        crossentropy_forward(m->losses, m->logits, m->logits, m->targets, N, V);
        return (float)(vec_sum(m->losses, (size_t)N) / N);
    }
    /* Vocab-parallel head: this rank's wte rows give its columns of the logits, and the
     * loss is assembled from per-row maxima and sums: the full logits never meet. The
     * lnf input is replicated (Megatron's f: identity forward, all-reduce backward). */
    linear_forward(m->logits, m->lnf, embed, NULL, N, C, s->vocab_local);
    vocab_parallel_crossentropy_forward(m->opts.tp, m->losses, m->logits, m->logits,
                                        m->targets, vocab_slice_of(s, N));
    return (float)(vec_sum(m->losses, (size_t)N) / N);   /* the same on every tp rank */
}

float gpt_forward(gpt_model *m, const float *params) {
    const gpt_shape *s = &m->shape;
    gpt_embed_forward(m, params);
    for (int l = 0; l < s->cfg.layers; l++)
        gpt_block_forward(m, l, params + gpt_slab_offset(s, gpt_block_slab(l)));
    return gpt_head_forward(m, params + gpt_slab_offset(s, gpt_final_slab(s)), params);
}

/* ---- backward --------------------------------------------------------------------- */

void gpt_head_backward(gpt_model *m, const float *final_ln, const float *embed,
                       float *final_ln_grad, float *embed_grad, float dloss) {
    const gpt_shape *s = &m->shape;
    const int N = m->B * m->T, C = s->cfg.dim, V = s->cfg.vocab;
    /* logits hold the probabilities now; turn them into d logits in place */
    if (!s->vocab_parallel) {
        crossentropy_backward(m->logits, m->logits, m->targets, dloss, N, V);
        linear_backward(m->d_ln, embed_grad, NULL, m->logits, m->lnf, embed, N, C, V);
    } else {
        vocab_parallel_crossentropy_backward(m->logits, m->logits, m->targets, dloss,
                                             vocab_slice_of(s, N));
        linear_backward(m->d_ln, embed_grad, NULL, m->logits, m->lnf, embed, N, C,
                        s->vocab_local);
        /* d(lnf) summed over this rank's vocabulary only: f's backward all-reduce */
        tp_allreduce(m, m->d_ln, (size_t)N * C);
    }
    vec_zero(m->dx, (size_t)N * C);
    layernorm_backward(m->dx, final_ln_grad, final_ln_grad + C, m->d_ln,
                       m->x[s->cfg.layers], final_ln, m->lnf_mean, m->lnf_rstd, N, C);
}

void gpt_block_backward(gpt_model *m, int layer, const float *block, float *block_grad) {
    const gpt_shape *s = &m->shape;
    const int B = m->B, T = m->T, N = B * T, C = s->cfg.dim;
    const int Cl = s->dim_local, Hl = s->hidden_local;
    if (m->opts.checkpoint_activations) gpt_block_forward(m, layer, block);  /* recompute */
    gpt_block_tensors p = gpt_block_view(s, (float *)block);
    gpt_block_tensors g = gpt_block_view(s, block_grad);
    block_acts *a = acts_of(m, layer);
    const float *x_in = m->x[layer];
    float *dx = m->dx;   /* in: d(block output); out: d(block input) */

    /* MLP branch: out = x_mid + fc2(gelu(fc(ln2(x_mid)))) */
    vec_copy(m->d_x_mid, dx, (size_t)N * C);
    linear_backward(m->d_fch_gelu, g.fc2_w, g.fc2_b, dx, a->fch_gelu, p.fc2_w, N, Hl, C);
    gelu_backward(m->d_fch, a->fch, m->d_fch_gelu, (size_t)N * Hl);
    linear_backward(m->d_ln, g.fc_w, g.fc_b, m->d_fch, a->ln2, p.fc_w, N, C, Hl);
    tp_allreduce(m, m->d_ln, (size_t)N * C);
    layernorm_backward(m->d_x_mid, g.ln2_w, g.ln2_b, m->d_ln, a->x_mid, p.ln2_w,
                       a->ln2_mean, a->ln2_rstd, N, C);

    /* attention branch: x_mid = x_in + proj(attention(qkv(ln1(x_in)))) */
    vec_copy(dx, m->d_x_mid, (size_t)N * C);
    linear_backward(m->d_atty, g.proj_w, g.proj_b, m->d_x_mid, a->atty, p.proj_w, N, Cl, C);
    attention_backward(m->d_qkv, m->d_att, m->d_atty, a->qkv, a->att, B, T, Cl,
                       s->heads_local);
    linear_backward(m->d_ln, g.qkv_w, g.qkv_b, m->d_qkv, a->ln1, p.qkv_w, N, C, 3 * Cl);
    tp_allreduce(m, m->d_ln, (size_t)N * C);
    layernorm_backward(dx, g.ln1_w, g.ln1_b, m->d_ln, x_in, p.ln1_w, a->ln1_mean,
                       a->ln1_rstd, N, C);
}

void gpt_embed_backward(gpt_model *m, float *embed_grad) {
    const gpt_shape *s = &m->shape;
    const int N = m->B * m->T, C = s->cfg.dim;
    embedding_backward(embed_grad, m->dx, m->tokens, N, C, s->vocab_start, s->vocab_local);
    position_backward(embed_grad + (size_t)s->vocab_local * C, m->dx, m->B, m->T, C);
}

void gpt_backward(gpt_model *m, const float *params, float *grads, float dloss,
                  gpt_slab_ready_fn on_slab_ready, void *ctx) {
    const gpt_shape *s = &m->shape;
    const int final_slab = gpt_final_slab(s);
    const size_t final_offset = gpt_slab_offset(s, final_slab);
    gpt_head_backward(m, params + final_offset, params, grads + final_offset, grads, dloss);
    if (on_slab_ready) on_slab_ready(ctx, final_slab);
    for (int l = s->cfg.layers - 1; l >= 0; l--) {
        size_t offset = gpt_slab_offset(s, gpt_block_slab(l));
        gpt_block_backward(m, l, params + offset, grads + offset);
        if (on_slab_ready) on_slab_ready(ctx, gpt_block_slab(l));
    }
    gpt_embed_backward(m, grads);
    if (on_slab_ready) on_slab_ready(ctx, 0);
}

double gpt_flops_per_step(const gpt_config *cfg, int B, int T) {
    gpt_shape s = gpt_shape_make(cfg, 1, 0);
    double tokens = (double)B * T;
    double params = (double)gpt_num_params(&s) - (double)cfg->ctx * cfg->dim;
    double attention = 12.0 * cfg->layers * (double)T * cfg->dim;   /* per token */
    return tokens * (6.0 * params + attention);
}
