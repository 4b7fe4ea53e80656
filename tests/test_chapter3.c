/* Chapter 3, tensor parallelism, on the threads backend: split linear layers, the
 * Megatron block and the vocab-parallel loss against their unsplit versions, the
 * all-reduce counts, and whole-model training against the single-device baseline. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor_parallel.h"
#include "alloc.h"
#include "compare.h"
#include "ops.h"
#include "rng.h"
#include "vocab_parallel.h"
#include "check_run.h"
#include "tolerances.h"

enum { MAX_RANKS = 4 };

static int run_ranks(int ranks, rank_main_fn fn, void *args) {
    comm_options o = comm_options_default();
    o.ranks = ranks;
    o.timeout_seconds = 60;
    return launch(&o, fn, args);
}

static float *random_floats(size_t n, uint64_t stream, float scale) {
    float *x = mem_alloc(MEM_OTHER, n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = scale * rng_normal(77, stream, i);
    return x;
}

static double max_of(const double *x, int n) {
    double m = 0;
    for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

/* ---- column- and row-parallel linear ---------------------------------------------- */

typedef struct {
    int N, IC, OC;
    double column[MAX_RANKS], row[MAX_RANKS];   /* largest difference seen by each rank */
} linear_case;

/* Copies columns [c0, c0 + width) of a [rows, cols] matrix. */
static float *columns_of(const float *m, int rows, int cols, int c0, int width) {
    float *out = mem_alloc(MEM_OTHER, (size_t)rows * width * sizeof(float));
    for (int i = 0; i < rows; i++) memcpy(out + (size_t)i * width, m + (size_t)i * cols + c0, width * 4);
    return out;
}

static double worst(double a, double b) { return a > b ? a : b; }

static int linear_rank(comm *world, void *p) {
    linear_case *c = p;
    const int t = comm_size(world), r = comm_rank(world), N = c->N, IC = c->IC, OC = c->OC;
    float *X = random_floats((size_t)N * IC, 1, 1), *W = random_floats((size_t)OC * IC, 2, 1);
    float *b = random_floats(OC, 3, 1), *dY = random_floats((size_t)N * OC, 4, 1);
    /* the unsplit layer */
    float *Y = random_floats((size_t)N * OC, 5, 0), *dX = random_floats((size_t)N * IC, 5, 0);
    float *dW = random_floats((size_t)OC * IC, 5, 0), *db = random_floats(OC, 5, 0);
    linear_forward(Y, X, W, b, N, IC, OC);
    linear_backward(dX, dW, db, dY, X, W, N, IC, OC);

    /* column-parallel: my OC/t outputs */
    const int OCl = OC / t, ICl = IC / t;
    float *y_local = random_floats((size_t)N * OCl, 5, 0), *y = random_floats((size_t)N * OC, 5, 0);
    float *dx = random_floats((size_t)N * IC, 5, 0), *dw = random_floats((size_t)OCl * IC, 5, 0);
    float *dbl = random_floats(OCl, 5, 0);
    float *dy_local = columns_of(dY, N, OC, r * OCl, OCl);
    column_parallel_forward(PRECISION_FP32, y_local, X, W + (size_t)r * OCl * IC, b + r * OCl, N,
                            IC, OCl);
    column_parallel_gather(world, y, y_local, N, OCl);
    column_parallel_backward(world, PRECISION_FP32, dx, dw, dbl, dy_local, X,
                             W + (size_t)r * OCl * IC, N, IC, OCl);
    double d = max_abs_diff(y, Y, (size_t)N * OC);
    d = worst(d, max_abs_diff(dx, dX, (size_t)N * IC));
    d = worst(d, max_abs_diff(dw, dW + (size_t)r * OCl * IC, (size_t)OCl * IC));
    d = worst(d, max_abs_diff(dbl, db + r * OCl, OCl));
    c->column[r] = d;

    /* row-parallel: my IC/t inputs */
    float *x_local = columns_of(X, N, IC, r * ICl, ICl), *w_local = columns_of(W, OC, IC, r * ICl, ICl);
    float *dx_local = random_floats((size_t)N * ICl, 5, 0), *dw2 = random_floats((size_t)OC * ICl, 5, 0);
    float *db2 = random_floats(OC, 5, 0);
    row_parallel_forward(world, PRECISION_FP32, y, x_local, w_local, b, N, ICl, OC);
    row_parallel_backward(PRECISION_FP32, dx_local, dw2, db2, dY, x_local, w_local, N, ICl, OC);
    float *dX_mine = columns_of(dX, N, IC, r * ICl, ICl), *dW_mine = columns_of(dW, OC, IC, r * ICl, ICl);
    d = max_abs_diff(y, Y, (size_t)N * OC);
    d = worst(d, max_abs_diff(dx_local, dX_mine, (size_t)N * ICl));
    d = worst(d, max_abs_diff(dw2, dW_mine, (size_t)OC * ICl));
    d = worst(d, max_abs_diff(db2, db, OC));
    c->row[r] = d;

    float *all[] = {X, W, b, dY, Y, dX, dW, db, y_local, y, dx, dw, dbl, dy_local, x_local,
                    w_local, dx_local, dw2, db2, dX_mine, dW_mine};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) mem_free(all[i]);
    return 0;
}

START_TEST(column_and_row_linear_match_the_unsplit_linear) {
    const double tol = 1e-5;
    for (int t = 1; t <= 4; t++) {
        linear_case c = {.N = 5, .IC = 12, .OC = 12};   /* 12 divides by 1, 2, 3 and 4 */
        ck_assert_int_eq(run_ranks(t, linear_rank, &c), 0);
        double col = max_of(c.column, t), row = max_of(c.row, t);
        printf("linear t=%d: column-parallel max diff %.2e, row-parallel max diff %.2e"
               " (forward and all gradients; tol %.0e)\n", t, col, row, tol);
        ck_assert_msg(col <= tol, "column-parallel t=%d differs by %g", t, col);
        ck_assert_msg(row <= tol, "row-parallel t=%d differs by %g", t, row);
    }
}
END_TEST

/* ---- part 1 by hand: uneven pieces ----------------------------------------------------- */

typedef struct { split_report report; } split_case;

static int split_rank(comm *world, void *p) {
    split_case *c = p;
    run_config cfg = run_config_default();
    cfg.json = 1;   /* silent */
    split_report rep;
    part1_matrix_split(world, &cfg, &rep);
    if (comm_rank(world) == 0) c->report = rep;
    return 0;
}

START_TEST(matrix_split_by_hand_matches_the_whole_product) {
    for (int t = 1; t <= 4; t++) {   /* 3 ranks: 8 rows split 3 + 3 + 2 */
        split_case c;
        ck_assert_int_eq(run_ranks(t, split_rank, &c), 0);
        printf("part 1 t=%d: rows split max diff %.2e (gathered %.0f B, formula %.0f), columns"
               " split max diff %.2e (reduced %.0f B, formula %.0f)\n", t, c.report.diff_column,
               c.report.bytes_gather, c.report.formula_gather, c.report.diff_row,
               c.report.bytes_reduce, c.report.formula_reduce);
        ck_assert(c.report.diff_column == 0.0);   /* the same dot products, bit for bit */
        ck_assert(c.report.diff_row <= 1e-5);
        ck_assert(t == 1 || c.report.bytes_reduce > 0);
    }
}
END_TEST

/* ---- the Megatron block ------------------------------------------------------------------ */

static const gpt_config block_cfg = {.vocab = 256, .ctx = 8, .layers = 1, .heads = 4, .dim = 16};

typedef struct {
    megatron_block_options opts;
    block_report report;
} block_case;

static int block_rank(comm *world, void *p) {
    block_case *c = p;
    block_report rep;
    block_compare(world, &block_cfg, 2, block_cfg.ctx, 5, &c->opts, &rep);
    if (comm_rank(world) == 0) c->report = rep;
    return 0;
}

START_TEST(megatron_block_matches_the_unsplit_block) {
    const double tol = 1e-5;
    const int sizes[] = {1, 2, 4};
    for (int i = 0; i < 3; i++) {
        const int t = sizes[i];
        block_case c = {0};
        ck_assert_int_eq(run_ranks(t, block_rank, &c), 0);
        const block_report *r = &c.report;
        printf("block t=%d: max diff output %.2e, d input %.2e, d params %.2e (tol %.0e);"
               " all-reduces forward %d backward %d; params per rank %zu of %zu\n", t,
               r->diff_out, r->diff_dx, r->diff_grads, tol, r->allreduces_forward,
               r->allreduces_backward, r->params_per_rank, r->params_whole);
        ck_assert(r->diff_out <= tol && r->diff_dx <= tol && r->diff_grads <= tol);
        ck_assert_int_eq(r->allreduces_forward, t > 1 ? 2 : 0);
        ck_assert_int_eq(r->allreduces_backward, t > 1 ? 2 : 0);
        /* 12 C^2 + 7 C split over t, LayerNorms and row-parallel biases (6 C) kept */
        const size_t C = block_cfg.dim;
        ck_assert_uint_eq(r->params_per_rank, (12 * C * C + 7 * C) / t + 6 * C);
    }
}
END_TEST

/* Negative control: without f's all-reduce in backward every rank's d(ln) holds only
 * its own heads' and units' share, and the comparison must fail. */
START_TEST(block_without_f_backward_fails) {
    block_case c = {.opts = {.drop_f_backward = 1}};
    ck_assert_int_eq(run_ranks(2, block_rank, &c), 0);
    const block_report *r = &c.report;
    printf("negative control (f backward dropped, t=2): output diff %.2e (still fine),"
           " d input diff %.2e, d params diff %.2e (must exceed 1e-3)\n", r->diff_out,
           r->diff_dx, r->diff_grads);
    ck_assert(r->diff_out <= 1e-5);
    ck_assert(r->diff_dx > 1e-3);
    ck_assert(r->diff_grads > 1e-3);
    ck_assert_int_eq(r->allreduces_backward, 0);
}
END_TEST

/* ---- slicing = the model's initialisation, and gathering inverts it ---------------------- */

static const gpt_config train_cfg = {.vocab = 256, .ctx = 8, .layers = 2, .heads = 12, .dim = 24};

START_TEST(slices_are_where_the_model_initialises_them) {
    gpt_config c = train_cfg;
    c.vocab = 259;   /* pads for t = 2, 3 and 4 */
    gpt_shape whole = gpt_shape_make(&c, 1, 0);
    size_t n_whole = gpt_num_params(&whole);
    float *full = mem_alloc(MEM_OTHER, n_whole * 4), *back = mem_alloc(MEM_OTHER, n_whole * 4);
    gpt_init_params(&whole, 3, 0, n_whole, full);
    for (int t = 1; t <= 4; t++) {
        for (int r = 0; r < t; r++) {
            gpt_shape s = gpt_shape_make(&c, t, r);
            gpt_shape_split_vocab(&s);
            size_t n = gpt_num_params(&s);
            float *init = mem_alloc(MEM_OTHER, n * 4), *taken = mem_alloc(MEM_OTHER, n * 4);
            gpt_init_params(&s, 3, 0, n, init);
            tp_slice_model(&s, full, taken, SLICE_TAKE, 1);
            ck_assert_msg(memcmp(init, taken, n * 4) == 0, "t=%d rank %d", t, r);
            tp_slice_model(&s, back, taken, SLICE_PUT, r == 0);
            mem_free(init);
            mem_free(taken);
        }
        ck_assert_msg(memcmp(full, back, n_whole * 4) == 0, "t=%d: put back differs", t);
        memset(back, 0, n_whole * 4);
    }
    printf("slices: gpt_init_params of every rank's slice (t = 1..4, vocab 259) equals the"
           " slice taken from the whole; putting them back rebuilds it bit for bit\n");
    mem_free(full);
    mem_free(back);
}
END_TEST

/* ---- vocab-parallel cross-entropy ------------------------------------------------------- */

typedef struct {
    int N, V;
    double diff_loss[MAX_RANKS], diff_grad[MAX_RANKS], padding_grad[MAX_RANKS];
} ce_case;

static int ce_rank(comm *world, void *p) {
    ce_case *c = p;
    const int t = comm_size(world), r = comm_rank(world), N = c->N, V = c->V;
    gpt_config cfg = {.vocab = V, .ctx = N, .layers = 1, .heads = t, .dim = t};
    gpt_shape s = gpt_shape_make(&cfg, t, r);
    gpt_shape_split_vocab(&s);
    vocab_slice vs = vocab_slice_of(&s, N);
    float *logits = random_floats((size_t)N * V, 21, 3.0f);
    int targets[64];
    for (int n = 0; n < N; n++) targets[n] = (int)(rng_uniform(77, 22, n) * V);
    /* plain: the whole row on one rank */
    float *probs = random_floats((size_t)N * V, 5, 0), *losses = random_floats(N, 5, 0);
    crossentropy_forward(losses, probs, logits, targets, N, V);
    crossentropy_backward(probs, probs, targets, 0.25f, N, V);
    /* split: my columns; padding columns get a large value that must not count */
    float *mine = random_floats((size_t)N * vs.vocab_local, 5, 0);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < vs.vocab_local; j++)
            mine[(size_t)n * vs.vocab_local + j] =
                j < vs.vocab_valid ? logits[(size_t)n * V + vs.vocab_start + j] : 50.0f;
    float *my_losses = random_floats(N, 5, 0);
    vocab_parallel_crossentropy_forward(world, my_losses, mine, mine, targets, vs);
    vocab_parallel_crossentropy_backward(mine, mine, targets, 0.25f, vs);
    c->diff_loss[r] = max_abs_diff(my_losses, losses, N);
    double dg = 0, pad = 0;
    for (int n = 0; n < N; n++)
        for (int j = 0; j < vs.vocab_local; j++) {
            float g = mine[(size_t)n * vs.vocab_local + j];
            if (j < vs.vocab_valid) dg = worst(dg, fabs(g - probs[(size_t)n * V + vs.vocab_start + j]));
            else pad = worst(pad, fabs(g));
        }
    c->diff_grad[r] = dg;
    c->padding_grad[r] = pad;
    mem_free(logits);
    mem_free(probs);
    mem_free(losses);
    mem_free(mine);
    mem_free(my_losses);
    return 0;
}

START_TEST(vocab_parallel_cross_entropy_matches_the_plain_one) {
    const double tol = 1e-6;
    const int vocabs[] = {10, 5, 259};   /* 5 on 4 ranks: rank 3 holds only padding */
    for (int k = 0; k < 3; k++)
        for (int t = 1; t <= 4; t++) {
            ce_case c = {.N = 7, .V = vocabs[k]};
            ck_assert_int_eq(run_ranks(t, ce_rank, &c), 0);
            double dl = max_of(c.diff_loss, t), dg = max_of(c.diff_grad, t);
            double pad = max_of(c.padding_grad, t);
            printf("vocab-parallel CE V=%d t=%d: max diff loss %.2e, d logits %.2e, padding"
                   " gradient %.1e (tol %.0e)\n", c.V, t, dl, dg, pad, tol);
            ck_assert(dl <= tol && dg <= tol);
            ck_assert(pad == 0.0);
        }
}
END_TEST

/* ---- all-reduce counts of the model's own TP block -------------------------------------- */

typedef struct {
    int fwd, bwd, step;
    double bytes_fwd, bytes_bwd, formula;
} count_case;

static int count_rank(comm *world, void *p) {
    count_case *c = p;
    const int t = comm_size(world), B = 2, T = train_cfg.ctx;
    gpt_shape s = gpt_shape_make(&train_cfg, t, comm_rank(world));
    gpt_shape_split_vocab(&s);
    replica rep;
    replica_init(&rep, &s, 9, 0);
    gpt_model *m = gpt_model_create(&s, B, T, &(gpt_model_options){.tp = world});
    dataset *d = dataset_builtin();
    run_config cfg = run_config_default();
    cfg.model = train_cfg;
    load_batch(m, d, &cfg, 1, 0, B);
    const float *block = rep.params + gpt_slab_offset(&s, 1);
    float *block_grad = rep.grads + gpt_slab_offset(&s, 1);
    const size_t final = gpt_slab_offset(&s, gpt_final_slab(&s));

    gpt_embed_forward(m, rep.params);
    comm_stats s0 = comm_stats_get(world);
    gpt_block_forward(m, 0, block);
    comm_stats s1 = comm_stats_get(world);
    gpt_block_forward(m, 1, rep.params + gpt_slab_offset(&s, 2));
    gpt_head_forward(m, rep.params + final, rep.params);
    gpt_head_backward(m, rep.params + final, rep.params, rep.grads + final, rep.grads, 0.1f);
    gpt_block_backward(m, 1, rep.params + gpt_slab_offset(&s, 2), rep.grads + gpt_slab_offset(&s, 2));
    comm_stats s2 = comm_stats_get(world);
    gpt_block_backward(m, 0, block, block_grad);
    comm_stats s3 = comm_stats_get(world);
    /* a whole step */
    gpt_forward(m, rep.params);
    gpt_backward(m, rep.params, rep.grads, 0.1f, NULL, NULL);
    comm_stats s4 = comm_stats_get(world);
    const int A = COMM_KIND_ALLREDUCE;
    if (comm_rank(world) == 0) {
        c->fwd = (int)(s1.calls[A] - s0.calls[A]);
        c->bwd = (int)(s3.calls[A] - s2.calls[A]);
        c->step = (int)(s4.calls[A] - s3.calls[A]);
        c->bytes_fwd = (double)(s1.bytes_sent[A] - s0.bytes_sent[A]);
        c->bytes_bwd = (double)(s3.bytes_sent[A] - s2.bytes_sent[A]);
        c->formula = 2 * 2.0 * (t - 1) / t * B * T * train_cfg.dim * 4;
    }
    dataset_free(d);
    gpt_model_free(m);
    replica_free(&rep);
    return 0;
}

START_TEST(model_block_all_reduces_twice_forward_and_twice_backward) {
    for (int t = 2; t <= 4; t += 2) {
        count_case c;
        ck_assert_int_eq(run_ranks(t, count_rank, &c), 0);
        printf("model block t=%d: all-reduces forward %d, backward %d (bytes %.0f and %.0f,"
               " ring formula %.0f); whole step %d = 4L + 4 with L = %d\n", t, c.fwd, c.bwd,
               c.bytes_fwd, c.bytes_bwd, c.formula, c.step, train_cfg.layers);
        ck_assert_int_eq(c.fwd, 2);
        ck_assert_int_eq(c.bwd, 2);
        ck_assert_int_eq(c.step, 4 * train_cfg.layers + 4);
        ck_assert(fabs(c.bytes_fwd - c.formula) <= 0.05 * c.formula);
    }
}
END_TEST

/* ---- whole-model training against the baseline ------------------------------------------ */


typedef struct {
    run_config cfg;
    int tp;
    tp_options opts;
    const dataset *data;
    const baseline_run *baseline;
    strategy_outcome run;   /* world rank 0's, allocated before the ranks start */
    tp_extra extra;
    run_result result;
    double drift;
} train_case;

static int train_rank(comm *world, void *p) {
    train_case *c = p;
    const int rank = comm_rank(world), t = c->tp;
    mesh m;
    mesh_create(&m, world, (mesh_shape){.tp = t, .pp = 1, .dp = comm_size(world) / t});
    strategy_outcome local, *run = strategy_outcome_for_rank(world, &c->run, &local);
    tp_train(world, &m, &c->cfg, &c->opts, c->data, run);
    if (rank == 0) {
        compare_to_baseline(&run->result, c->baseline, run->loss, run->first_grads,
                            run->final_params);
        c->result = run->result;
        c->drift = c->extra.replica_drift;
    }
    mesh_free(&m);
    return 0;
}

/* Trains on `ranks` thread ranks with TP size t and compares with the baseline. */
static train_case train_against_baseline(int ranks, int t, int steps, tp_options opts) {
    train_case c = {.cfg = run_config_default(), .tp = t, .opts = opts};
    c.cfg.model = train_cfg;
    c.cfg.batch = 4;
    c.cfg.steps = steps;
    c.cfg.quiet = 1;
    dataset *d = dataset_builtin();
    baseline_run *b = baseline_train(&c.cfg, d);
    c.data = d;
    c.baseline = b;
    c.run.extra = &c.extra;
    strategy_outcome_alloc(&c.run, &c.cfg);
    ck_assert_int_eq(run_ranks(ranks, train_rank, &c), 0);
    strategy_outcome_free(&c.run);
    c.result.loss = NULL;
    baseline_free(b);
    dataset_free(d);
    c.data = NULL;
    c.baseline = NULL;
    return c;
}

static void check_training(int ranks, int t) {
    train_case c = train_against_baseline(ranks, t, 5, (tp_options){0});
    const run_result *r = &c.result;
    printf("training tp=%d dp=%d, 5 steps: max diff loss %.2e (tol %.0e), grads of step 1"
           " %.2e (tol %.0e), params %.2e (tol %.0e); replicas drift %.1e\n", t, ranks / t,
           r->diff_loss, TOL_LOSS, r->diff_grads, TOL_GRADS, r->diff_params, TOL_PARAMS,
           c.drift);
    ck_assert(r->diff_loss <= TOL_LOSS);
    ck_assert(r->diff_grads <= TOL_GRADS);
    ck_assert(r->diff_params <= TOL_PARAMS);
    ck_assert(c.drift == 0.0);
    /* the ring's volume, measured against the formula the chapter prints: uneven
     * ring chunks may differ by a few bytes per collective (relative tolerance 1e-3) */
    const double bytes_error = r->bytes_formula > 0
                                     ? fabs(r->bytes_sent_per_step / r->bytes_formula - 1.0)
                                     : r->bytes_sent_per_step;   /* one rank sends nothing */
    printf("  bytes per rank per step: %.0f measured, %.0f formula (relative error %.1e)\n",
           r->bytes_sent_per_step, r->bytes_formula, bytes_error);
    ck_assert_msg(bytes_error <= 1e-3, "bytes sent %.0f differ from the formula %.0f",
                  r->bytes_sent_per_step, r->bytes_formula);
}

START_TEST(training_with_tp2_matches_the_baseline) { check_training(2, 2); }
END_TEST
START_TEST(training_with_tp4_matches_the_baseline) { check_training(4, 4); }
END_TEST
START_TEST(training_with_tp3_and_a_padded_vocabulary_matches_the_baseline) {
    check_training(3, 3);   /* 256 = 3 x 86 - 2: two padding rows */
}
END_TEST
START_TEST(training_with_tp2_times_dp2_matches_the_baseline) { check_training(4, 2); }
END_TEST

/* The negative control of the drift figure and of f: without f's backward all-reduce
 * every TP rank's LayerNorm gradients hold only its own heads' part, the replicated
 * copies drift apart and the gradients leave the baseline's. */
START_TEST(training_without_f_backward_drifts_and_fails) {
    train_case c = train_against_baseline(2, 2, 2, (tp_options){.drop_f_backward = 1});
    printf("training tp=2 without f backward: grads differ by %.2e, replicas drift %.2e\n",
           c.result.diff_grads, c.drift);
    ck_assert_msg(c.drift > 0, "the replicated copies did not drift");
    ck_assert_msg(c.result.diff_grads > 100 * TOL_GRADS, "grads differ by only %g",
                  c.result.diff_grads);
}
END_TEST

/* ---- sizes are checked before any rank starts ------------------------------------------- */

START_TEST(sizes_that_do_not_divide_are_refused_with_what_would_work) {
    run_config cfg = run_config_default();   /* heads 4, dim 128, batch 8 */
    char err[512];
    ck_assert(tp_check_sizes(&cfg, 4, 0, err, sizeof err));
    ck_assert(tp_check_sizes(&cfg, 4, 2, err, sizeof err));
    ck_assert(!tp_check_sizes(&cfg, 3, 3, err, sizeof err));
    printf("refused: %s\n", err);
    /* only what passes every check is offered: 1, 2 and 4 divide the heads, not 3 ranks */
    ck_assert(strstr(err, "--tp 3 does not divide --heads 4") &&
              strstr(err, "TP sizes that work on 3 ranks: none"));
    ck_assert(!tp_check_sizes(&cfg, 3, 0, err, sizeof err));
    ck_assert(strstr(err, "size 3 (the rank count) does not divide --heads 4"));
    /* 6 heads on 4 ranks: 3 and 6 divide the heads but not the ranks */
    cfg.model.heads = 6;
    cfg.model.dim = 96;
    ck_assert(!tp_check_sizes(&cfg, 4, 4, err, sizeof err));
    printf("refused: %s\n", err);
    const char *offered = strstr(err, "TP sizes that work on 4 ranks: ");
    ck_assert(offered && strcmp(offered + strlen("TP sizes that work on 4 ranks: "), "1, 2") == 0);
    cfg.model.dim = 128;
    cfg.model.heads = 8;
    cfg.batch = 12;
    ck_assert(!tp_check_sizes(&cfg, 6, 4, err, sizeof err));
    printf("refused: %s\n", err);
    ck_assert(strstr(err, "--tp 4 does not divide the 6 ranks") && strstr(err, ": 1, 2"));
    cfg.batch = 6;
    ck_assert(!tp_check_sizes(&cfg, 4, 1, err, sizeof err));
    printf("refused: %s\n", err);
    ck_assert(strstr(err, "--batch 6 does not split over 4 data-parallel groups"));
}
END_TEST

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);   /* lines survive a failing (forked) test */
    Suite *suite = suite_create("chapter3");
    TCase *layers = tcase_create("layers");
    tcase_set_timeout(layers, 60);
    tcase_add_test(layers, column_and_row_linear_match_the_unsplit_linear);
    tcase_add_test(layers, matrix_split_by_hand_matches_the_whole_product);
    tcase_add_test(layers, megatron_block_matches_the_unsplit_block);
    tcase_add_test(layers, block_without_f_backward_fails);
    tcase_add_test(layers, slices_are_where_the_model_initialises_them);
    tcase_add_test(layers, vocab_parallel_cross_entropy_matches_the_plain_one);
    tcase_add_test(layers, model_block_all_reduces_twice_forward_and_twice_backward);
    tcase_add_test(layers, sizes_that_do_not_divide_are_refused_with_what_would_work);
    suite_add_tcase(suite, layers);
    TCase *training = tcase_create("training");
    tcase_set_timeout(training, 120);
    tcase_add_test(training, training_with_tp2_matches_the_baseline);
    tcase_add_test(training, training_with_tp4_matches_the_baseline);
    tcase_add_test(training, training_with_tp3_and_a_padded_vocabulary_matches_the_baseline);
    tcase_add_test(training, training_with_tp2_times_dp2_matches_the_baseline);
    tcase_add_test(training, training_without_f_backward_drifts_and_fails);
    suite_add_tcase(suite, training);
    return check_run(suite, 0);
}
