/* The model instance: activations in micro-batch slots, and the forward and backward
 * passes of a stage (model.h). */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "ops.h"
#include "ops_mixed.h"
#include "tp_linear.h"
#include "vocab_parallel.h"

/* ---- the model instance --------------------------------------------------------- */

/* Activations and their gradients are held in the model's precision (void *: elements
 * of m->p); LayerNorm statistics and the per-token losses are fp32 in every precision
 * (float *). */
typedef struct {
    void *ln1, *qkv, *att, *atty;
    float *ln1_mean, *ln1_rstd;
    void *x_mid;       /* residual stream after attention */
    void *ln2;
    float *ln2_mean, *ln2_rstd;
    void *dgelu;       /* fc's output, replaced by GELU's derivative there (gelu_forward) */
    void *fch_gelu;    /* GELU's output, fc2's input */
} block_acts;

/* What a block's weight gradients need from its backward when they are computed
 * later (gpt_backward_weights): the output gradient of each of its four linears. */
typedef struct {
    void *d_fc2_out, *d_fch, *d_proj_out, *d_qkv;
} block_douts;

/* One micro-batch's activations on this stage. */
typedef struct {
    int *tokens, *targets;   /* on the device */
    void **x;                /* x[i]: input of the stage's block i; x[n]: its output */
    block_acts *acts;        /* one per block (none when checkpointing: see below) */
    void *lnf, *logits;      /* last stage only */
    float *lnf_mean, *lnf_rstd, *losses;
    void *d_out;             /* d(output) received from the next stage */
    void *d_in;              /* d(input), to send to the previous stage (first stage
                                with split backward: what the embedding's W needs) */
    block_douts *douts;      /* split backward only: per block, allocated on first use */
} micro_slot;

struct gpt_model {
    gpt_shape shape;
    gpt_model_options opts;
    precision p;             /* opts.precision */
    int B, T;
    int max_slots;
    micro_slot *slots;       /* [max_slots]; a slot's x is NULL until its first use */
    micro_slot *slot;        /* the current one */
    block_acts *recompute;   /* checkpointing: one block's activations, rebuilt in backward */
    int *host_batch;         /* host staging for tokens and targets: 2 x B*T */
    /* backward scratch, shared by all blocks and slots */
    void *dx;                /* gradient of the residual stream, walked back in place */
    void *d_ln, *d_atty, *d_qkv, *d_att, *d_fch, *d_fch_gelu;
};

/* n activations in the model's precision, or n fp32 statistics */
static void *alloc_acts(const gpt_model *m, size_t n) {
    return mem_alloc_on(MEM_DEVICE, MEM_ACTIVATIONS, n * precision_bytes(m->p));
}

static float *alloc_stats(size_t n) {
    return mem_alloc_on(MEM_DEVICE, MEM_ACTIVATIONS, n * sizeof(float));
}

static void block_acts_alloc(const gpt_model *m, block_acts *a) {
    const gpt_shape *s = &m->shape;
    size_t N = (size_t)m->B * m->T, C = s->cfg.dim;
    a->ln1 = alloc_acts(m, N * C);
    a->ln1_mean = alloc_stats(N);
    a->ln1_rstd = alloc_stats(N);
    a->qkv = alloc_acts(m, N * 3 * s->dim_local);
    a->att = alloc_acts(m, (size_t)m->B * s->heads_local * m->T * m->T);
    a->atty = alloc_acts(m, N * s->dim_local);
    a->x_mid = alloc_acts(m, N * C);
    a->ln2 = alloc_acts(m, N * C);
    a->ln2_mean = alloc_stats(N);
    a->ln2_rstd = alloc_stats(N);
    a->dgelu = alloc_acts(m, N * s->hidden_local);
    a->fch_gelu = alloc_acts(m, N * s->hidden_local);
}

static void block_acts_free(block_acts *a) {
    void *all[] = {a->ln1, a->ln1_mean, a->ln1_rstd, a->qkv, a->att, a->atty,
                   a->x_mid, a->ln2, a->ln2_mean, a->ln2_rstd, a->dgelu, a->fch_gelu};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) mem_free(all[i]);
}

static void slot_alloc(gpt_model *m, micro_slot *k) {
    const gpt_shape *s = &m->shape;
    const size_t N = (size_t)m->B * m->T, C = s->cfg.dim;
    const int blocks = gpt_stage_layers(s);
    k->tokens = mem_alloc_on(MEM_DEVICE, MEM_ACTIVATIONS, N * sizeof(int));
    k->targets = mem_alloc_on(MEM_DEVICE, MEM_ACTIVATIONS, N * sizeof(int));
    k->x = mem_alloc(MEM_OTHER, ((size_t)blocks + 1) * sizeof *k->x);
    for (int i = 0; i <= blocks; i++) k->x[i] = alloc_acts(m, N * C);
    if (!m->opts.checkpoint_activations) {
        k->acts = mem_alloc(MEM_OTHER, (size_t)blocks * sizeof *k->acts);
        for (int i = 0; i < blocks; i++) block_acts_alloc(m, &k->acts[i]);
    }
    if (!s->has_head) k->d_out = alloc_acts(m, N * C);
    if (!s->has_embed) k->d_in = alloc_acts(m, N * C);
    if (s->has_head) {
        k->lnf = alloc_acts(m, N * C);
        k->lnf_mean = alloc_stats(N);
        k->lnf_rstd = alloc_stats(N);
        k->logits = alloc_acts(m, N * (size_t)s->vocab_local);
        k->losses = alloc_stats(N);
    }
}

static void slot_free(gpt_model *m, micro_slot *k) {
    if (!k->x) return;
    const int blocks = gpt_stage_layers(&m->shape);
    for (int i = 0; i <= blocks; i++) mem_free(k->x[i]);
    if (k->acts)
        for (int i = 0; i < blocks; i++) block_acts_free(&k->acts[i]);
    if (k->douts)
        for (int i = 0; i < blocks; i++) {
            block_douts *d = &k->douts[i];
            void *kept[] = {d->d_fc2_out, d->d_fch, d->d_proj_out, d->d_qkv};
            for (size_t j = 0; j < sizeof kept / sizeof kept[0]; j++) mem_free(kept[j]);
        }
    void *rest[] = {k->lnf, k->lnf_mean, k->lnf_rstd, k->logits, k->losses, k->d_out,
                    k->d_in};
    for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++) mem_free(rest[i]);
    mem_free(k->douts);
    mem_free(k->tokens);
    mem_free(k->targets);
    mem_free(k->x);
    mem_free(k->acts);
}

gpt_model *gpt_model_create(const gpt_shape *s, int B, int T,
                            const gpt_model_options *opts) {
    /* bookkeeping through the accounting allocator too (MEM_OTHER): a rank stopped by
     * a failure elsewhere gives it back with its buffers */
    gpt_model *m = mem_alloc(MEM_OTHER, sizeof *m);
    m->shape = *s;
    if (opts) m->opts = *opts;
    m->p = m->opts.precision;
    if (m->p != PRECISION_FP32 && s->vocab_parallel) {
        fprintf(stderr, "error: a vocab-parallel head computes in fp32 only, not %s\n",
                precision_name(m->p));
        exit(2);
    }
    if (m->opts.mlp && (m->p != PRECISION_FP32 || s->tp_size > 1)) {
        fprintf(stderr, "error: a replaced MLP (mixture of experts) runs in fp32 without TP\n");
        exit(2);
    }
    m->B = B;
    m->T = T;
    m->max_slots = m->opts.max_slots > 0 ? m->opts.max_slots : 1;
    m->host_batch = mem_alloc(MEM_OTHER, 2 * (size_t)B * T * sizeof(int));
    m->slots = mem_alloc(MEM_OTHER, (size_t)m->max_slots * sizeof *m->slots);
    const size_t N = (size_t)B * T, C = s->cfg.dim;
    gpt_use_slot(m, 0);
    if (m->opts.checkpoint_activations) {
        m->recompute = mem_alloc(MEM_OTHER, sizeof *m->recompute);
        block_acts_alloc(m, m->recompute);
    }
    m->dx = alloc_acts(m, N * C);
    m->d_ln = alloc_acts(m, N * C);
    m->d_atty = alloc_acts(m, N * s->dim_local);
    m->d_qkv = alloc_acts(m, N * 3 * s->dim_local);
    m->d_att = alloc_acts(m, (size_t)B * s->heads_local * T * T);
    m->d_fch = alloc_acts(m, N * s->hidden_local);
    m->d_fch_gelu = alloc_acts(m, N * s->hidden_local);
    return m;
}

void gpt_model_free(gpt_model *m) {
    if (!m) return;
    for (int k = 0; k < m->max_slots; k++) slot_free(m, &m->slots[k]);
    if (m->recompute) block_acts_free(m->recompute);
    void *rest[] = {m->dx, m->d_ln, m->d_atty, m->d_qkv, m->d_att, m->d_fch,
                    m->d_fch_gelu};
    for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++) mem_free(rest[i]);
    mem_free(m->recompute);
    mem_free(m->host_batch);
    mem_free(m->slots);
    mem_free(m);
}

const gpt_shape *gpt_model_shape(const gpt_model *m) { return &m->shape; }
precision gpt_model_precision(const gpt_model *m) { return m->p; }

void gpt_use_slot(gpt_model *m, int slot) {
    if (slot < 0 || slot >= m->max_slots) {
        fprintf(stderr, "error: micro-batch slot %d of a model made for %d\n", slot,
                m->max_slots);
        abort();
    }
    m->slot = &m->slots[slot];
    if (!m->slot->x) slot_alloc(m, m->slot);
}

int *gpt_host_batch(gpt_model *m) { return m->host_batch; }

void gpt_set_batch(gpt_model *m, const int *tokens, const int *targets) {
    size_t bytes = (size_t)m->B * m->T * sizeof(int);
    ops_upload(m->slot->tokens, tokens, bytes);
    ops_upload(m->slot->targets, targets, bytes);
}

void *gpt_stage_input(gpt_model *m) { return m->slot->x[0]; }
const void *gpt_stage_output(gpt_model *m) {
    return m->slot->x[gpt_stage_layers(&m->shape)];
}
void *gpt_stage_output_grad(gpt_model *m) { return m->slot->d_out; }
const void *gpt_stage_input_grad(gpt_model *m) { return m->slot->d_in; }

/* Block `layer` of the whole model as the stage's i-th block. */
static int local_block(const gpt_model *m, int layer) { return layer - m->shape.layer_begin; }

static block_acts *acts_of(gpt_model *m, int layer) {
    return m->opts.checkpoint_activations ? m->recompute : &m->slot->acts[local_block(m, layer)];
}

/* The group f's backward all-reduces over (NULL for the negative control). */
static comm *f_group(const gpt_model *m) { return m->opts.drop_f_backward ? NULL : m->opts.tp; }

/* Whether the options' MLP hook replaces this block's MLP. */
static int mlp_replaced(const gpt_model *m, int layer) {
    const gpt_mlp_hook *h = m->opts.mlp;
    return h && h->replaces(h->ctx, layer);
}

/* ---- forward ---------------------------------------------------------------------- */

/* The compute weights of one block, inside a slab of the model's precision. */
typedef struct {
    const void *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b;
    const void *ln2_w, *ln2_b, *fc_w, *fc_b, *fc2_w, *fc2_b;
} block_weights;

static block_weights weights_of(const gpt_model *m, const void *slab) {
    const gpt_block_layout o = gpt_block_offsets(&m->shape);
    const precision p = m->p;
    return (block_weights){
        .ln1_w = precision_at(p, slab, o.ln1_w), .ln1_b = precision_at(p, slab, o.ln1_b),
        .qkv_w = precision_at(p, slab, o.qkv_w), .qkv_b = precision_at(p, slab, o.qkv_b),
        .proj_w = precision_at(p, slab, o.proj_w), .proj_b = precision_at(p, slab, o.proj_b),
        .ln2_w = precision_at(p, slab, o.ln2_w), .ln2_b = precision_at(p, slab, o.ln2_b),
        .fc_w = precision_at(p, slab, o.fc_w), .fc_b = precision_at(p, slab, o.fc_b),
        .fc2_w = precision_at(p, slab, o.fc2_w), .fc2_b = precision_at(p, slab, o.fc2_b)};
}

void gpt_embed_forward(gpt_model *m, const void *embed) {
    const gpt_shape *s = &m->shape;
    const int N = m->B * m->T, C = s->cfg.dim;
    const void *wte = embed, *wpe = precision_at(m->p, embed, (size_t)s->vocab_local * C);
    void *x = m->slot->x[0];
    mixed_embedding_forward(m->p, x, m->slot->tokens, wte, N, C, s->vocab_start,
                            s->vocab_local);
    /* vocab-parallel: each rank embedded only its tokens; the sum is the embedding */
    if (s->vocab_parallel) megatron_g_forward(m->opts.tp, m->p, x, (size_t)N * C);
    mixed_position_forward(m->p, x, wpe, m->B, m->T, C);
}

/* Megatron's block: attention heads and MLP units split over the tp group.
 *   ln1 -> f -> QKV (column-parallel) -> attention on my heads -> proj (row) -> g -> + x
 *   ln2 -> f -> fc (column-parallel) -> GELU -> fc2 (row-parallel) -> g -> + x_mid */
void gpt_block_forward(gpt_model *m, int layer, const void *block) {
    const gpt_shape *s = &m->shape;
    const precision P = m->p;
    const int B = m->B, T = m->T, N = B * T, C = s->cfg.dim;
    const int Cl = s->dim_local, Hl = s->hidden_local;
    const block_weights p = weights_of(m, block);
    block_acts *a = acts_of(m, layer);
    const void *x_in = m->slot->x[local_block(m, layer)];
    void *x_out = m->slot->x[local_block(m, layer) + 1];
    comm *tp = m->opts.tp;

    mixed_layernorm_forward(P, a->ln1, a->ln1_mean, a->ln1_rstd, x_in, p.ln1_w, p.ln1_b, N, C);
    column_parallel_forward(P, a->qkv, a->ln1, p.qkv_w, p.qkv_b, N, C, 3 * Cl);
    mixed_attention_forward(P, a->atty, a->att, a->qkv, B, T, Cl, s->heads_local);
    row_parallel_forward(tp, P, a->x_mid, a->atty, p.proj_w, p.proj_b, N, Cl, C);
    mixed_vec_add(P, a->x_mid, x_in, (size_t)N * C);

    mixed_layernorm_forward(P, a->ln2, a->ln2_mean, a->ln2_rstd, a->x_mid, p.ln2_w, p.ln2_b,
                            N, C);
    if (mlp_replaced(m, layer)) {
        m->opts.mlp->forward(m->opts.mlp->ctx, layer, x_out, a->ln2);
    } else {
        column_parallel_forward(P, a->dgelu, a->ln2, p.fc_w, p.fc_b, N, C, Hl);
        mixed_gelu_forward(P, a->fch_gelu, a->dgelu, (size_t)N * Hl);
        row_parallel_forward(tp, P, x_out, a->fch_gelu, p.fc2_w, p.fc2_b, N, Hl, C);
    }
    mixed_vec_add(P, x_out, a->x_mid, (size_t)N * C);
}

float gpt_head_forward(gpt_model *m, const void *final_ln, const void *embed) {
    const gpt_shape *s = &m->shape;
    micro_slot *k = m->slot;
    const int N = m->B * m->T, C = s->cfg.dim, V = s->cfg.vocab;
    mixed_layernorm_forward(m->p, k->lnf, k->lnf_mean, k->lnf_rstd, k->x[gpt_stage_layers(s)],
                            final_ln, precision_at(m->p, final_ln, C), N, C);
    if (!s->vocab_parallel) {   /* tied: wte is [V, C] */
        mixed_linear_forward(m->p, k->logits, k->lnf, embed, NULL, N, C, V);
        mixed_crossentropy_forward(m->p, k->losses, k->logits, k->logits, k->targets, N, V);
        return (float)(vec_sum(k->losses, (size_t)N) / N);
    }
    /* Vocab-parallel head (fp32 only): this rank's wte rows give its columns of the
     * logits, and the loss is assembled from per-row maxima and sums: the full logits
     * never meet. The lnf input is replicated (Megatron's f: identity forward,
     * all-reduce backward). */
    column_parallel_forward(m->p, k->logits, k->lnf, embed, NULL, N, C, s->vocab_local);
    vocab_parallel_crossentropy_forward(m->opts.tp, k->losses, k->logits, k->logits,
                                        k->targets, vocab_slice_of(s, N));
    return (float)(vec_sum(k->losses, (size_t)N) / N);   /* the same on every tp rank */
}

/* Where a slab starts inside a stage's parameter vector (of the model's precision). */
static const void *param_slab(const gpt_model *m, const void *params, int slab) {
    return precision_at(m->p, params, gpt_slab_offset(&m->shape, slab));
}

/* The tied weight the head multiplies by, inside params: the embedding's rows on a
 * first stage, else the HEAD copy. */
static const void *head_weight(const gpt_model *m, const void *params) {
    const gpt_shape *s = &m->shape;
    return param_slab(m, params, s->has_embed ? gpt_embed_slab(s) : gpt_head_slab(s));
}

float gpt_forward(gpt_model *m, const void *params) {
    const gpt_shape *s = &m->shape;
    if (s->has_embed) gpt_embed_forward(m, param_slab(m, params, gpt_embed_slab(s)));
    for (int l = s->layer_begin; l < s->layer_end; l++)
        gpt_block_forward(m, l, param_slab(m, params, gpt_block_slab(s, l)));
    if (!s->has_head) return 0.0f;
    return gpt_head_forward(m, param_slab(m, params, gpt_final_slab(s)),
                            head_weight(m, params));
}

/* ---- backward --------------------------------------------------------------------- */

/* The backward passes below run whole, or as the input half of a split backward
 * (`split`): then every linear computes only its input gradient and keeps its output
 * gradient for gpt_backward_weights, which computes the weight gradients from it. The
 * LayerNorms' own gradients, cheap and needed by nobody downstream, stay in the input
 * half. Either way the numbers are the same, bit for bit. */

static void head_backward(gpt_model *m, const void *final_ln, const void *embed,
                          float *final_ln_grad, float *embed_grad, float dloss, int split) {
    const gpt_shape *s = &m->shape;
    micro_slot *k = m->slot;
    const int N = m->B * m->T, C = s->cfg.dim;
    float *dwte = split ? NULL : embed_grad;
    /* logits hold the probabilities now; turn them into d logits in place (kept there
     * for the LM head's weight gradient) */
    if (!s->vocab_parallel) {
        mixed_crossentropy_backward(m->p, k->logits, k->logits, k->targets, dloss, N,
                                    s->cfg.vocab);
    } else {
        vocab_parallel_crossentropy_backward(k->logits, k->logits, k->targets, dloss,
                                             vocab_slice_of(s, N));
    }
    /* vocab-parallel: d(lnf) summed over every rank's vocabulary, f's backward
     * all-reduce; a whole head's d(lnf) is complete as it is */
    column_parallel_backward(s->vocab_parallel ? f_group(m) : NULL, m->p, m->d_ln, dwte, NULL,
                             k->logits, k->lnf, embed, N, C, s->vocab_local);
    mixed_vec_zero(m->p, m->dx, (size_t)N * C);
    mixed_layernorm_backward(m->p, m->dx, final_ln_grad, final_ln_grad + C, m->d_ln,
                             k->x[gpt_stage_layers(s)], final_ln, k->lnf_mean, k->lnf_rstd,
                             N, C);
}

void gpt_head_backward(gpt_model *m, const void *final_ln, const void *embed,
                       float *final_ln_grad, float *embed_grad, float dloss) {
    head_backward(m, final_ln, embed, final_ln_grad, embed_grad, dloss, 0);
}

static void *kept(void *keep, void *scratch) { return keep ? keep : scratch; }

static void block_backward(gpt_model *m, int layer, const void *block, float *block_grad,
                           block_douts *keep) {
    const gpt_shape *s = &m->shape;
    const precision P = m->p;
    const int B = m->B, T = m->T, N = B * T, C = s->cfg.dim;
    const int Cl = s->dim_local, Hl = s->hidden_local;
    if (m->opts.checkpoint_activations) gpt_block_forward(m, layer, block);  /* recompute */
    const block_weights p = weights_of(m, block);
    gpt_block_tensors g = gpt_block_view(s, block_grad);
    gpt_block_tensors w = keep ? (gpt_block_tensors){0} : g;   /* the linears' grads now */
    block_acts *a = acts_of(m, layer);
    const void *x_in = m->slot->x[local_block(m, layer)];
    void *dx = m->dx;   /* in: d(block output); out: d(block input) */
    void *d_fch = kept(keep ? keep->d_fch : NULL, m->d_fch);
    void *d_qkv = kept(keep ? keep->d_qkv : NULL, m->d_qkv);

    /* MLP branch: out = x_mid + fc2(gelu(fc(ln2(x_mid)))). The residual passes d(out)
     * through unchanged, so dx itself becomes d(x_mid) once ln2's gradient is added
     * onto it (after the last read of d(out)), and then d(x_in) the same way: the
     * same sums as with a copy of dx, without the copies. */
    if (keep) mixed_vec_copy(P, keep->d_fc2_out, dx, (size_t)N * C);
    if (mlp_replaced(m, layer)) {
        m->opts.mlp->backward(m->opts.mlp->ctx, layer, m->d_ln, dx);
    } else {
        row_parallel_backward(P, m->d_fch_gelu, w.fc2_w, w.fc2_b, dx, a->fch_gelu, p.fc2_w, N,
                              Hl, C);
        mixed_gelu_backward(P, d_fch, a->dgelu, m->d_fch_gelu, (size_t)N * Hl);
        column_parallel_backward(f_group(m), P, m->d_ln, w.fc_w, w.fc_b, d_fch, a->ln2, p.fc_w,
                                 N, C, Hl);
    }
    mixed_layernorm_backward(P, dx, g.ln2_w, g.ln2_b, m->d_ln, a->x_mid, p.ln2_w, a->ln2_mean,
                             a->ln2_rstd, N, C);   /* dx: d(x_mid) now */

    /* attention branch: x_mid = x_in + proj(attention(qkv(ln1(x_in)))) */
    if (keep) mixed_vec_copy(P, keep->d_proj_out, dx, (size_t)N * C);
    row_parallel_backward(P, m->d_atty, w.proj_w, w.proj_b, dx, a->atty, p.proj_w, N, Cl, C);
    mixed_attention_backward(P, d_qkv, m->d_att, m->d_atty, a->qkv, a->att, B, T, Cl,
                             s->heads_local);
    column_parallel_backward(f_group(m), P, m->d_ln, w.qkv_w, w.qkv_b, d_qkv, a->ln1, p.qkv_w,
                             N, C, 3 * Cl);
    mixed_layernorm_backward(P, dx, g.ln1_w, g.ln1_b, m->d_ln, x_in, p.ln1_w, a->ln1_mean,
                             a->ln1_rstd, N, C);
}

void gpt_block_backward(gpt_model *m, int layer, const void *block, float *block_grad) {
    block_backward(m, layer, block, block_grad, NULL);
}

/* The weight gradients of a block's four linears, from what its input half kept. */
static void block_weight_grads(gpt_model *m, int layer, const void *block, float *block_grad,
                               const block_douts *d) {
    const gpt_shape *s = &m->shape;
    const precision P = m->p;
    const int N = m->B * m->T, C = s->cfg.dim, Cl = s->dim_local, Hl = s->hidden_local;
    const block_weights p = weights_of(m, block);
    gpt_block_tensors g = gpt_block_view(s, block_grad);
    block_acts *a = acts_of(m, layer);
    row_parallel_backward(P, NULL, g.fc2_w, g.fc2_b, d->d_fc2_out, a->fch_gelu, p.fc2_w, N, Hl,
                          C);
    column_parallel_backward(NULL, P, NULL, g.fc_w, g.fc_b, d->d_fch, a->ln2, p.fc_w, N, C, Hl);
    row_parallel_backward(P, NULL, g.proj_w, g.proj_b, d->d_proj_out, a->atty, p.proj_w, N, Cl,
                          C);
    column_parallel_backward(NULL, P, NULL, g.qkv_w, g.qkv_b, d->d_qkv, a->ln1, p.qkv_w, N, C,
                             3 * Cl);
}

static void embed_backward_from(gpt_model *m, float *embed_grad, const void *d_x) {
    const gpt_shape *s = &m->shape;
    const int N = m->B * m->T, C = s->cfg.dim;
    mixed_embedding_backward(m->p, embed_grad, d_x, m->slot->tokens, N, C, s->vocab_start,
                             s->vocab_local);
    mixed_position_backward(m->p, embed_grad + (size_t)s->vocab_local * C, d_x, m->B, m->T,
                            C);
}

void gpt_embed_backward(gpt_model *m, float *embed_grad) {
    embed_backward_from(m, embed_grad, m->dx);
}

static void slab_ready(gpt_slab_ready_fn fn, void *ctx, int slab) {
    if (fn) fn(ctx, slab);
}

static size_t boundary_numel(const gpt_model *m) {
    return (size_t)m->B * m->T * m->shape.cfg.dim;
}

/* The split backward's kept output gradients for the current slot. */
static block_douts *slot_douts(gpt_model *m) {
    micro_slot *k = m->slot;
    const gpt_shape *s = &m->shape;
    const size_t N = (size_t)m->B * m->T, C = s->cfg.dim;
    if (m->opts.checkpoint_activations) {
        fprintf(stderr, "error: a split backward needs every block's activations until its"
                " weight gradients: it does not combine with activation checkpointing\n");
        abort();
    }
    if (m->opts.mlp) {
        fprintf(stderr, "error: a split backward does not take a replaced MLP\n");
        abort();
    }
    if (!k->douts) {
        const int blocks = gpt_stage_layers(s);
        k->douts = mem_alloc(MEM_OTHER, (size_t)blocks * sizeof *k->douts);
        for (int i = 0; i < blocks; i++)
            k->douts[i] = (block_douts){.d_fc2_out = alloc_acts(m, N * C),
                                        .d_fch = alloc_acts(m, N * s->hidden_local),
                                        .d_proj_out = alloc_acts(m, N * C),
                                        .d_qkv = alloc_acts(m, N * 3 * s->dim_local)};
        if (!k->d_in) k->d_in = alloc_acts(m, N * C);   /* the embedding's W needs it */
    }
    return k->douts;
}

/* Both halves share this walk; split: the input half, keeping what the weights need. */
static void backward_walk(gpt_model *m, const void *params, float *grads, float dloss,
                          gpt_slab_ready_fn on_slab_ready, void *ctx, int split) {
    const gpt_shape *s = &m->shape;
    block_douts *douts = split ? slot_douts(m) : NULL;
    if (s->has_head) {
        const int final_slab = gpt_final_slab(s);
        head_backward(m, param_slab(m, params, final_slab), head_weight(m, params),
                      grads + gpt_slab_offset(s, final_slab), gpt_tied_weight(s, grads),
                      dloss, split);
        if (!split && gpt_head_slab(s) >= 0) slab_ready(on_slab_ready, ctx, gpt_head_slab(s));
        if (!split) slab_ready(on_slab_ready, ctx, final_slab);
    } else {
        mixed_vec_copy(m->p, m->dx, m->slot->d_out, boundary_numel(m));
    }
    for (int l = s->layer_end - 1; l >= s->layer_begin; l--) {
        const int slab = gpt_block_slab(s, l);
        block_backward(m, l, param_slab(m, params, slab), grads + gpt_slab_offset(s, slab),
                       douts ? &douts[local_block(m, l)] : NULL);
        if (!split) slab_ready(on_slab_ready, ctx, slab);
    }
    if (m->slot->d_in) mixed_vec_copy(m->p, m->slot->d_in, m->dx, boundary_numel(m));
    if (s->has_embed && !split) {
        gpt_embed_backward(m, grads + gpt_slab_offset(s, gpt_embed_slab(s)));
        slab_ready(on_slab_ready, ctx, gpt_embed_slab(s));
    }
}

void gpt_backward(gpt_model *m, const void *params, float *grads, float dloss,
                  gpt_slab_ready_fn on_slab_ready, void *ctx) {
    backward_walk(m, params, grads, dloss, on_slab_ready, ctx, 0);
}

void gpt_backward_input(gpt_model *m, const void *params, float *grads, float dloss) {
    backward_walk(m, params, grads, dloss, NULL, NULL, 1);
}

void gpt_backward_weights(gpt_model *m, const void *params, float *grads,
                          gpt_slab_ready_fn on_slab_ready, void *ctx) {
    const gpt_shape *s = &m->shape;
    micro_slot *k = m->slot;
    const int N = m->B * m->T, C = s->cfg.dim;
    if (!k->douts) {
        fprintf(stderr, "error: gpt_backward_weights without gpt_backward_input first\n");
        abort();
    }
    if (s->has_head) {   /* the tied LM head: d wte += d logits^T @ lnf */
        column_parallel_backward(NULL, m->p, NULL, gpt_tied_weight(s, grads), NULL, k->logits,
                                 k->lnf, head_weight(m, params), N, C, s->vocab_local);
        if (gpt_head_slab(s) >= 0) slab_ready(on_slab_ready, ctx, gpt_head_slab(s));
        slab_ready(on_slab_ready, ctx, gpt_final_slab(s));
    }
    for (int l = s->layer_end - 1; l >= s->layer_begin; l--) {
        const int slab = gpt_block_slab(s, l);
        block_weight_grads(m, l, param_slab(m, params, slab), grads + gpt_slab_offset(s, slab),
                           &k->douts[local_block(m, l)]);
        slab_ready(on_slab_ready, ctx, slab);
    }
    if (s->has_embed) {
        embed_backward_from(m, grads + gpt_slab_offset(s, gpt_embed_slab(s)), k->d_in);
        slab_ready(on_slab_ready, ctx, gpt_embed_slab(s));
    }
}

void gpt_backward_by_slab(gpt_model *m, const void *params, float dloss,
                          gpt_slab_open_fn open, gpt_slab_close_fn close, void *ctx) {
    const gpt_shape *s = &m->shape;
    if (!s->has_head || !s->has_embed || s->tp_size > 1 || gpt_head_slab(s) >= 0) {
        fprintf(stderr, "error: gpt_backward_by_slab needs a whole model (one stage, no TP)\n");
        abort();
    }
    const int embed = gpt_embed_slab(s), final = gpt_final_slab(s);
    float *embed_grad = open(ctx, embed);
    float *final_grad = open(ctx, final);
    gpt_head_backward(m, param_slab(m, params, final), head_weight(m, params), final_grad,
                      embed_grad, dloss);
    close(ctx, final, final_grad);
    for (int layer = s->layer_end - 1; layer >= s->layer_begin; layer--) {
        const int slab = gpt_block_slab(s, layer);
        float *block_grad = open(ctx, slab);
        gpt_block_backward(m, layer, param_slab(m, params, slab), block_grad);
        close(ctx, slab, block_grad);
    }
    gpt_embed_backward(m, embed_grad);
    close(ctx, embed, embed_grad);
}
