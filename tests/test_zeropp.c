/* ZeRO++ (zeropp.h) trained as ZeRO-3's options on 4 thread ranks as 2 nodes of 2, the
 * uneven model (small_model.h), against references built here from the model itself:
 *   step 1's gradients: every rank's own gradient computed on its sequences (on the
 *     weights each shard's int8 codec gives under qwZ, tolerances.h), then, under qgZ,
 *     the two hops' serial reference and bound (each element within the sum of its
 *     N + d encodings' A / 14), else their fp32 sum: every element within
 *     bound + TOL_GRADS;
 *   bytes per tier per step equal to zeropp_tier_bytes to the byte, FSDP and HSDP too;
 *   hpZ's parameter bytes at rest exceed FSDP's by zeropp_hpz_extra_bytes exactly;
 *   the loss of all three pieces over 20 steps within ZEROPP_LOSS_BAND of fp32 ZeRO-3's
 *     (and the longer runs' band, on the mean, by hand).
 * Negative controls: a doubled block scale on the wire (qwZ, qgZ) leaves the gradient
 * bound; hpZ gathering across the nodes leaves the bytes formula. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "check_run.h"
#include "replica.h"
#include "small_model.h"
#include "tolerances.h"
#include "zero_train.h"

enum { RANKS = 4, PER_NODE = 2, NODES = RANKS / PER_NODE };

static run_config zpp_config(int steps) {
    run_config cfg = uneven_model_config(RANKS);
    cfg.steps = steps;
    cfg.comm.ranks_per_node = PER_NODE;   /* tiers counted; no link, no waiting */
    return cfg;
}

static void run(const run_config *cfg, const dataset *d, zero_options opts, strategy_outcome *o) {
    *o = (strategy_outcome){0};
    ck_assert_int_eq(zero_launch(cfg, d, &opts, o), 0);
    ck_assert_ptr_nonnull(o->first_grads);
}

/* The whole model's initial weights, each slab's N shards through qwZ's codec if asked. */
static float *initial_weights(const run_config *cfg, const gpt_shape *s, int qwz) {
    const size_t P = gpt_num_params(s);
    float *w = malloc(P * sizeof *w), *back = malloc(P * sizeof *back);
    unsigned char *enc = malloc(2 * P + 64);
    gpt_init_params(s, cfg->seed, 0, P, w);
    for (int slab = 0, at = 0; qwz && slab < gpt_num_slabs(s); slab++) {
        const size_t S = gpt_slab_numel(s, slab);
        for (int r = 0; r < RANKS; r++) {
            size_t off, len = comm_shard(S, RANKS, r, &off);
            quant_encode(QUANT_INT8, ZEROPP_WEIGHT_BLOCK, w + at + off, len, enc);
            quant_decode(QUANT_INT8, ZEROPP_WEIGHT_BLOCK, enc, len, back);
            memcpy(w + at + off, back, len * sizeof *w);
        }
        at += (int)S;
    }
    free(enc);
    free(back);
    return w;
}

/* Rank r's step-1 gradient on weights w: its sequences of the global batch, dloss
 * 1 / (B T), as zero_train gives it. */
static void rank_grads(const run_config *cfg, const dataset *d, const gpt_shape *s,
                       const float *w, int r, float *out) {
    const size_t P = gpt_num_params(s);
    size_t first;
    const int count = (int)comm_shard((size_t)cfg->batch, RANKS, r, &first);
    gpt_model *m = gpt_model_create(s, count, cfg->model.ctx, &(gpt_model_options){0});
    float *dw = mem_alloc_on(MEM_DEVICE, MEM_OTHER, P * sizeof *dw);
    float *dg = mem_alloc_on(MEM_DEVICE, MEM_OTHER, P * sizeof *dg);
    ops_upload(dw, w, P * sizeof *dw);
    vec_zero(dg, P);
    load_batch(m, d, cfg, 1, (int)first, count);   /* steps count from 1 */
    gpt_forward(m, dw);
    gpt_backward(m, dw, dg, 1.0f / ((float)cfg->batch * cfg->model.ctx), NULL, NULL);
    ops_download(out, dg, P * sizeof *dg);
    mem_free(dg);
    mem_free(dw);
    gpt_model_free(m);
}

static float absmax_of_block(const float *x, size_t len, size_t i) {
    float a = 0;
    const size_t b = ZEROPP_GRAD_BLOCK, first = i / b * b;
    for (size_t j = first; j < len && j < first + b; j++) a = fmaxf(a, fabsf(x[j]));
    return a;
}

/* back[len] = x through qgZ's codec. */
static void codec4(const float *x, size_t len, unsigned char *enc, float *back) {
    quant_encode(QUANT_INT4, ZEROPP_GRAD_BLOCK, x, len, enc);
    quant_decode(QUANT_INT4, ZEROPP_GRAD_BLOCK, enc, len, back);
}

/* qgZ's bound for one owner's shard [off, off + len) of a slab at `at`: the N + d
 * encodings' A / 14 (tolerances.h). g: [RANKS][P]. */
static void qgz_bound(const float *g, size_t P, size_t at, size_t off, size_t len,
                      double *bound) {
    float *partial = calloc(len + 1, sizeof *partial), *back = malloc((len + 1) * 4);
    unsigned char *enc = malloc(len + 64);
    for (int j = 0; j < NODES; j++) {
        memset(partial, 0, len * sizeof *partial);
        for (int l = 0; l < PER_NODE; l++) {
            const float *x = g + (size_t)(j * PER_NODE + l) * P + at + off;
            codec4(x, len, enc, back);
            for (size_t i = 0; i < len; i++) {
                partial[i] += back[i];
                bound[i] += quant_block_bound(QUANT_INT4, absmax_of_block(x, len, i));
            }
        }
        for (size_t i = 0; i < len; i++)
            bound[i] += quant_block_bound(QUANT_INT4, absmax_of_block(partial, len, i));
    }
    free(enc);
    free(back);
    free(partial);
}

/* The worst |run - exact sum| / (bound + TOL_GRADS) over the step-1 gradient. */
static double grads_fraction(const run_config *cfg, const dataset *d, int pieces,
                             const float *run_grads) {
    const gpt_shape s = gpt_shape_make(&cfg->model, 1, 0);
    const size_t P = gpt_num_params(&s);
    float *w = initial_weights(cfg, &s, pieces & ZEROPP_QWZ);
    float *g = malloc((size_t)RANKS * P * sizeof *g);
    double *bound = calloc(P, sizeof *bound), worst = 0;
    for (int r = 0; r < RANKS; r++) rank_grads(cfg, d, &s, w, r, g + (size_t)r * P);
    for (int slab = 0, at = 0; (pieces & ZEROPP_QGZ) && slab < gpt_num_slabs(&s); slab++) {
        const size_t S = gpt_slab_numel(&s, slab);
        for (int o = 0; o < RANKS; o++) {
            size_t off, len = comm_shard(S, RANKS, o, &off);
            qgz_bound(g, P, (size_t)at, off, len, bound + at + off);
        }
        at += (int)S;
    }
    for (size_t i = 0; i < P; i++) {
        double exact = 0;
        for (int r = 0; r < RANKS; r++) exact += g[(size_t)r * P + i];
        worst = fmax(worst, fabs(run_grads[i] - exact) / (bound[i] + TOL_GRADS));
    }
    free(bound);
    free(g);
    free(w);
    return worst;
}

static int bytes_on_formula(const run_config *cfg, const strategy_outcome *o, int pieces,
                            int hsdp, double formula[2]) {
    const gpt_shape s = gpt_shape_make(&cfg->model, 1, 0);
    zeropp_tier_bytes(&s, pieces, hsdp, RANKS, PER_NODE, formula);
    return o->result.tier_bytes_per_step[0] == formula[0] &&
           o->result.tier_bytes_per_step[1] == formula[1];
}

START_TEST(step1_gradients_bytes_and_memory) {
    dataset *d = dataset_builtin();
    const run_config cfg = zpp_config(3);
    const int cases[6][2] = {{0, 0}, {0, 1}, {ZEROPP_QWZ, 0}, {ZEROPP_HPZ, 0},
                             {ZEROPP_QGZ, 0}, {ZEROPP_ALL, 0}};   /* pieces, hsdp */
    double fsdp_params = 0;
    for (int k = 0; k < 6; k++) {
        strategy_outcome o;
        run(&cfg, d, (zero_options){.stage = 3, .zeropp = cases[k][0], .hsdp = cases[k][1]}, &o);
        const double f = grads_fraction(&cfg, d, cases[k][0], o.first_grads);
        double formula[2];
        const int bytes_ok = bytes_on_formula(&cfg, &o, cases[k][0], cases[k][1], formula);
        char name[32];
        zeropp_name(cases[k][0], name, sizeof name);
        printf("%s%s, 2 nodes of 2: step-1 gradients at %.3f of their bound; bytes per step"
               " intra %.0f inter %.0f (formula %.0f, %.0f); parameters at rest %.0f B\n",
               cases[k][1] ? "HSDP" : "ZeRO-3 ", cases[k][1] ? "" : name, f,
               o.result.tier_bytes_per_step[0], o.result.tier_bytes_per_step[1], formula[0],
               formula[1], o.state[0]);
        ck_assert(f <= 1);
        ck_assert(bytes_ok);
        if (k == 0) fsdp_params = o.state[0];
        if (cases[k][0] == ZEROPP_HPZ) {
            const gpt_shape s = gpt_shape_make(&cfg.model, 1, 0);
            const double extra = zeropp_hpz_extra_bytes(&s, PER_NODE);
            printf("hpZ's secondary shards: %.0f B more than FSDP's, formula %.0f B\n",
                   o.state[0] - fsdp_params, extra);
            ck_assert(o.state[0] - fsdp_params == extra);
        }
        strategy_outcome_free(&o);
    }
    dataset_free(d);
}
END_TEST

START_TEST(negative_controls_fail) {
    dataset *d = dataset_builtin();
    const run_config cfg = zpp_config(1);
    const int scale_pieces[2] = {ZEROPP_QWZ, ZEROPP_QGZ};
    for (int k = 0; k < 2; k++) {
        strategy_outcome o;
        run(&cfg, d, (zero_options){.stage = 3, .zeropp = scale_pieces[k],
                                    .zeropp_fault = ZEROPP_FAULT_WRONG_SCALE}, &o);
        const double f = grads_fraction(&cfg, d, scale_pieces[k], o.first_grads);
        printf("negative control: %s with a doubled block scale: step-1 gradients at %.1f of"
               " their bound\n", k ? "qgZ" : "qwZ", f);
        ck_assert(f > 1);
        strategy_outcome_free(&o);
    }
    strategy_outcome o;
    run(&cfg, d, (zero_options){.stage = 3, .zeropp = ZEROPP_HPZ,
                                .zeropp_fault = ZEROPP_FAULT_HPZ_ACROSS}, &o);
    double formula[2];
    const int bytes_ok = bytes_on_formula(&cfg, &o, ZEROPP_HPZ, 0, formula);
    printf("negative control: hpZ gathering across the nodes: %.0f B across per step, formula"
           " %.0f\n", o.result.tier_bytes_per_step[1], formula[1]);
    ck_assert(!bytes_ok);
    strategy_outcome_free(&o);
    dataset_free(d);
}
END_TEST

START_TEST(loss_curve_within_the_band) {
    dataset *d = dataset_builtin();
    const run_config cfg = zpp_config(20);
    strategy_outcome fp32, o;
    run(&cfg, d, (zero_options){.stage = 3}, &fp32);
    const int pieces[4] = {ZEROPP_QWZ, ZEROPP_QGZ, ZEROPP_ALL, ZEROPP_ALL};
    for (int k = 0; k < 4; k++) {
        const zeropp_fault fault = k == 3 ? ZEROPP_FAULT_WRONG_SCALE : ZEROPP_FAULT_NONE;
        run(&cfg, d, (zero_options){.stage = 3, .zeropp = pieces[k], .zeropp_fault = fault}, &o);
        const double f = zeropp_loss_band_fraction(o.loss, fp32.loss, cfg.steps);
        char name[32];
        printf("%s%s, 20 steps: loss %.4f -> %.4f (fp32 %.4f -> %.4f), at %.2f of the band"
               " (%.0e relative)\n", fault ? "negative control: a doubled scale, " : "ZeRO++ ",
               zeropp_name(pieces[k], name, sizeof name), o.loss[0], o.loss[cfg.steps - 1],
               fp32.loss[0], fp32.loss[cfg.steps - 1], f, ZEROPP_LOSS_BAND);
        ck_assert(fault ? f > 1 : f <= 1);
        strategy_outcome_free(&o);
    }
    strategy_outcome_free(&fp32);
    dataset_free(d);
}
END_TEST

/* The band past ZEROPP_BAND_STEPS steps is the mean's: steps 3% apart either way pass,
 * a curve 3% above all along does not (the control). */
START_TEST(long_runs_are_held_by_their_mean) {
    enum { STEPS = ZEROPP_BAND_STEPS + 10 };
    float fp32[STEPS], noisy[STEPS], shifted[STEPS];
    for (int i = 0; i < STEPS; i++) {
        fp32[i] = 5.0f - 0.1f * (float)i;
        noisy[i] = fp32[i] * (i % 2 ? 1.03f : 0.97f);
        shifted[i] = fp32[i] * 1.03f;
    }
    const double f = zeropp_loss_band_fraction(noisy, fp32, STEPS);
    const double g = zeropp_loss_band_fraction(shifted, fp32, STEPS);
    printf("%d steps: +-3%% step by step at %.2f of the mean's band; 3%% above all along at"
           " %.2f\n", STEPS, f, g);
    ck_assert(f <= 1);
    ck_assert(g > 1);
}
END_TEST

int main(void) {
    Suite *s = suite_create("zeropp");
    TCase *tc = tcase_create("zeropp");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, step1_gradients_bytes_and_memory);
    tcase_add_test(tc, negative_controls_fail);
    tcase_add_test(tc, loss_curve_within_the_band);
    tcase_add_test(tc, long_runs_are_held_by_their_mean);
    suite_add_tcase(s, tc);
    return check_run(s, 0);
}
