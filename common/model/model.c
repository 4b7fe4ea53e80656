/* The forward and backward passes of a stage (model.h); the instance and its
 * activations are in model_instance.c. */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "fp8_linear.h"
#include "model_internal.h"
#include "ops.h"
#include "ops_mixed.h"
#include "tp_linear.h"
#include "tp_sequence.h"
#include "vocab_parallel.h"

/* Block `layer` of the whole model as the stage's i-th block. */
static int local_block(const gpt_model *m, int layer) { return layer - m->shape.layer_begin; }

static block_acts *acts_of(gpt_model *m, int layer) {
    return m->opts.checkpoint_activations ? m->recompute : &m->slot->acts[local_block(m, layer)];
}

/* The attention's probabilities: kept per block, or (selective) formed again in one buffer */
static void *probabilities(const gpt_model *m, const block_acts *a) {
    return m->opts.recompute_attention ? m->att_again : a->att;
}

/* The group f's backward all-reduces over (NULL for the negative control). */
static comm *f_group(const gpt_model *m) { return m->opts.drop_f_backward ? NULL : m->opts.tp; }


/* The options' attention hook in place of the attention core, on the current slot. */
static int slot_index(const gpt_model *m) { return (int)(m->slot - m->slots); }
static void hooked_attention_forward(const gpt_model *m, int layer, block_acts *a) {
    const gpt_attention_hook *h = m->opts.attention;
    h->forward(h->ctx, slot_index(m), layer, m->p, a->atty, a->qkv);
}
static void hooked_attention_backward(const gpt_model *m, int layer, const block_acts *a,
                                      void *d_qkv) {
    const gpt_attention_hook *h = m->opts.attention;
    h->backward(h->ctx, slot_index(m), layer, m->p, d_qkv, m->d_atty, a->qkv, a->atty);
}

/* The options' MLP hook on the current slot. It routes the TP group's whole rows (its
 * experts replicated over TP): with SP they are all-gathered before it and this rank's
 * positions taken after it, forward (ln2, out) and backward (d out, d ln2); every TP
 * rank computes the same whole numbers, so a slice needs no sum. */
static void hooked_mlp_forward(gpt_model *m, int layer, block_acts *a, void *x_out) {
    const gpt_mlp_hook *h = m->opts.mlp;
    if (!m->sp) {
        h->forward(h->ctx, slot_index(m), layer, m->p, x_out, a->ln2);
        return;
    }
    tp_sequence_all_gather(m->sp, a->ln2_whole, a->ln2);
    h->forward(h->ctx, slot_index(m), layer, m->p, m->hook_rows[0], a->ln2_whole);
    tp_sequence_split(m->sp, x_out, m->hook_rows[0], m->opts.sp_mlp_summed);
}
static void hooked_mlp_backward(gpt_model *m, int layer, const void *d_out) {
    const gpt_mlp_hook *h = m->opts.mlp;
    if (!m->sp) {
        h->backward(h->ctx, slot_index(m), layer, m->p, m->d_ln, d_out);
        return;
    }
    tp_sequence_all_gather(m->sp, m->hook_rows[0], d_out);
    h->backward(h->ctx, slot_index(m), layer, m->p, m->hook_rows[1], m->hook_rows[0]);
    tp_sequence_split(m->sp, m->d_ln, m->hook_rows[1], 0);
}

/* The rows' own positions (options' span), sequence by sequence and piece by piece:
 * x [B, T, C] += wpe[position of row] forward, dwpe[position] += d_x[row] backward.
 * With SP a rank holds rows [first, first + T/tp) of each sequence's chunk: their
 * positions are that slice of the span. */
static void span_position_forward(const gpt_model *m, void *x, const void *wpe) {
    const int T = tp_sequence_length(m->sp, m->T);
    const position_span s = position_span_slice(m->opts.positions,
                                                tp_sequence_first_position(m->sp), T);
    const size_t C = m->shape.cfg.dim;
    for (int b = 0; b < m->B; b++)
        for (int k = 0, row = b * T; k < s.pieces; row += s.len[k], k++)
            mixed_position_forward(m->p, precision_at(m->p, x, row * C),
                                   precision_at(m->p, wpe, s.start[k] * C), 1, s.len[k], C);
}
/* backward: d_x holds every row of the chunk (with SP, gathered) */
static void span_position_backward(const gpt_model *m, float *dwpe, const void *d_x) {
    const position_span *s = m->opts.positions;
    const size_t C = m->shape.cfg.dim;
    for (int b = 0; b < m->B; b++)
        for (int k = 0, row = b * m->T; k < s->pieces; row += s->len[k], k++)
            mixed_position_backward(m->p, dwpe + s->start[k] * C,
                                    precision_at(m->p, d_x, row * C), 1, s->len[k], C);
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
    void *embedded = m->sp ? tp_sequence_scratch(m->sp) : x;
    mixed_embedding_forward(m->p, embedded, m->slot->tokens, wte, N, C, s->vocab_start,
                            s->vocab_local);
    /* vocab-parallel: each rank embedded only its tokens; the sum is the embedding (SP: mine) */
    if (m->sp) tp_sequence_split(m->sp, x, embedded, s->vocab_parallel);
    else if (s->vocab_parallel) megatron_g_forward(m->opts.tp, m->p, x, (size_t)N * C);
    if (m->opts.positions) {   /* a chunk of a longer sequence: each row its own */
        span_position_forward(m, x, wpe);
        return;
    }
    const size_t first = (size_t)tp_sequence_first_position(m->sp);   /* my positions' */
    mixed_position_forward(m->p, x, precision_at(m->p, wpe, first * C), m->B,
                           tp_sequence_length(m->sp, m->T), C);
}

/* Megatron's block: attention heads and MLP units split over the tp group.
 *   ln1 -> f -> QKV (column-parallel) -> attention on my heads -> proj (row) -> g -> + x
 *   ln2 -> f -> fc (column-parallel) -> GELU -> fc2 (row-parallel) -> g -> + x_mid */
void gpt_block_forward(gpt_model *m, int layer, const void *block) {
    const gpt_shape *s = &m->shape;
    const precision P = m->p;
    const int B = m->B, T = m->T, N = B * T, C = s->cfg.dim, Ns = (int)model_rows_held(m);
    const int Cl = s->dim_local, Hl = s->hidden_local;
    const block_weights p = weights_of(m, block);
    block_acts *a = acts_of(m, layer);
    const void *x_in = m->slot->x[local_block(m, layer)];
    void *x_out = m->slot->x[local_block(m, layer) + 1];
    comm *tp = m->opts.tp;
    tp_sequence *sp = m->sp;   /* with SP, f -> g (all-gather), g -> g-bar (reduce-scatter) */

    mixed_layernorm_forward(P, a->ln1, a->ln1_mean, a->ln1_rstd, x_in, p.ln1_w, p.ln1_b, Ns, C);
    fp8_linear_site(4 * layer);   /* FP8's delayed scaling: each linear its own history */
    tp_sequence_column_forward(sp, P, a->qkv, a->ln1, p.qkv_w, p.qkv_b, N, C, 3 * Cl);
    if (m->opts.attention) hooked_attention_forward(m, layer, a);
    else mixed_attention_forward(P, a->atty, probabilities(m, a), a->qkv, B, T, Cl,
                                 s->heads_local);
    fp8_linear_site(4 * layer + 1);
    tp_sequence_row_forward(sp, tp, P, a->x_mid, a->atty, p.proj_w, p.proj_b, N, Cl, C);
    mixed_vec_add(P, a->x_mid, x_in, (size_t)Ns * C);

    mixed_layernorm_forward(P, a->ln2, a->ln2_mean, a->ln2_rstd, a->x_mid, p.ln2_w, p.ln2_b,
                            Ns, C);
    if (model_mlp_replaced(m, layer)) {   /* an MoE layer (moe.h): whole on every TP rank */
        hooked_mlp_forward(m, layer, a, x_out);
    } else {
        fp8_linear_site(4 * layer + 2);
        tp_sequence_column_forward(sp, P, a->dgelu, a->ln2, p.fc_w, p.fc_b, N, C, Hl);
        mixed_gelu_forward(P, a->fch_gelu, a->dgelu, (size_t)N * Hl);
        fp8_linear_site(4 * layer + 3);
        tp_sequence_row_forward(sp, tp, P, x_out, a->fch_gelu, p.fc2_w, p.fc2_b, N, Hl, C);
    }
    mixed_vec_add(P, x_out, a->x_mid, (size_t)Ns * C);
}

const void *gpt_block_linear_input(const gpt_model *m, int layer, gpt_linear_input which) {
    if (m->opts.checkpoint_activations) return NULL;
    const block_acts *a = &m->slot->acts[local_block(m, layer)];
    if (which == GPT_QKV_INPUT) return a->ln1;
    if (which == GPT_PROJ_INPUT) return a->atty;
    if (which == GPT_FC_INPUT) return a->ln2;
    return model_mlp_replaced(m, layer) ? NULL : a->fch_gelu;
}

float gpt_head_forward(gpt_model *m, const void *final_ln, const void *embed) {
    const gpt_shape *s = &m->shape;
    micro_slot *k = m->slot;
    const int N = m->B * m->T, C = s->cfg.dim, V = s->cfg.vocab;
    /* with SP: my positions normalised, then gathered (g) for the vocab-parallel head */
    void *lnf = m->sp ? tp_sequence_scratch(m->sp) : k->lnf;
    mixed_layernorm_forward(m->p, lnf, k->lnf_mean, k->lnf_rstd, k->x[gpt_stage_layers(s)],
                            final_ln, precision_at(m->p, final_ln, C), (int)model_rows_held(m), C);
    if (m->sp) tp_sequence_all_gather(m->sp, k->lnf, lnf);
    if (!s->vocab_parallel) {   /* tied: wte is [V, C] */
        mixed_head_forward(m->p, k->logits, k->lnf, embed, NULL, N, C, V);
        mixed_crossentropy_forward(m->p, k->losses, k->logits, k->logits, k->targets, N, V);
        return (float)(vec_sum(k->losses, (size_t)N) / N);
    }
    /* Vocab-parallel head: this rank's wte rows give its columns of the logits, and the
     * loss is assembled from per-row maxima and sums (fp32 in every precision): the full
     * logits never meet. The lnf input is replicated (Megatron's f: identity forward,
     * all-reduce backward). */
    column_parallel_forward(m->p, k->logits, k->lnf, embed, NULL, N, C, s->vocab_local);
    mixed_vocab_parallel_crossentropy_forward(m->opts.tp, m->p, k->losses, k->logits,
                                              k->logits, k->targets, vocab_slice_of(s, N),
                                              m->logits32);
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
        mixed_vocab_parallel_crossentropy_backward(m->p, k->logits, k->logits, k->targets,
                                                   dloss, vocab_slice_of(s, N), m->logits32);
    }
    /* vocab-parallel: d(lnf) summed over every rank's vocabulary, f's backward
     * all-reduce (with SP, g's backward: the sum's reduce-scatter, my positions); a
     * whole head's d(lnf) is complete as it is */
    void *d_lnf = m->sp ? tp_sequence_scratch(m->sp) : m->d_ln;
    fp8_linear_site(FP8_NO_SITE);   /* the head stays bf16 in FP8 runs, backward too */
    column_parallel_backward(s->vocab_parallel && !m->sp ? f_group(m) : NULL, m->p, d_lnf,
                             dwte, NULL, k->logits, k->lnf, embed, N, C, s->vocab_local);
    if (m->sp) tp_sequence_split(m->sp, m->d_ln, d_lnf, s->vocab_parallel);
    const int Ns = (int)model_rows_held(m);
    mixed_vec_zero(m->p, m->dx, (size_t)Ns * C);
    tp_sequence_layernorm_backward(m->sp, m->p, m->dx, final_ln_grad, m->d_ln,
                                   k->x[gpt_stage_layers(s)], final_ln, k->lnf_mean,
                                   k->lnf_rstd, Ns, C);
}

void gpt_head_backward(gpt_model *m, const void *final_ln, const void *embed,
                       float *final_ln_grad, float *embed_grad, float dloss) {
    head_backward(m, final_ln, embed, final_ln_grad, embed_grad, dloss, 0);
}

static void *kept(void *keep, void *scratch) { return keep ? keep : scratch; }

/* A split backward keeps a row-parallel linear's output gradient, every position's
 * [N, C], for its weight gradient: d(out) itself, or with SP the gather the input half
 * just made of the rows (tp_sequence_row_backward leaves it in the scratch). */
static void keep_row_dout(gpt_model *m, void *keep, const void *dout_rows) {
    if (!keep) return;
    const void *whole = m->sp ? tp_sequence_scratch(m->sp) : dout_rows;
    mixed_vec_copy(m->p, keep, whole, (size_t)m->B * m->T * m->shape.cfg.dim);
}

static void block_backward(gpt_model *m, int layer, const void *block, float *block_grad,
                           block_douts *keep) {
    const gpt_shape *s = &m->shape;
    const precision P = m->p;
    const int B = m->B, T = m->T, N = B * T, C = s->cfg.dim, Ns = (int)model_rows_held(m);
    const int Cl = s->dim_local, Hl = s->hidden_local;
    tp_sequence *sp = m->sp;
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
    if (model_mlp_replaced(m, layer)) {
        hooked_mlp_backward(m, layer, dx);
    } else {   /* FP8 hybrid: each linear's site, for dY's delayed history */
        fp8_linear_site(4 * layer + 3);
        tp_sequence_row_backward(sp, P, m->d_fch_gelu, w.fc2_w, w.fc2_b, dx, a->fch_gelu,
                                 p.fc2_w, N, Hl, C);
        keep_row_dout(m, keep ? keep->d_fc2_out : NULL, dx);
        mixed_gelu_backward(P, d_fch, a->dgelu, m->d_fch_gelu, (size_t)N * Hl);
        fp8_linear_site(4 * layer + 2);
        tp_sequence_column_backward(sp, f_group(m), P, m->d_ln, w.fc_w, w.fc_b, d_fch, a->ln2,
                                    p.fc_w, N, C, Hl);
    }
    tp_sequence_layernorm_backward(sp, P, dx, g.ln2_w, m->d_ln, a->x_mid, p.ln2_w,
                                   a->ln2_mean, a->ln2_rstd, Ns, C);   /* dx: d(x_mid) now */

    /* attention branch: x_mid = x_in + proj(attention(qkv(ln1(x_in)))) */
    fp8_linear_site(4 * layer + 1);
    tp_sequence_row_backward(sp, P, m->d_atty, w.proj_w, w.proj_b, dx, a->atty, p.proj_w, N,
                             Cl, C);
    keep_row_dout(m, keep ? keep->d_proj_out : NULL, dx);
    if (m->opts.recompute_attention)   /* selective: the probabilities again, from Q, K */
        mixed_attention_forward(P, a->atty, m->att_again, a->qkv, B, T, Cl, s->heads_local);
    if (m->opts.attention) hooked_attention_backward(m, layer, a, d_qkv);
    else mixed_attention_backward(P, d_qkv, m->d_att, m->d_atty, a->qkv, probabilities(m, a),
                                  B, T, Cl, s->heads_local);
    fp8_linear_site(4 * layer);
    tp_sequence_column_backward(sp, f_group(m), P, m->d_ln, w.qkv_w, w.qkv_b, d_qkv, a->ln1,
                                p.qkv_w, N, C, 3 * Cl);
    tp_sequence_layernorm_backward(sp, P, dx, g.ln1_w, m->d_ln, x_in, p.ln1_w, a->ln1_mean,
                                   a->ln1_rstd, Ns, C);
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
    /* with SP the inputs were kept split: gathered again here, not in the input half */
    tp_sequence_column_backward(m->sp, NULL, P, NULL, g.fc_w, g.fc_b, d->d_fch, a->ln2, p.fc_w,
                                N, C, Hl);
    row_parallel_backward(P, NULL, g.proj_w, g.proj_b, d->d_proj_out, a->atty, p.proj_w, N, Cl,
                          C);
    tp_sequence_column_backward(m->sp, NULL, P, NULL, g.qkv_w, g.qkv_b, d->d_qkv, a->ln1,
                                p.qkv_w, N, C, 3 * Cl);
}

static void embed_backward_from(gpt_model *m, float *embed_grad, const void *d_x) {
    const gpt_shape *s = &m->shape;
    const int N = m->B * m->T, C = s->cfg.dim;
    if (m->sp) {   /* g-bar's backward: every position's gradient, for every token's row */
        tp_sequence_all_gather(m->sp, tp_sequence_scratch(m->sp), d_x);
        d_x = tp_sequence_scratch(m->sp);
    }
    mixed_embedding_backward(m->p, embed_grad, d_x, m->slot->tokens, N, C, s->vocab_start,
                             s->vocab_local);
    float *dwpe = embed_grad + (size_t)s->vocab_local * C;
    if (m->opts.positions) span_position_backward(m, dwpe, d_x);
    else mixed_position_backward(m->p, dwpe, d_x, m->B, m->T, C);
}

void gpt_embed_backward(gpt_model *m, float *embed_grad) {
    embed_backward_from(m, embed_grad, m->dx);
}

static void slab_ready(gpt_slab_ready_fn fn, void *ctx, int slab) {
    if (fn) fn(ctx, slab);
}

static size_t boundary_numel(const gpt_model *m) {
    return model_rows_held(m) * m->shape.cfg.dim;   /* with SP: my T/tp positions' */
}

size_t gpt_stage_boundary_numel(const gpt_model *m) { return boundary_numel(m); }

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
            k->douts[i] = (block_douts){.d_fc2_out = model_alloc_acts(m, N * C),
                                        .d_fch = model_alloc_acts(m, N * s->hidden_local),
                                        .d_proj_out = model_alloc_acts(m, N * C),
                                        .d_qkv = model_alloc_acts(m, N * 3 * s->dim_local)};
        if (!k->d_in) k->d_in = model_alloc_acts(m, boundary_numel(m));   /* the embedding's W */
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
        fp8_linear_site(FP8_NO_SITE);
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
