/* The model instance: its activations in micro-batch slots, allocated once (a slot on
 * its first use), and the accessors (model.h). The passes are in model.c. */
#include <stdio.h>
#include <stdlib.h>

#include "alloc.h"
#include "model_internal.h"
#include "tp_overlap.h"
#include "ops.h"

size_t model_rows_held(const gpt_model *m) {
    return (size_t)tp_sequence_rows(m->sp, m->B * m->T);
}

void *model_alloc_acts(const gpt_model *m, size_t n) {
    return mem_alloc_on(MEM_DEVICE, MEM_ACTIVATIONS, n * precision_bytes(m->p));
}

/* n fp32 statistics (LayerNorm means and reciprocal deviations, losses) */
static float *alloc_stats(size_t n) {
    return mem_alloc_on(MEM_DEVICE, MEM_ACTIVATIONS, n * sizeof(float));
}

int model_mlp_replaced(const gpt_model *m, int layer) {
    const gpt_mlp_hook *h = m->opts.mlp;
    return h && h->replaces(h->ctx, layer);
}

/* Whether some block of the stage runs the model's own MLP (its fc and GELU buffers). */
static int stage_runs_dense_mlp(const gpt_model *m) {
    for (int l = m->shape.layer_begin; l < m->shape.layer_end; l++)
        if (!model_mlp_replaced(m, l)) return 1;
    return 0;
}

/* One block's activations; dense_mlp: with its MLP's fc and GELU outputs, [N, 4C/tp]
 * each, which a block whose MLP a hook replaces never touches. */
static void block_acts_alloc(const gpt_model *m, block_acts *a, int dense_mlp) {
    const gpt_shape *s = &m->shape;
    size_t N = (size_t)m->B * m->T, C = s->cfg.dim, Ns = model_rows_held(m);
    a->ln1 = model_alloc_acts(m, Ns * C);
    a->ln1_mean = alloc_stats(Ns);
    a->ln1_rstd = alloc_stats(Ns);
    a->qkv = model_alloc_acts(m, N * 3 * s->dim_local);
    if (!m->opts.recompute_attention && !m->opts.attention)   /* a hook keeps its own */
        a->att = model_alloc_acts(m, (size_t)m->B * s->heads_local * m->T * m->T);
    a->atty = model_alloc_acts(m, N * s->dim_local);
    a->x_mid = model_alloc_acts(m, Ns * C);
    a->ln2 = model_alloc_acts(m, Ns * C);
    a->ln2_mean = alloc_stats(Ns);
    a->ln2_rstd = alloc_stats(Ns);
    if (dense_mlp) {
        a->dgelu = model_alloc_acts(m, N * s->hidden_local);
        a->fch_gelu = model_alloc_acts(m, N * s->hidden_local);
    }
    if (m->sp && m->opts.mlp) a->ln2_whole = model_alloc_acts(m, N * C);
}

static void block_acts_free(block_acts *a) {
    void *all[] = {a->ln1, a->ln1_mean, a->ln1_rstd, a->qkv, a->att, a->atty,
                   a->x_mid, a->ln2, a->ln2_mean, a->ln2_rstd, a->dgelu, a->fch_gelu,
                   a->ln2_whole};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) mem_free(all[i]);
}

static void slot_alloc(gpt_model *m, micro_slot *k) {
    const gpt_shape *s = &m->shape;
    const size_t N = (size_t)m->B * m->T, C = s->cfg.dim;
    const int blocks = gpt_stage_layers(s);
    k->tokens = mem_alloc_on(MEM_DEVICE, MEM_ACTIVATIONS, N * sizeof(int));
    k->targets = mem_alloc_on(MEM_DEVICE, MEM_ACTIVATIONS, N * sizeof(int));
    k->x = mem_alloc(MEM_OTHER, ((size_t)blocks + 1) * sizeof *k->x);
    for (int i = 0; i <= blocks; i++) k->x[i] = model_alloc_acts(m, model_rows_held(m) * C);
    if (!m->opts.checkpoint_activations) {
        k->acts = mem_alloc(MEM_OTHER, (size_t)blocks * sizeof *k->acts);
        for (int i = 0; i < blocks; i++)
            block_acts_alloc(m, &k->acts[i], !model_mlp_replaced(m, s->layer_begin + i));
    }
    if (!s->has_head) k->d_out = model_alloc_acts(m, model_rows_held(m) * C);
    if (!s->has_embed) k->d_in = model_alloc_acts(m, model_rows_held(m) * C);
    if (s->has_head) {
        k->lnf = model_alloc_acts(m, N * C);
        k->lnf_mean = alloc_stats(N);
        k->lnf_rstd = alloc_stats(N);
        k->logits = model_alloc_acts(m, N * (size_t)s->vocab_local);
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

const char *gpt_model_options_check(const gpt_shape *s, int T, const gpt_model_options *o,
                                    char *why, size_t why_len) {
    for (int l = s->layer_begin; l < s->layer_end; l++)   /* a block without its MLP */
        if (!gpt_block_has_mlp(s, l) && !(o->mlp && o->mlp->replaces(o->mlp->ctx, l)))
            return snprintf(why, why_len, "block %d holds no MLP (an MoE model's shape) and"
                            " no MLP hook replaces it", l), why;
    /* the model's selective recomputation re-runs its own attention op on the chunk:
     * the hook's attention is not that op (and the ring recomputes its probabilities
     * from the log-sum-exp already) */
    if (o->attention && o->recompute_attention)
        return snprintf(why, why_len, "a replaced attention core (context parallelism) runs"
                        " without selective recomputation (ring attention recomputes its"
                        " probabilities itself)"), why;
    if (o->positions && position_span_rows(o->positions) != T)
        return snprintf(why, why_len, "the rows' positions (a span of %d) must be the"
                        " model's T %d", position_span_rows(o->positions), T), why;
    if (o->tp_overlap_chunks && !o->sequence_parallel)
        return snprintf(why, why_len, "TP's collective matmuls overlap sequence"
                        " parallelism's collectives: they need it"), why;
    if (o->tp_overlap_chunks)
        return tp_overlap_check(o->tp_overlap_chunks, T, s->tp_size, why, why_len);
    return NULL;
}

gpt_model *gpt_model_create(const gpt_shape *s, int B, int T,
                            const gpt_model_options *opts) {
    /* bookkeeping through the accounting allocator too (MEM_OTHER): a rank stopped by
     * a failure elsewhere gives it back with its buffers */
    gpt_model *m = mem_alloc(MEM_OTHER, sizeof *m);
    m->shape = *s;
    if (opts) m->opts = *opts;
    m->p = m->opts.precision;
    char why[256];
    if (gpt_model_options_check(s, T, &m->opts, why, sizeof why)) {
        fprintf(stderr, "error: %s\n", why);   /* the caller's bug: it should have asked */
        abort();
    }
    m->B = B;
    m->T = T;
    m->max_slots = m->opts.max_slots > 0 ? m->opts.max_slots : 1;
    m->host_batch = mem_alloc(MEM_OTHER, 2 * (size_t)B * T * sizeof(int));
    m->slots = mem_alloc(MEM_OTHER, (size_t)m->max_slots * sizeof *m->slots);
    const size_t N = (size_t)B * T, C = s->cfg.dim;
    if (m->opts.sequence_parallel)
        m->sp = tp_sequence_create(s, m->opts.tp, m->p, B, T, m->opts.sp_copy_not_reduce);
    for (int i = 0; i < 2 && m->sp && m->opts.mlp; i++)   /* the hook's whole rows */
        m->hook_rows[i] = model_alloc_acts(m, N * C);
    if (s->vocab_parallel && s->has_head && m->p != PRECISION_FP32)
        m->logits32 = mem_alloc_on(MEM_DEVICE, MEM_ACTIVATIONS,
                                   N * (size_t)s->vocab_local * sizeof(float));
    if (m->sp && m->opts.tp_overlap_chunks > 0)
        tp_sequence_set_overlap(m->sp, m->opts.tp_overlap_chunks, m->opts.tp_overlap_control);
    if (m->opts.recompute_attention) m->att_again = model_alloc_acts(m, N * T * s->heads_local);
    gpt_use_slot(m, 0);
    if (m->opts.checkpoint_activations) {
        m->recompute = mem_alloc(MEM_OTHER, sizeof *m->recompute);
        block_acts_alloc(m, m->recompute, stage_runs_dense_mlp(m));   /* rebuilt per block */
    }
    m->dx = model_alloc_acts(m, N * C);
    m->d_ln = model_alloc_acts(m, N * C);
    m->d_atty = model_alloc_acts(m, N * s->dim_local);
    m->d_qkv = model_alloc_acts(m, N * 3 * s->dim_local);
    if (!m->opts.attention)
        m->d_att = model_alloc_acts(m, (size_t)B * s->heads_local * T * T);
    if (stage_runs_dense_mlp(m)) {   /* the MLP's gradients, [N, 4C/tp] each */
        m->d_fch = model_alloc_acts(m, N * s->hidden_local);
        m->d_fch_gelu = model_alloc_acts(m, N * s->hidden_local);
    }
    return m;
}

void gpt_model_free(gpt_model *m) {
    if (!m) return;
    for (int k = 0; k < m->max_slots; k++) slot_free(m, &m->slots[k]);
    if (m->recompute) block_acts_free(m->recompute);
    void *rest[] = {m->dx, m->d_ln, m->d_atty, m->d_qkv, m->d_att, m->d_fch,
                    m->d_fch_gelu, m->att_again, m->logits32, m->hook_rows[0],
                    m->hook_rows[1]};
    tp_sequence_free(m->sp);
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

