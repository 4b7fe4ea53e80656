/* The mixture-of-experts layer (moe.h) in the model's 16 bits and inside tensor
 * parallelism. The layer alone: in bf16 and fp16 it computes what the fp32 layer does on
 * the same 16-bit values to within its roundings, and its 16-bit experts follow their
 * masters. Trained: EP 2, TP 2 and TP 2 x EP 2 on thread ranks, against the
 * single-device MoE run in the same precision (fp32 with TP too).
 *
 * Each run trains 3 AdamW steps on the same tokens (the dense model's fp32 masters and
 * 16-bit compute copy, the routers and experts fp32, each rank's experts rounded to 16
 * bits by the layer): every step's global mean loss (aux included), step 1's gradients
 * (dense, routers, every expert) and the final parameters are compared within
 * tolerances_for_tp with the run's tp (1: tolerances_for, fp16's row flips allowed).
 * EP sends every row to the expert one device computes it on, in the same order, so
 * it adds only the dense reduction's order; TP computes the MoE whole on every rank
 * (the experts replicated over the group), so what differs is TP's own rounding.
 * The MoE model's dense vector holds no MLP weights in its MoE blocks
 * (gpt_shape_drop_moe_mlps), with TP too. A negative control, the TP-replicated
 * experts' gradients summed over TP, must miss them by far. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "matmul16.h"
#include "check_run.h"
#include "comm.h"
#include "model.h"
#include "model_runs.h"
#include "moe.h"
#include "ops.h"
#include "ops_mixed.h"
#include "rng.h"
#include "run_config.h"
#include "tolerances.h"
#include "tp_slices.h"

enum { STEPS = MODEL_RUN_STEPS, B = 4 };

typedef struct {
    precision p;
    int tp, dp;          /* dp: ranks of distinct tokens; EP over them when ep */
    int ep;
    int top_k;
    int test_expert_grads_over_tp;   /* negative control: replicated experts summed over TP */
} moe_case;

typedef model_run run_out;   /* vectors: dense whole, then routers, then every expert */

static moe_config moe_cfg(int top_k) {
    return (moe_config){.experts = 4, .top_k = top_k, .every = 2, .aux_coef = 0.01f};
}

static run_config case_config(const moe_case *c) {
    run_config cfg = run_config_default();
    cfg.model = (gpt_config){.vocab = 256, .ctx = 8, .layers = 2, .heads = 2, .dim = 16};
    cfg.batch = B;
    cfg.steps = STEPS;
    cfg.precision = c->p;
    return cfg;
}

/* Sizes of the compared vector: the whole dense model, routers, all E experts. */
typedef struct { size_t dense, routers, experts; } sizes;
/* The dense part of the MoE model (TP rank r of t): its MoE blocks hold no MLP. */
static gpt_shape dense_shape(const moe_case *c, const run_config *cfg, int t, int r) {
    gpt_shape s = gpt_shape_make(&cfg->model, t, r);
    gpt_shape_drop_moe_mlps(&s, moe_cfg(c->top_k).every);
    return s;
}

static sizes sizes_of(const moe_case *c) {
    const run_config cfg = case_config(c);
    const gpt_shape whole = dense_shape(c, &cfg, 1, 0);
    const moe_config mc = moe_cfg(c->top_k);
    const moe_shape s = moe_shape_make(&mc, &cfg.model, 1, 0);
    return (sizes){gpt_num_params(&whole), moe_router_numel(&s), moe_local_experts_numel(&s)};
}

/* One of a rank's three vectors: parameters, gradients, AdamW's moments. */
typedef struct { float *w, *g, *m, *v; size_t n; } vec4;
static vec4 vec4_make(size_t n) {
    vec4 x = {.n = n};
    float **all[] = {&x.w, &x.g, &x.m, &x.v};
    for (int i = 0; i < 4; i++) {
        *all[i] = mem_alloc(MEM_OTHER, (n ? n : 1) * sizeof(float));
        vec_zero(*all[i], n ? n : 1);
    }
    return x;
}
static void vec4_free(vec4 *x) { mem_free(x->w), mem_free(x->g), mem_free(x->m), mem_free(x->v); }

typedef struct {
    comm *tp, *data;        /* consecutive ranks; stride tp (the ranks of distinct tokens) */
    int tp_rank, data_rank;
    gpt_shape shape;
    moe_shape moe;
    vec4 dense, routers, experts;
    void *compute;          /* the dense model's 16-bit (or fp32) compute copy */
    moe_layer *layer;
    gpt_model *model;
    int *batch;
} moe_rank;

static void rank_init(moe_rank *r, comm *world, const moe_case *c, const run_config *cfg) {
    const int t = c->tp, me = comm_rank(world);
    r->tp = comm_split(world, me / t, me % t, "tp");
    r->data = comm_split(world, me % t, me / t, "data");
    r->tp_rank = me % t, r->data_rank = me / t;
    r->shape = dense_shape(c, cfg, t, r->tp_rank);
    const moe_config mc = moe_cfg(c->top_k);
    r->moe = moe_shape_make(&mc, &cfg->model, c->ep ? c->dp : 1, c->ep ? r->data_rank : 0);
    r->dense = vec4_make(gpt_num_params(&r->shape));
    r->routers = vec4_make(moe_router_numel(&r->moe));
    r->experts = vec4_make(moe_local_experts_numel(&r->moe));
    gpt_init_params(&r->shape, 5, 0, r->dense.n, r->dense.w);
    moe_init_routers(&r->moe, 5, r->routers.w);
    moe_init_local_experts(&r->moe, 5, r->experts.w);
    r->compute = mem_alloc(MEM_OTHER, r->dense.n * precision_bytes(c->p));
    mixed_round(c->p, r->compute, r->dense.w, r->dense.n);
    const int Bl = B / c->dp;
    r->layer = moe_layer_create(&r->moe, Bl * cfg->model.ctx, &(moe_layer_options){
        .world = c->dp > 1 ? r->data : NULL, .ep = c->ep ? r->data : NULL});
    moe_layer_bind(r->layer, r->routers.w, r->experts.w, r->routers.g, r->experts.g);
    const gpt_model_options o = {.precision = c->p, .tp = t > 1 ? r->tp : NULL,
                                 .mlp = moe_layer_hook(r->layer)};
    char why[256];
    ck_assert_msg(!gpt_model_options_check(&r->shape, cfg->model.ctx, &o, why, sizeof why),
                  "%s", why);
    r->model = gpt_model_create(&r->shape, Bl, cfg->model.ctx, &o);
    r->batch = mem_alloc(MEM_OTHER, 2 * (size_t)B * cfg->model.ctx * sizeof(int));
}

static void rank_free(moe_rank *r) {
    gpt_model_free(r->model);
    moe_layer_free(r->layer);
    vec4_free(&r->dense), vec4_free(&r->routers), vec4_free(&r->experts);
    mem_free(r->compute), mem_free(r->batch);
    comm_free(r->tp), comm_free(r->data);
}

/* Step s: this rank's sequences of the global batch; returns its share of the loss. */
static double rank_step(moe_rank *r, const moe_case *c, const run_config *cfg, int s) {
    const int T = cfg->model.ctx, Bl = B / c->dp, V = cfg->model.vocab;
    for (int i = 0; i < 2 * B * T; i++)
        r->batch[i] = (int)(rng_uniform(13, 1, (uint64_t)s * 2 * B * T + i) * V);
    const int *tokens = r->batch + r->data_rank * Bl * T;
    gpt_set_batch(r->model, tokens, tokens + B * T);
    vec4 *all[] = {&r->dense, &r->routers, &r->experts};
    for (int i = 0; i < 3; i++) vec_zero(all[i]->g, all[i]->n);
    moe_layer_step_begin(r->layer);
    const double loss = gpt_forward(r->model, r->compute);
    const float dloss = 1.0f / (float)(B * T);
    moe_layer_set_dloss(r->layer, dloss);
    gpt_backward(r->model, r->compute, r->dense.g, dloss, NULL, NULL);
    if (c->dp > 1) {   /* experts: over their expert-data-parallel group (1 rank with EP) */
        comm_allreduce(r->data, r->dense.g, r->dense.n, COMM_F32, COMM_SUM);
        comm_allreduce(r->data, r->routers.g, r->routers.n, COMM_F32, COMM_SUM);
        if (!c->ep) comm_allreduce(r->data, r->experts.g, r->experts.n, COMM_F32, COMM_SUM);
    }
    if (c->test_expert_grads_over_tp)
        comm_allreduce(r->tp, r->experts.g, r->experts.n, COMM_F32, COMM_SUM);
    return loss * Bl / B + moe_layer_aux_loss(r->layer) / c->dp;
}

static void rank_update(moe_rank *r, const moe_case *c, const run_config *cfg, int s) {
    vec4 *all[] = {&r->dense, &r->routers, &r->experts};
    for (int i = 0; i < 3; i++)
        if (all[i]->n) adamw_update(all[i]->w, all[i]->g, all[i]->m, all[i]->v, all[i]->n,
                                    &cfg->adamw, s + 1);
    mixed_round(c->p, r->compute, r->dense.w, r->dense.n);
}

/* Every expert, [MoE block][E], from the EP ranks' [MoE block][E / EP] (collective over
 * the data group with EP). */
static void gather_experts(const moe_rank *r, const float *mine, float *whole) {
    const moe_shape *s = &r->moe;
    const size_t X = moe_expert_numel(s), El = s->experts_local, n = s->moe_layers * El * X;
    const int EP = s->ep_size;
    float *all = mem_alloc(MEM_OTHER, EP * n * sizeof(float));
    if (EP > 1) comm_allgather(r->data, mine, all, EP * n, COMM_F32);
    else memcpy(all, mine, n * sizeof(float));
    for (int q = 0; q < EP; q++)
        for (int i = 0; i < s->moe_layers; i++)
            memcpy(whole + ((size_t)i * s->cfg.experts + q * El) * X,
                   all + q * n + (size_t)i * El * X, El * X * sizeof(float));
    mem_free(all);
}

/* Dense whole, routers, experts into out (world rank 0's), from the three vectors' w or g. */
static void keep_whole(moe_rank *r, const moe_case *c, int grads, float *out, int world_rank) {
    const sizes z = sizes_of(c);
    const float *dense = grads ? r->dense.g : r->dense.w;
    const float *routers = grads ? r->routers.g : r->routers.w;
    const float *experts = grads ? r->experts.g : r->experts.w;
    float *whole_experts = mem_alloc(MEM_OTHER, z.experts * sizeof(float));
    gather_experts(r, experts, whole_experts);
    if (r->data_rank == 0 && c->tp > 1)
        tp_gather_whole(r->tp, &r->shape, dense, world_rank == 0 ? out : NULL);
    if (world_rank == 0) {
        if (c->tp == 1) memcpy(out, dense, z.dense * sizeof(float));
        memcpy(out + z.dense, routers, z.routers * sizeof(float));
        memcpy(out + z.dense + z.routers, whole_experts, z.experts * sizeof(float));
    }
    mem_free(whole_experts);
}

typedef struct {
    const moe_case *c;
    run_out *out;
} rank_args;

static int rank_main(comm *world, void *arg) {
    const rank_args *a = arg;
    const run_config cfg = case_config(a->c);
    const int me = comm_rank(world);
    moe_rank r = {0};
    rank_init(&r, world, a->c, &cfg);
    for (int s = 0; s < STEPS; s++) {
        double loss = rank_step(&r, a->c, &cfg, s);
        if (a->c->dp > 1) comm_allreduce(r.data, &loss, 1, COMM_F64, COMM_SUM);
        if (me == 0) a->out->loss[s] = loss;
        if (s == 0) keep_whole(&r, a->c, 1, a->out->grads, me);
        rank_update(&r, a->c, &cfg, s);
    }
    keep_whole(&r, a->c, 0, a->out->params, me);
    rank_free(&r);
    return 0;
}

static void run_case(const moe_case *c, run_out *out) {
    const sizes z = sizes_of(c);
    model_run_alloc(out, z.dense + z.routers + z.experts);
    rank_args a = {c, out};
    ck_assert_int_eq(model_run_launch(c->tp * c->dp, rank_main, &a), 0);
}

/* The case against one device in its precision; returns the worst difference as a
 * fraction of its tolerance, after printing them. */
static double against_one_device(moe_case c) {
    const moe_case one = {.p = c.p, .tp = 1, .dp = 1, .top_k = c.top_k};
    run_out base, got;
    run_case(&one, &base);
    run_case(&c, &got);
    const sizes z = sizes_of(&c);
    const run_config cfg = case_config(&c);
    const run_tolerances t = tolerances_for_tp(&cfg, c.tp, model_run_largest_grad(&base));
    char name[64];
    snprintf(name, sizeof name, "%s, tp %d x %s %d, top-%d", precision_name(c.p), c.tp,
             c.ep ? "ep" : "dp", c.dp, c.top_k);
    const double worst = model_run_compare(name, &base, &got, &t, z.dense + z.routers,
                                           "experts'");
    model_run_free(&base), model_run_free(&got);
    return worst;
}

static void check_matches(precision p, int tp, int ep, int top_k) {
    const moe_case c = {.p = p, .tp = tp, .dp = ep, .ep = ep > 1, .top_k = top_k};
    ck_assert_double_le(against_one_device(c), 1.0);
}

/* The 16-bit MoE is 16-bit: its losses are not fp32's (a flag that quietly computed in
 * fp32 would pass every comparison above), and near them (16-bit rounding, of order
 * 2^-8 relative, on a loss of about ln 256). */
START_TEST(moe_in_16_bits_is_not_fp32) {
    for (int p = PRECISION_BF16; p <= PRECISION_FP16; p++) {
        run_out lo, hi;
        run_case(&(moe_case){.p = p, .tp = 1, .dp = 1, .top_k = 2}, &lo);
        run_case(&(moe_case){.p = PRECISION_FP32, .tp = 1, .dp = 1, .top_k = 2}, &hi);
        const double d = fabs(lo.loss[STEPS - 1] - hi.loss[STEPS - 1]);
        printf("%s MoE against fp32 on one device: last loss %.6f vs %.6f\n",
               precision_name((precision)p), lo.loss[STEPS - 1], hi.loss[STEPS - 1]);
        ck_assert(d > 0 && d < 0.05);
        model_run_free(&lo), model_run_free(&hi);
    }
}
END_TEST
/* ---- the layer alone: 16 bits against fp32 on the same 16-bit values ------------------ */

enum { LN = 16 };   /* tokens */

typedef struct {
    moe_shape s;
    float *routers, *experts, *rgrads, *egrads, *x, *g, *out, *dx;
    float *dx2;   /* 16 bits: the output again after the masters changed */
} layer_run;

/* v[n] uniform in (-w, w), rounded to 16-bit values of p (exact in fp32 too). */
static void fill16(precision p, float *v, size_t n, uint64_t stream, double w) {
    uint16_t *bits = malloc(n * 2);
    for (size_t i = 0; i < n; i++) v[i] = (float)((2 * rng_uniform(17, stream, i) - 1) * w);
    precision_to16(p, bits, v, n);
    precision_from16(p, v, bits, n);
    free(bits);
}

/* One forward (and backward with d out = g) of top-2 over 4 experts in precision `run`,
 * on values of precision p (the experts' from rng stream experts_stream); dloss 1/LN.
 * In 16 bits then a forward after the experts' masters changed to stream 5's (dx2). */
static layer_run layer_run_of(precision p, precision run, uint64_t experts_stream) {
    const moe_config mc = {.experts = 4, .top_k = 2, .every = 1, .aux_coef = 0.01f};
    const gpt_config model = {.vocab = 16, .ctx = LN, .layers = 1, .heads = 1, .dim = 8};
    layer_run r = {.s = moe_shape_make(&mc, &model, 1, 0)};
    const size_t R = moe_router_numel(&r.s), X = moe_local_experts_numel(&r.s), NC = LN * 8;
    float **all[] = {&r.routers, &r.experts, &r.rgrads, &r.egrads, &r.x, &r.g, &r.out, &r.dx,
                     &r.dx2};
    const size_t n[] = {R, X, R, X, NC, NC, NC, NC, NC};
    for (int i = 0; i < 9; i++) *all[i] = calloc(n[i], sizeof(float));
    fill16(p, r.routers, R, 1, 1.0), fill16(p, r.experts, X, experts_stream, 0.5);
    fill16(p, r.x, NC, 3, 1.0), fill16(p, r.g, NC, 4, 1.0);
    moe_layer *layer = moe_layer_create(&r.s, LN, &(moe_layer_options){0});
    moe_layer_bind(layer, r.routers, r.experts, r.rgrads, r.egrads);
    const gpt_mlp_hook *h = moe_layer_hook(layer);
    const size_t b = precision_bytes(run);
    void *x = malloc(NC * b), *g = malloc(NC * b), *o = malloc(NC * b), *d = malloc(NC * b);
    mixed_round(run, x, r.x, NC);   /* exact: 16-bit values */
    mixed_round(run, g, r.g, NC);
    h->forward(h->ctx, 0, 0, run, o, x);
    moe_layer_set_dloss(layer, 1.0f / LN);
    h->backward(h->ctx, 0, 0, run, d, g);
    mixed_widen(run, r.out, o, NC);
    mixed_widen(run, r.dx, d, NC);
    /* the experts' masters change (an optimizer step): the next step's forward must see
     * them */
    if (run != PRECISION_FP32) {
        fill16(p, r.experts, X, 5, 0.5);
        moe_layer_step_begin(layer);
        h->forward(h->ctx, 0, 0, run, o, x);
        mixed_widen(run, r.dx2, o, NC);
    }
    moe_layer_free(layer);
    free(x), free(g), free(o), free(d);
    return r;
}

static void layer_run_free(layer_run *r) {
    float *all[] = {r->routers, r->experts, r->rgrads, r->egrads, r->x, r->g, r->out, r->dx,
                    r->dx2};
    for (int i = 0; i < 9; i++) free(all[i]);
}

/* max |a - b| / max |b|: the difference in units of the reference's largest value */
static double relative(const float *a, const float *b, size_t n) {
    double worst = 0, largest = 0;
    for (size_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs((double)a[i] - b[i]));
        largest = fmax(largest, fabs((double)b[i]));
    }
    return worst / largest;
}

/* The 16-bit layer computes what the fp32 layer does on the same 16-bit values, but for
 * its roundings to 16 bits: an expert's h, GELU(h) and y (d y, d h and d x backward) and
 * the block's output (d ln2), each at most half a unit u (2^-8 bf16, 2^-11 fp16) of its
 * value, passed on linearly: within 8 u of each result's largest value. A wrong formula
 * (a derivative, a gate) is off by its own size. */
START_TEST(the_16_bit_layer_is_the_fp32_layer_rounded) {
    for (int p = PRECISION_BF16; p <= PRECISION_FP16; p++) {
        layer_run lo = layer_run_of(p, p, 2), hi = layer_run_of(p, PRECISION_FP32, 2);
        const double u = ldexp(1.0, p == PRECISION_BF16 ? -8 : -11);
        const size_t R = moe_router_numel(&lo.s), X = moe_local_experts_numel(&lo.s);
        const double d[] = {relative(lo.out, hi.out, LN * 8), relative(lo.dx, hi.dx, LN * 8),
                            relative(lo.rgrads, hi.rgrads, R),
                            relative(lo.egrads, hi.egrads, X)};
        printf("%s MoE layer against fp32 on its values, in units u of the largest: out %.2f,"
               " d ln2 %.2f, router grads %.2f, expert grads %.2f (at most 8)\n",
               precision_name((precision)p), d[0] / u, d[1] / u, d[2] / u, d[3] / u);
        for (int i = 0; i < 4; i++) ck_assert_double_le(d[i], 8 * u);
        ck_assert_double_gt(d[0], 0);   /* and it did round */
        /* the 16-bit copy of the experts follows their masters: after they changed, the
         * output is a fresh layer's on the new experts, bit for bit */
        layer_run fresh = layer_run_of(p, p, 5);
        ck_assert(memcmp(lo.dx2, lo.out, LN * 8 * 4) != 0);
        ck_assert(memcmp(lo.dx2, fresh.out, LN * 8 * 4) == 0);
        layer_run_free(&fresh);
        layer_run_free(&lo), layer_run_free(&hi);
    }
}
END_TEST

/* The MoE model's blocks that the MoE layer replaces hold no MLP weights: the dense
 * vector is the dense model's less those, and with routers and experts it is
 * moe_total_params. */
START_TEST(moe_blocks_hold_no_dense_mlp) {
    const moe_case c = {.p = PRECISION_FP32, .tp = 1, .dp = 1, .top_k = 2};
    const run_config cfg = case_config(&c);
    const moe_config mc = moe_cfg(2);
    const moe_shape ms = moe_shape_make(&mc, &cfg.model, 1, 0);
    const gpt_shape dense = gpt_shape_make(&cfg.model, 1, 0);
    const sizes z = sizes_of(&c);
    printf("MoE model: dense vector %zu (the dense model's %zu less %zu MLP weights of its"
           " %d MoE blocks); with routers and experts %zu = moe_total_params %.0f\n",
           z.dense, gpt_num_params(&dense), moe_dense_mlp_numel(&ms), ms.moe_layers,
           z.dense + z.routers + z.experts, moe_total_params(&ms, &cfg.model));
    ck_assert_uint_eq(z.dense, gpt_num_params(&dense) - moe_dense_mlp_numel(&ms));
    ck_assert(z.dense + z.routers + z.experts == moe_total_params(&ms, &cfg.model));
    /* a model of that shape without an MoE layer is refused */
    const gpt_shape s = dense_shape(&c, &cfg, 1, 0);
    char why[256];
    ck_assert(gpt_model_options_check(&s, cfg.model.ctx, &(gpt_model_options){0}, why,
                                      sizeof why));
    printf("refused: %s\n", why);
}
END_TEST

START_TEST(ep2_in_16_bits_matches_one_device) {
    check_matches(PRECISION_BF16, 1, 2, 2);
    check_matches(PRECISION_FP16, 1, 2, 1);
}
END_TEST
START_TEST(tp2_matches_one_device) {
    check_matches(PRECISION_FP32, 2, 1, 2);
    check_matches(PRECISION_BF16, 2, 1, 2);
    check_matches(PRECISION_FP16, 2, 1, 1);
}
END_TEST
START_TEST(tp2_ep2_matches_one_device) {
    check_matches(PRECISION_FP32, 2, 2, 1);
    check_matches(PRECISION_BF16, 2, 2, 2);
}
END_TEST

/* Negative control: the experts, replicated over TP, summed over it as if each TP rank
 * held a part: twice the gradient, far outside the tolerances. */
START_TEST(replicated_experts_summed_over_tp_fail) {
    const double worst = against_one_device((moe_case){.p = PRECISION_BF16, .tp = 2, .dp = 1,
                                                       .top_k = 2,
                                                       .test_expert_grads_over_tp = 1});
    printf("negative control, experts' gradients summed over TP: %.3g x the tolerance\n",
           worst);
    ck_assert_double_gt(worst, 10);
}
END_TEST

/* The experts' rows where 16-bit products are widened (16 rows a call) or run on a
 * native kernel that sums a row by its call (matmul16_rows_invariant: AMX's bf16): one
 * unit u per expert product a MoE block, 4 M u G and 4 M u ln V / sqrt(B T); nothing
 * where the native products hold every row, in fp32 or without MoE blocks. */
START_TEST(expert_rows_bound_where_rows_may_differ) {
    run_config cfg = {.precision = PRECISION_BF16, .batch = 8,
                      .model = {.ctx = 64, .vocab = 256}};
    const run_tolerances t = {.grads = 1e-6, .loss = 1e-3, .params = 1e-3};
    const double G = 0.5, u = 0x1p-8;
    const run_tolerances w = tolerances_with_moe_rows(t, &cfg, 2, G);
    const int widens = matmul16_widens(PRECISION_BF16) ||
                       !matmul16_rows_invariant(PRECISION_BF16);   /* rows may differ */
    printf("bf16 products %s here: step-1 gradients %.3g, loss %.3g with 2 MoE blocks\n",
           matmul16_widens(PRECISION_BF16) ? "widened"
           : widens                        ? "native, rows summed by their call"
                                           : "native, every row held", w.grads, w.loss);
    ck_assert_double_eq_tol(w.grads, widens ? 8 * u * G : t.grads, 1e-15);
    ck_assert_double_eq_tol(w.loss, widens ? 8 * u * log(256.0) / sqrt(512.0) : t.loss, 1e-15);
    ck_assert_double_eq(w.params, t.params);
    ck_assert_double_eq(tolerances_with_moe_rows(t, &cfg, 0, G).grads, t.grads);
    cfg.precision = PRECISION_FP32;
    ck_assert_double_eq(tolerances_with_moe_rows(t, &cfg, 2, G).loss, t.loss);
}
END_TEST

/* fp32 MoE past TOL_STEPS: routing flips part the runs, so the loss is not held (0) and
 * the parameters are held within AdamW's drift bound; up to TOL_STEPS, dense, or in 16
 * bits: unchanged. */
START_TEST(fp32_moe_past_tol_steps_holds_parameters_by_drift) {
    run_config cfg = {.precision = PRECISION_FP32, .steps = TOL_STEPS + 5,
                      .adamw = {.lr = 1e-3f, .warmup_steps = 0}};
    const run_tolerances t = {.grads = TOL_GRADS, .loss = TOL_LOSS, .params = TOL_PARAMS};
    const run_tolerances w = tolerances_with_moe_routing(t, &cfg, 2);
    printf("fp32 MoE over %d steps: loss %s, parameters %.3g\n", cfg.steps,
           w.loss == 0 ? "not held" : "held", w.params);
    ck_assert_double_eq(w.loss, 0);
    ck_assert_double_eq_tol(w.params, adamw_drift_bound(&cfg.adamw, cfg.steps), 1e-12);
    ck_assert_double_eq(w.grads, t.grads);
    ck_assert_double_eq(tolerances_with_moe_routing(t, &cfg, 0).loss, t.loss);
    cfg.steps = TOL_STEPS;
    ck_assert_double_eq(tolerances_with_moe_routing(t, &cfg, 2).loss, t.loss);
    cfg.steps = TOL_STEPS + 5;
    cfg.precision = PRECISION_BF16;
    ck_assert_double_eq(tolerances_with_moe_routing(t, &cfg, 2).params, t.params);
}
END_TEST

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    Suite *suite = suite_create("moe_mixed");
    TCase *tc = tcase_create("moe in 16 bits and with tp");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, moe_in_16_bits_is_not_fp32);
    tcase_add_test(tc, moe_blocks_hold_no_dense_mlp);
    tcase_add_test(tc, the_16_bit_layer_is_the_fp32_layer_rounded);
    tcase_add_test(tc, ep2_in_16_bits_matches_one_device);
    tcase_add_test(tc, tp2_matches_one_device);
    tcase_add_test(tc, tp2_ep2_matches_one_device);
    tcase_add_test(tc, replicated_experts_summed_over_tp_fail);
    tcase_add_test(tc, expert_rows_bound_where_rows_may_differ);
    tcase_add_test(tc, fp32_moe_past_tol_steps_holds_parameters_by_drift);
    suite_add_tcase(suite, tc);
    return check_run(suite, 0);
}
