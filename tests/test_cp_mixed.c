/* Context parallelism's attention in the model's 16 bits (cp_attention_hook.h): ring
 * (contiguous and balanced) and Ulysses on 2 thread ranks, bf16 and fp16, against the
 * single device in the same precision (the model's own 16-bit attention op); with two
 * micro-batches in flight (a pipeline stage's slots), with activation checkpointing, and
 * with TP 2 + SP inside every chunk (4 ranks; fp32 too, at fp32's tolerances); and
 * TP's vocab-parallel head in 16 bits, alone and inside CP.
 *
 * Each run trains 3 steps of AdamW (fp32 masters, the 16-bit compute copy rounded from
 * them) on the same tokens: every step's global mean loss, step 1's gradients (summed
 * over the CP group) and the final masters are compared, within tolerances_for_tp's
 * 16-bit bounds with 2 for tp. Why those hold: the hook widens the 16-bit q, k, v
 * exactly and computes in fp32 as the 16-bit op does, but its sums run in another order
 * (the ring's online softmax block by block; Ulysses keeps fp32 probabilities where the
 * op keeps 16-bit ones), so its output and d qkv may round one 16-bit unit apart: 2
 * roundings a block, where TP's bound allows 4 (with TP inside too, measured within a
 * fifth of it; the vocab-parallel head adds one 16-bit all-reduce, of d lnf). Two
 * negative controls must miss them by far. Those bounds are loose for one op, so the
 * hook alone is also held to the 16-bit attention op, layer by layer, within 4 units of
 * 16-bit rounding. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "check_run.h"
#include "comm.h"
#include "cp_attention_hook.h"
#include "model.h"
#include "model_runs.h"
#include "ops.h"
#include "ops_mixed.h"
#include "rng.h"
#include "run_config.h"
#include "tolerances.h"
#include "tp_slices.h"

enum { STEPS = MODEL_RUN_STEPS, B = 2, P = 2 };

typedef struct {
    precision p;
    cp_options opts;
    int cp;           /* 1: the single device, the model's own attention */
    int tp, sp;       /* Megatron TP inside every chunk (0: 1), and sequence parallelism */
    int vocab;        /* the embedding and LM head split over the vocabulary (TP) */
    int slots;        /* micro-batches a step, all in flight before their backward */
    int checkpoint;   /* activation checkpointing */
    int test_positions_from_zero;   /* negative control: every chunk's rows at 0.. */
} cp_case;

typedef model_run run_out;   /* step 1's gradients summed over the group */

static run_config case_config(const cp_case *c) {
    run_config cfg = run_config_default();
    cfg.model = (gpt_config){.vocab = 256, .ctx = 16, .layers = 2, .heads = 4, .dim = 32};
    cfg.batch = B * c->slots;
    cfg.steps = STEPS;
    cfg.precision = c->p;
    return cfg;
}

/* Tokens and targets of micro-batch k of step s: B whole sequences of T. */
static void make_batch(int s, int k, int T, int V, int *tokens, int *targets) {
    for (int i = 0; i < B * T; i++) {
        const uint64_t at = ((uint64_t)(s * 8 + k) * B * T + i) * 2;
        tokens[i] = (int)(rng_uniform(11, 1, at) * V);
        targets[i] = (int)(rng_uniform(11, 1, at + 1) * V);
    }
}

typedef struct {
    const cp_case *c;
    run_out *out;
} rank_args;

typedef struct {
    gpt_model *model;
    position_span span;
    int rows;   /* positions a rank holds of a sequence */
    int *whole, *chunk;
} rank_data;

/* One step's micro-batches, every forward before the first backward; returns this
 * rank's share of the global mean loss. */
static double step_grads(const cp_case *c, const run_config *cfg, rank_data *d, int s,
                         const void *compute, float *grads, size_t n) {
    const int T = cfg->model.ctx;
    const double tokens = (double)cfg->batch * T;
    double loss = 0;
    vec_zero(grads, n);
    for (int k = 0; k < c->slots; k++) {
        make_batch(s, k, T, cfg->model.vocab, d->whole, d->whole + B * T);
        cp_span_rows(&d->span, B, T, d->whole, d->chunk);
        cp_span_rows(&d->span, B, T, d->whole + B * T, d->chunk + B * d->rows);
        gpt_use_slot(d->model, k);
        gpt_set_batch(d->model, d->chunk, d->chunk + B * d->rows);
        loss += gpt_forward(d->model, compute) * (double)B * d->rows / tokens;
    }
    for (int k = c->slots - 1; k >= 0; k--) {
        gpt_use_slot(d->model, k);
        gpt_backward(d->model, compute, grads, (float)(1.0 / tokens), NULL, NULL);
    }
    return loss;
}

static int tp_of(const cp_case *c) { return c->tp > 1 ? c->tp : 1; }

/* The groups of a tp x cp mesh, tp fastest: tp = consecutive ranks, cp stride tp. */
typedef struct {
    comm *tp, *cp;
    int tp_rank, cp_rank;
} mesh_groups;

static mesh_groups groups_of(comm *world, const cp_case *c) {
    const int t = tp_of(c), me = comm_rank(world);
    return (mesh_groups){.tp = comm_split(world, me / t, me % t, "tp"),
                         .cp = comm_split(world, me % t, me / t, "cp"),
                         .tp_rank = me % t, .cp_rank = me / t};
}

/* The whole vector into `whole` on world rank 0 (the TP slices gathered). */
static void keep_whole(const mesh_groups *m, const gpt_shape *s, const float *mine,
                       float *whole, int world_rank) {
    if (m->cp_rank != 0) return;
    if (comm_size(m->tp) > 1) tp_gather_whole(m->tp, s, mine, world_rank == 0 ? whole : NULL);
    else memcpy(whole, mine, gpt_num_params(s) * 4);
}

static int rank_main(comm *world, void *arg) {
    const rank_args *a = arg;
    const cp_case *c = a->c;
    const run_config cfg = case_config(c);
    const gpt_config *g = &cfg.model;
    const int me = comm_rank(world), T = g->ctx;
    mesh_groups mg = groups_of(world, c);
    gpt_shape shape = gpt_shape_make(g, tp_of(c), mg.tp_rank);
    if (c->vocab) gpt_shape_split_vocab(&shape);
    const size_t n = gpt_num_params(&shape);
    float *master = mem_alloc(MEM_OTHER, n * 4), *grads = mem_alloc(MEM_OTHER, n * 4);
    float *m = mem_alloc(MEM_OTHER, n * 4), *v = mem_alloc(MEM_OTHER, n * 4);
    void *compute = mem_alloc(MEM_OTHER, n * precision_bytes(c->p));
    gpt_init_params(&shape, 5, 0, n, master);
    mixed_round(c->p, compute, master, n);
    vec_zero(m, n), vec_zero(v, n);
    rank_data d = {.span = cp_span_of(T, c->cp, mg.cp_rank, c->opts.split)};
    d.rows = position_span_rows(&d.span);
    cp_options wired = c->opts;
    wired.wire = c->p;   /* K/V and all-to-alls in the model's precision, as parallelize's */
    cp_attention *att = c->cp > 1 ? cp_attention_create(mg.cp, &wired, B, T, shape.dim_local,
                                                        shape.heads_local) : NULL;
    cp_attention_hook *hook = att ? cp_attention_hook_create(att, g->layers) : NULL;
    const gpt_model_options o = {.precision = c->p, .max_slots = c->slots,
                                 .checkpoint_activations = c->checkpoint,
                                 .tp = tp_of(c) > 1 ? mg.tp : NULL, .sequence_parallel = c->sp,
                                 .attention = hook ? cp_attention_hook_of(hook) : NULL,
                                 .positions = hook && !c->test_positions_from_zero ?
                                              &d.span : NULL};
    char why[256];
    ck_assert_msg(!gpt_model_options_check(&shape, d.rows, &o, why, sizeof why), "%s", why);
    d.model = gpt_model_create(&shape, B, d.rows, &o);
    d.whole = mem_alloc(MEM_OTHER, 2 * (size_t)B * T * sizeof(int));
    d.chunk = mem_alloc(MEM_OTHER, 2 * (size_t)B * T * sizeof(int));
    for (int s = 0; s < STEPS; s++) {
        double loss = step_grads(c, &cfg, &d, s, compute, grads, n);
        if (c->cp > 1) {
            comm_allreduce(mg.cp, grads, n, COMM_F32, COMM_SUM);
            comm_allreduce(mg.cp, &loss, 1, COMM_F64, COMM_SUM);
        }
        if (me == 0) a->out->loss[s] = loss;
        if (s == 0) keep_whole(&mg, &shape, grads, a->out->grads, me);
        adamw_update(master, grads, m, v, n, &cfg.adamw, s + 1);
        mixed_round(c->p, compute, master, n);
    }
    keep_whole(&mg, &shape, master, a->out->params, me);
    gpt_model_free(d.model);
    cp_attention_hook_free(hook);
    cp_attention_free(att);
    comm_free(mg.tp), comm_free(mg.cp);
    void *all[] = {master, grads, m, v, compute, d.whole, d.chunk};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) mem_free(all[i]);
    return 0;
}

static size_t case_params(const cp_case *c) {
    const run_config cfg = case_config(c);
    const gpt_shape s = gpt_shape_make(&cfg.model, 1, 0);
    return gpt_num_params(&s);
}

static void run_case(const cp_case *c, run_out *out) {
    model_run_alloc(out, case_params(c));
    rank_args a = {c, out};
    ck_assert_int_eq(model_run_launch(c->cp * tp_of(c), rank_main, &a), 0);
}

static const char *case_name(const cp_case *c) {
    static char buf[96];
    snprintf(buf, sizeof buf, "%s, tp %d%s%s x cp %d %s%s%s, %d micro-batch%s%s",
             precision_name(c->p), tp_of(c), c->sp ? " + sp" : "",
             c->vocab ? " (vocab-parallel)" : "", c->cp,
             c->cp > 1 ? cp_attention_name(c->opts.kind) : "",
             c->cp > 1 && c->opts.kind == CP_RING ? " " : "",
             c->cp > 1 && c->opts.kind == CP_RING ? cp_split_name(c->opts.split) : "", c->slots,
             c->slots > 1 ? "es in flight" : "", c->checkpoint ? ", checkpointing" : "");
    return buf;
}

/* The case against the single device; returns the worst difference as a fraction of
 * its tolerance, after printing them. */
static double against_one_device(cp_case c) {
    const cp_case one = {.p = c.p, .cp = 1, .tp = 1, .slots = c.slots};
    run_out base, got;
    run_case(&one, &base);
    run_case(&c, &got);
    const run_config cfg = case_config(&c);
    const run_tolerances t = tolerances_for_tp(&cfg, P, model_run_largest_grad(&base));
    const double worst = model_run_compare(case_name(&c), &base, &got, &t, 0, NULL);
    model_run_free(&base), model_run_free(&got);
    return worst;
}

static const cp_options ring = {.kind = CP_RING, .split = CP_CONTIGUOUS};
static const cp_options balanced = {.kind = CP_RING, .split = CP_BALANCED};
static const cp_options ulysses = {.kind = CP_ULYSSES};

static void check_matches(precision p, cp_options o, int slots, int checkpoint) {
    const cp_case c = {.p = p, .opts = o, .cp = P, .slots = slots, .checkpoint = checkpoint};
    ck_assert_double_le(against_one_device(c), 1.0);
}

static void check_sp_matches(precision p, cp_options o) {
    const cp_case c = {.p = p, .opts = o, .cp = P, .tp = 2, .sp = 1, .slots = 1};
    ck_assert_double_le(against_one_device(c), 1.0);
}

START_TEST(ring_in_bf16_matches_one_device) { check_matches(PRECISION_BF16, ring, 1, 0); }
END_TEST
START_TEST(balanced_ring_in_fp16_matches_one_device) {
    check_matches(PRECISION_FP16, balanced, 1, 0);
}
END_TEST
START_TEST(ulysses_in_bf16_matches_one_device) { check_matches(PRECISION_BF16, ulysses, 1, 0); }
END_TEST
START_TEST(ulysses_in_fp16_matches_one_device) { check_matches(PRECISION_FP16, ulysses, 1, 0); }
END_TEST
/* a pipeline stage's micro-batches in flight: each slot's saved state its own */
START_TEST(two_micro_batches_in_flight_match_one_device) {
    check_matches(PRECISION_BF16, balanced, 2, 0);
    check_matches(PRECISION_FP32, ulysses, 2, 0);
}
END_TEST
/* the block's forward again in backward: the hook's forward runs (and talks) twice */
START_TEST(activation_checkpointing_matches_one_device) {
    check_matches(PRECISION_FP16, ring, 2, 1);
    check_matches(PRECISION_BF16, ulysses, 1, 1);
}
END_TEST

/* TP 2 with SP inside each chunk of CP 2: the attention sees the TP-gathered chunk; a
 * rank's residual rows are a slice of its chunk's positions (the balanced split's: one
 * of its two pieces each). */
START_TEST(sequence_parallel_chunks_match_one_device) {
    check_sp_matches(PRECISION_FP32, balanced);
    check_sp_matches(PRECISION_FP32, ulysses);
    check_sp_matches(PRECISION_BF16, ring);
    check_sp_matches(PRECISION_FP16, balanced);
}
END_TEST

/* ---- the hook alone against the 16-bit attention op ------------------------------------ */

enum { OB = 2, OT = 16, OC = 32, OH = 4, OL = 2 };   /* sequences, positions, channels, heads, layers */

typedef struct {
    precision p;
    cp_options opts;
    double worst_out[P], worst_dqkv[P];   /* per rank, in units of the largest reference */
} op_case;

/* v[n] uniform in (-1, 1) rounded to p, as 16-bit elements. */
static void fill_bits(precision p, void *v, size_t n, uint64_t stream) {
    float *f = malloc(n * 4);
    for (size_t i = 0; i < n; i++) f[i] = (float)(2 * rng_uniform(19, stream, i) - 1);
    mixed_round(p, v, f, n);
    free(f);
}

/* Rows of a rank's span out of whole sequences [OB, OT, w] (of p), or back (to_whole). */
static void span_copy(precision p, const position_span *s, void *chunk, void *whole,
                      size_t w, int to_whole) {
    const size_t e = precision_bytes(p) * w;
    for (int b = 0, at = 0; b < OB; b++)
        for (int k = 0; k < s->pieces; at += s->len[k], k++) {
            char *c = (char *)chunk + (size_t)at * e;   /* at: b x rows + the pieces before */
            char *x = (char *)whole + ((size_t)b * OT + s->start[k]) * e;
            if (to_whole) memcpy(x, c, s->len[k] * e);
            else memcpy(c, x, s->len[k] * e);
        }
}

/* max |got - want| over this rank's rows, and max |want| over them: got holds the
 * rank's chunk put back at its rows of a zeroed whole buffer. */
static double rows_worst(precision p, const void *got_whole, const void *want, size_t n) {
    float *g = malloc(n * 4), *w = malloc(n * 4);
    mixed_widen(p, g, got_whole, n), mixed_widen(p, w, want, n);
    double worst = 0, largest = 0;
    for (size_t i = 0; i < n; i++) {
        largest = fmax(largest, fabs(w[i]));
        if (g[i] != 0) worst = fmax(worst, fabs((double)g[i] - w[i]));
    }
    free(g), free(w);
    return worst / largest;
}

static int op_rank(comm *world, void *arg) {
    op_case *c = arg;
    const precision p = c->p;
    const int me = comm_rank(world);
    const size_t e = precision_bytes(p), nq = (size_t)OB * OT * 3 * OC, no = (size_t)OB * OT * OC;
    const position_span span = cp_span_of(OT, P, me, c->opts.split);
    char *qkv = malloc(OL * nq * e), *dout = malloc(OL * no * e), *out = malloc(OL * no * e);
    char *att = malloc((size_t)OB * OH * OT * OT * e), *datt = malloc((size_t)OB * OH * OT * OT * e);
    char *dqkv = malloc(OL * nq * e), *cq = malloc(nq * e), *co = malloc(OL * no * e);
    char *cd = malloc(no * e), *cdq = malloc(nq * e), *back = calloc(nq, e);
    cp_options wired = c->opts;
    wired.wire = p;
    cp_attention *a = cp_attention_create(world, &wired, OB, OT, OC, OH);
    cp_attention_hook *hk = cp_attention_hook_create(a, OL);
    const gpt_attention_hook *h = cp_attention_hook_of(hk);
    for (int l = 0; l < OL; l++) {   /* the reference: the 16-bit op on whole sequences */
        fill_bits(p, qkv + l * nq * e, nq, 2 * l), fill_bits(p, dout + l * no * e, no, 2 * l + 1);
        mixed_attention_forward(p, out + l * no * e, att, qkv + l * nq * e, OB, OT, OC, OH);
        mixed_attention_backward(p, dqkv + l * nq * e, datt, dout + l * no * e, qkv + l * nq * e,
                                 att, OB, OT, OC, OH);
        span_copy(p, &span, cq, qkv + l * nq * e, 3 * OC, 0);
        h->forward(h->ctx, 0, l, p, co + l * no * e, cq);
    }
    for (int l = OL - 1; l >= 0; l--) {   /* backward, last layer first, as the model */
        span_copy(p, &span, cq, qkv + l * nq * e, 3 * OC, 0);
        span_copy(p, &span, cd, dout + l * no * e, OC, 0);
        h->backward(h->ctx, 0, l, p, cdq, cd, cq, co + l * no * e);
        span_copy(p, &span, cdq, back, 3 * OC, 1);
        c->worst_dqkv[me] = fmax(c->worst_dqkv[me], rows_worst(p, back, dqkv + l * nq * e, nq));
        memset(back, 0, no * e);
        span_copy(p, &span, co + l * no * e, back, OC, 1);
        c->worst_out[me] = fmax(c->worst_out[me], rows_worst(p, back, out + l * no * e, no));
        memset(back, 0, nq * e);
    }
    cp_attention_hook_free(hk);
    cp_attention_free(a);
    void *all[] = {qkv, dout, out, att, datt, dqkv, cq, co, cd, cdq, back};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    return 0;
}

/* The hook in 16 bits against the 16-bit attention op, layer by layer (two layers, so a
 * backward that reads the wrong layer's state shows): the op keeps 16-bit probabilities
 * where the hook recomputes or keeps fp32 ones, and each rounds its output and d qkv
 * once: within 4 units u of the largest value (rounding differences of half a unit
 * each, passed on linearly). A wrong softmax term is off by its own size. */
START_TEST(the_hook_is_the_16_bit_attention_op) {
    const cp_options kinds[] = {ring, balanced, ulysses};
    for (int p = PRECISION_BF16; p <= PRECISION_FP16; p++)
        for (int k = 0; k < 3; k++) {
            op_case c = {.p = p, .opts = kinds[k]};
            ck_assert_int_eq(model_run_launch(P, op_rank, &c), 0);
            const double u = ldexp(1.0, p == PRECISION_BF16 ? -8 : -11);
            const double wo = fmax(c.worst_out[0], c.worst_out[1]);
            const double wd = fmax(c.worst_dqkv[0], c.worst_dqkv[1]);
            printf("%s %s%s hook against the 16-bit op, in units u of the largest: out %.2f,"
                   " d qkv %.2f (at most 4)\n", precision_name((precision)p),
                   cp_attention_name(kinds[k].kind), k == 1 ? " balanced" : "", wo / u, wd / u);
            ck_assert_double_le(wo, 4 * u);
            ck_assert_double_le(wd, 4 * u);
        }
}
END_TEST

/* The vocab-parallel head in 16 bits (TP 2, logits' softmax in fp32), on one chunk and
 * with SP inside CP 2. */
START_TEST(vocab_parallel_head_in_16_bits_matches_one_device) {
    const cp_case cases[] = {
        {.p = PRECISION_BF16, .opts = ring, .cp = 1, .tp = 2, .vocab = 1, .slots = 1},
        {.p = PRECISION_FP16, .opts = ring, .cp = 1, .tp = 2, .vocab = 1, .slots = 1},
        {.p = PRECISION_BF16, .opts = balanced, .cp = P, .tp = 2, .sp = 1, .vocab = 1,
         .slots = 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        ck_assert_double_le(against_one_device(cases[i]), 1.0);
}
END_TEST

/* Negative controls: the ring's diagonal block unmasked (each chunk's queries see its
 * later keys), and the chunks' rows embedded at positions 0.. instead of their own,
 * must each miss the 16-bit tolerances by far. */
static void check_fails(cp_case c, const char *what) {
    const double worst = against_one_device(c);
    printf("negative control, %s: %.3g x the tolerance\n", what, worst);
    ck_assert_double_gt(worst, 10);
}

START_TEST(an_unmasked_diagonal_block_fails) {
    cp_options o = ring;
    o.test_unmasked_diagonal = 1;
    check_fails((cp_case){.p = PRECISION_FP16, .opts = o, .cp = P, .slots = 1},
                "the diagonal block unmasked in fp16");
}
END_TEST

START_TEST(chunks_at_the_wrong_positions_fail) {
    check_fails((cp_case){.p = PRECISION_BF16, .opts = balanced, .cp = P, .slots = 1,
                          .test_positions_from_zero = 1},
                "every chunk at positions 0.. in bf16");
}
END_TEST

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    Suite *suite = suite_create("cp_mixed");
    TCase *tc = tcase_create("cp in 16 bits");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, the_hook_is_the_16_bit_attention_op);
    tcase_add_test(tc, ring_in_bf16_matches_one_device);
    tcase_add_test(tc, balanced_ring_in_fp16_matches_one_device);
    tcase_add_test(tc, ulysses_in_bf16_matches_one_device);
    tcase_add_test(tc, ulysses_in_fp16_matches_one_device);
    tcase_add_test(tc, two_micro_batches_in_flight_match_one_device);
    tcase_add_test(tc, activation_checkpointing_matches_one_device);
    tcase_add_test(tc, sequence_parallel_chunks_match_one_device);
    tcase_add_test(tc, vocab_parallel_head_in_16_bits_matches_one_device);
    tcase_add_test(tc, an_unmasked_diagonal_block_fails);
    tcase_add_test(tc, chunks_at_the_wrong_positions_fail);
    suite_add_tcase(suite, tc);
    return check_run(suite, 0);
}
