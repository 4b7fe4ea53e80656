/* The model on a chunk of every sequence (cp_model.h): the model's per-token ops on Tc
 * rows per sequence, and the CP group's attention. */
#include "cp_model.h"

#include <string.h>

#include "alloc.h"
#include "ops.h"
#include "tp_linear.h"

/* One block's activations over the chunk (N = B x Tc rows). */
typedef struct {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *saved;
    float *x_mid, *ln2, *ln2_mean, *ln2_rstd, *dgelu, *fch_gelu;
} chunk_acts;

struct cp_model {
    gpt_shape shape;          /* the model's slabs: whole, or this rank's TP slice */
    comm *tp;                 /* NULL: no tensor parallelism */
    int B, Tc, C, V;
    int Cl, Hl;               /* attention channels and MLP units on this TP rank */
    position_span span;
    cp_attention *attention;
    int *tokens, *targets;    /* [B, Tc] */
    float **x;                /* x[l]: block l's input; x[L]: the last block's output */
    chunk_acts *acts;         /* [L] */
    float *lnf, *lnf_mean, *lnf_rstd, *logits, *losses;
    /* backward scratch */
    float *dx, *d_ln, *d_atty, *d_qkv, *d_fch, *d_fch_gelu;
};

static float *acts(size_t n) { return mem_alloc(MEM_ACTIVATIONS, n * sizeof(float)); }

static void chunk_acts_alloc(const cp_model *m, chunk_acts *a, size_t N, size_t saved) {
    const size_t C = m->C, Cl = m->Cl, Hl = m->Hl;
    *a = (chunk_acts){.ln1 = acts(N * C), .ln1_mean = acts(N), .ln1_rstd = acts(N),
                      .qkv = acts(N * 3 * Cl), .atty = acts(N * Cl), .saved = acts(saved),
                      .x_mid = acts(N * C), .ln2 = acts(N * C), .ln2_mean = acts(N),
                      .ln2_rstd = acts(N), .dgelu = acts(N * Hl), .fch_gelu = acts(N * Hl)};
}

static void chunk_acts_free(chunk_acts *a) {
    float *all[] = {a->ln1, a->ln1_mean, a->ln1_rstd, a->qkv, a->atty, a->saved,
                    a->x_mid, a->ln2, a->ln2_mean, a->ln2_rstd, a->dgelu, a->fch_gelu};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) mem_free(all[i]);
}

cp_model *cp_model_create(const gpt_shape *shape, int B, position_span span,
                          cp_attention *attention, comm *tp) {
    cp_model *m = mem_alloc(MEM_OTHER, sizeof *m);
    const int L = shape->cfg.layers;
    m->shape = *shape;
    m->tp = tp;
    m->B = B, m->Tc = position_span_rows(&span), m->C = shape->cfg.dim;
    m->V = shape->cfg.vocab;
    m->Cl = shape->dim_local, m->Hl = shape->hidden_local;
    m->span = span;
    m->attention = attention;
    const size_t N = (size_t)B * m->Tc, C = m->C;
    m->tokens = mem_alloc(MEM_ACTIVATIONS, N * sizeof(int));
    m->targets = mem_alloc(MEM_ACTIVATIONS, N * sizeof(int));
    m->x = mem_alloc(MEM_OTHER, ((size_t)L + 1) * sizeof *m->x);
    for (int l = 0; l <= L; l++) m->x[l] = acts(N * C);
    m->acts = mem_alloc(MEM_OTHER, (size_t)L * sizeof *m->acts);
    for (int l = 0; l < L; l++)
        chunk_acts_alloc(m, &m->acts[l], N, cp_attention_saved_numel(attention));
    m->lnf = acts(N * C), m->lnf_mean = acts(N), m->lnf_rstd = acts(N);
    m->logits = acts(N * m->V), m->losses = acts(N);
    m->dx = acts(N * C), m->d_ln = acts(N * C), m->d_atty = acts(N * m->Cl);
    m->d_qkv = acts(N * 3 * m->Cl), m->d_fch = acts(N * m->Hl), m->d_fch_gelu = acts(N * m->Hl);
    return m;
}

void cp_model_free(cp_model *m) {
    if (!m) return;
    const int L = m->shape.cfg.layers;
    for (int l = 0; l <= L; l++) mem_free(m->x[l]);
    for (int l = 0; l < L; l++) chunk_acts_free(&m->acts[l]);
    void *rest[] = {m->tokens, m->targets, m->x, m->acts, m->lnf, m->lnf_mean, m->lnf_rstd,
                    m->logits, m->losses, m->dx, m->d_ln, m->d_atty, m->d_qkv, m->d_fch,
                    m->d_fch_gelu};
    for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++) mem_free(rest[i]);
    mem_free(m);
}

void cp_model_set_batch(cp_model *m, const int *tokens, const int *targets) {
    const int T = m->shape.cfg.ctx;
    for (int b = 0; b < m->B; b++) {
        int row = b * m->Tc;
        for (int k = 0; k < m->span.pieces; k++) {
            const size_t from = (size_t)b * T + m->span.start[k];
            memcpy(m->tokens + row, tokens + from, (size_t)m->span.len[k] * sizeof(int));
            memcpy(m->targets + row, targets + from, (size_t)m->span.len[k] * sizeof(int));
            row += m->span.len[k];
        }
    }
}

/* ---- pieces of the parameter vector ---------------------------------------------- */

static float *slab_of(const cp_model *m, const float *vec, int slab) {
    return (float *)vec + gpt_slab_offset(&m->shape, slab);
}
static float *wte_of(const cp_model *m, const float *vec) {
    return slab_of(m, vec, gpt_embed_slab(&m->shape));
}
static float *wpe_of(const cp_model *m, const float *vec) {
    return wte_of(m, vec) + (size_t)m->V * m->C;
}

/* out[row] += wpe[position of row] (forward), or dwpe[position] += dout[row] (backward):
 * each piece of the span adds its own positions, sequence by sequence */
static void positions(const cp_model *m, float *rows, float *wpe, int backward) {
    for (int b = 0; b < m->B; b++) {
        int row = b * m->Tc;
        for (int k = 0; k < m->span.pieces; k++) {
            float *x = rows + (size_t)row * m->C, *w = wpe + (size_t)m->span.start[k] * m->C;
            if (backward) position_backward(w, x, 1, m->span.len[k], m->C);
            else position_forward(x, w, 1, m->span.len[k], m->C);
            row += m->span.len[k];
        }
    }
}

/* ---- forward ------------------------------------------------------------------------ */

/* Megatron's block on the chunk (tp_linear.h: with a NULL group, the plain layers):
 *   ln1 -> QKV (column) -> attention across the chunks, my heads -> proj (row, g) -> + x
 *   ln2 -> fc (column) -> GELU -> fc2 (row, g) -> + x_mid */
static void block_forward(cp_model *m, int l, const gpt_block_tensors *w) {
    const int N = m->B * m->Tc, C = m->C, Cl = m->Cl, Hl = m->Hl;
    const precision P = PRECISION_FP32;
    chunk_acts *a = &m->acts[l];
    const float *x_in = m->x[l];
    float *x_out = m->x[l + 1];
    layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x_in, w->ln1_w, w->ln1_b, N, C);
    column_parallel_forward(P, a->qkv, a->ln1, w->qkv_w, w->qkv_b, N, C, 3 * Cl);
    cp_attention_forward(m->attention, a->atty, a->saved, a->qkv);   /* the only talk */
    row_parallel_forward(m->tp, P, a->x_mid, a->atty, w->proj_w, w->proj_b, N, Cl, C);
    vec_add(a->x_mid, x_in, (size_t)N * C);
    layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->x_mid, w->ln2_w, w->ln2_b, N, C);
    column_parallel_forward(P, a->dgelu, a->ln2, w->fc_w, w->fc_b, N, C, Hl);
    gelu_forward(a->fch_gelu, a->dgelu, (size_t)N * Hl);
    row_parallel_forward(m->tp, P, x_out, a->fch_gelu, w->fc2_w, w->fc2_b, N, Hl, C);
    vec_add(x_out, a->x_mid, (size_t)N * C);
}

double cp_model_forward(cp_model *m, const float *params) {
    const gpt_shape *s = &m->shape;
    const int N = m->B * m->Tc, C = m->C, L = s->cfg.layers;
    embedding_forward(m->x[0], m->tokens, wte_of(m, params), N, C, 0, m->V);
    positions(m, m->x[0], wpe_of(m, params), 0);
    for (int l = 0; l < L; l++) {
        gpt_block_tensors w = gpt_block_view(s, slab_of(m, params, gpt_block_slab(s, l)));
        block_forward(m, l, &w);
    }
    const float *lnf = slab_of(m, params, gpt_final_slab(s));
    layernorm_forward(m->lnf, m->lnf_mean, m->lnf_rstd, m->x[L], lnf, lnf + C, N, C);
    linear_forward(m->logits, m->lnf, wte_of(m, params), NULL, N, C, m->V);   /* tied */
    crossentropy_forward(m->losses, m->logits, m->logits, m->targets, N, m->V);
    return vec_sum(m->losses, (size_t)N);
}

/* ---- backward ----------------------------------------------------------------------- */

/* dx: in d(block output), out d(block input), as the model's block_backward walks it. */
static void block_backward(cp_model *m, int l, const gpt_block_tensors *w,
                           gpt_block_tensors *g) {
    const int N = m->B * m->Tc, C = m->C, Cl = m->Cl, Hl = m->Hl;
    const precision P = PRECISION_FP32;
    chunk_acts *a = &m->acts[l];
    row_parallel_backward(P, m->d_fch_gelu, g->fc2_w, g->fc2_b, m->dx, a->fch_gelu, w->fc2_w,
                          N, Hl, C);
    gelu_backward(m->d_fch, a->dgelu, m->d_fch_gelu, (size_t)N * Hl);
    column_parallel_backward(m->tp, P, m->d_ln, g->fc_w, g->fc_b, m->d_fch, a->ln2, w->fc_w, N,
                             C, Hl);   /* f: d(ln2) summed over the TP ranks */
    layernorm_backward(m->dx, g->ln2_w, g->ln2_b, m->d_ln, a->x_mid, w->ln2_w, a->ln2_mean,
                       a->ln2_rstd, N, C);   /* dx: d(x_mid) now */
    row_parallel_backward(P, m->d_atty, g->proj_w, g->proj_b, m->dx, a->atty, w->proj_w, N,
                          Cl, C);
    cp_attention_backward(m->attention, m->d_qkv, m->d_atty, a->qkv, a->atty, a->saved);
    column_parallel_backward(m->tp, P, m->d_ln, g->qkv_w, g->qkv_b, m->d_qkv, a->ln1, w->qkv_w,
                             N, C, 3 * Cl);
    layernorm_backward(m->dx, g->ln1_w, g->ln1_b, m->d_ln, m->x[l], w->ln1_w, a->ln1_mean,
                       a->ln1_rstd, N, C);
}

void cp_model_backward(cp_model *m, const float *params, float *grads, float dloss) {
    const gpt_shape *s = &m->shape;
    const int N = m->B * m->Tc, C = m->C, L = s->cfg.layers;
    const float *lnf = slab_of(m, params, gpt_final_slab(s));
    float *dlnf = slab_of(m, grads, gpt_final_slab(s));
    /* logits hold the probabilities: d logits in place, then the tied head */
    crossentropy_backward(m->logits, m->logits, m->targets, dloss, N, m->V);
    linear_backward(m->d_ln, wte_of(m, grads), NULL, m->logits, m->lnf, wte_of(m, params), N,
                    C, m->V);
    vec_zero(m->dx, (size_t)N * C);
    layernorm_backward(m->dx, dlnf, dlnf + C, m->d_ln, m->x[L], lnf, m->lnf_mean, m->lnf_rstd,
                       N, C);
    for (int l = L - 1; l >= 0; l--) {
        const int slab = gpt_block_slab(s, l);
        gpt_block_tensors w = gpt_block_view(s, slab_of(m, params, slab));
        gpt_block_tensors g = gpt_block_view(s, slab_of(m, grads, slab));
        block_backward(m, l, &w, &g);
    }
    embedding_backward(wte_of(m, grads), m->dx, m->tokens, N, C, 0, m->V);
    positions(m, m->dx, wpe_of(m, grads), 1);
}
