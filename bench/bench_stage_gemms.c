/* Where a pipeline loses its matmul speed: the linears' products of one stage (half the
 * preset's blocks, as at 2 stages), run as a training step runs them, once on the full
 * batch and once on each of m micro-batches of one sequence, as 1F1B at m = batch does.
 * Forward, input gradient and weight gradient are timed apart, in GFLOP/s, so that the
 * gain of batching the weight gradients over the micro-batches (one product of
 * batch x ctx rows in place of m of ctx rows) is bounded by measurement: it can win
 * back at most what the weight gradients lose at a sequence's rows. The forward is also
 * timed on a transposed copy of the weights ([in, out], a product without transposes),
 * which a stage would have to transpose again after every update: the copy pays only if
 * it saves more than that transpose costs a step.
 *   build/cpu/bench/bench_stage_gemms [--preset bench256] [--steps 20]
 * One thread; the best of --steps steps of each, alternated. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "comm.h"

enum { FORWARD, INPUT_GRAD, WEIGHT_GRAD, FORWARD_ON_W_T, KINDS };
static const char *kind_names[KINDS] = {"forward", "input grad", "weight grad",
                                        "fwd on W^T"};

/* One linear of a block: weight [out, in], its input and output gradient at the most
 * rows (the full batch). */
typedef struct {
    int in, out;
    float *weight, *dweight, *inp, *dinp, *outp, *dout;
    float *weight_t;   /* [in, out]: the weight transposed */
} linear;

static float *filled(size_t n) {
    float *x = malloc(n * sizeof(float));
    if (!x) {
        fprintf(stderr, "error: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) x[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    return x;
}

/* weight_t = weight^T, through a 16 x 16 tile in L1: read by rows, written by rows
 * (measured 2.6x faster here than writing weight_t's columns straight). */
static void transpose_weight(linear *l) {
    enum { T = 16 };
    const size_t in = (size_t)l->in, out = (size_t)l->out;
    for (size_t o0 = 0; o0 < out; o0 += T)
        for (size_t i0 = 0; i0 < in; i0 += T) {
            const size_t oe = o0 + T < out ? o0 + T : out, ie = i0 + T < in ? i0 + T : in;
            float tile[T][T];
            for (size_t o = o0; o < oe; o++)
                for (size_t i = i0; i < ie; i++) tile[i - i0][o - o0] = l->weight[o * in + i];
            for (size_t i = i0; i < ie; i++)
                for (size_t o = o0; o < oe; o++) l->weight_t[i * out + o] = tile[i - i0][o - o0];
        }
}

static linear linear_make(int in, int out, int rows) {
    linear l = {.in = in, .out = out, .weight = filled((size_t)out * in),
                .dweight = filled((size_t)out * in), .inp = filled((size_t)rows * in),
                .dinp = filled((size_t)rows * in), .outp = filled((size_t)rows * out),
                .dout = filled((size_t)rows * out), .weight_t = filled((size_t)out * in)};
    transpose_weight(&l);
    return l;
}

static void linear_free(linear *l) {
    float *all[] = {l->weight, l->dweight, l->inp, l->dinp, l->outp, l->dout, l->weight_t};
    for (int i = 0; i < 7; i++) free(all[i]);
}

/* One product of a kind on `rows` rows starting at row `first`, timed into seconds[]. */
static void product(linear *l, int kind, int first, int rows, double seconds[KINDS]) {
    const float *x = l->inp + (size_t)first * l->in, *dy = l->dout + (size_t)first * l->out;
    const double start = comm_now();
    if (kind == FORWARD)   /* out[rows,out] = inp @ weight^T */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, l->out, l->in, 1.0f, x,
                    l->in, l->weight, l->in, 1.0f, l->outp + (size_t)first * l->out, l->out);
    else if (kind == FORWARD_ON_W_T)   /* the same from weight_t [in, out] */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, l->out, l->in, 1.0f, x,
                    l->in, l->weight_t, l->out, 1.0f, l->outp + (size_t)first * l->out,
                    l->out);
    else if (kind == INPUT_GRAD)   /* dinp[rows,in] = dout @ weight */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, l->in, l->out, 1.0f, dy,
                    l->out, l->weight, l->in, 0.0f, l->dinp + (size_t)first * l->in, l->in);
    else   /* dweight[out,in] += dout^T @ inp */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, l->out, l->in, rows, 1.0f, dy,
                    l->out, x, l->in, 1.0f, l->dweight, l->in);
    seconds[kind] += comm_now() - start;
}

/* One step of the stage: per micro-batch of `rows` rows, the forward through every
 * linear, then the backward in reverse (input gradient, then weight gradient), as the
 * model runs them. */
static void stage_step(linear *ls, int n, int total_rows, int rows, double seconds[KINDS]) {
    for (int first = 0; first < total_rows; first += rows) {
        for (int i = 0; i < n; i++) product(&ls[i], FORWARD, first, rows, seconds);
        for (int i = 0; i < n; i++) product(&ls[i], FORWARD_ON_W_T, first, rows, seconds);
        for (int i = n - 1; i >= 0; i--) {
            product(&ls[i], INPUT_GRAD, first, rows, seconds);
            product(&ls[i], WEIGHT_GRAD, first, rows, seconds);
        }
    }
}

/* Seconds to transpose every weight of the stage once (as after an update), the best
 * of `steps` tries. */
static double transpose_seconds(linear *ls, int n, int steps) {
    double best = 1e30;
    for (int s = 0; s <= steps; s++) {
        const double start = comm_now();
        for (int i = 0; i < n; i++) transpose_weight(&ls[i]);
        if (s > 0 && comm_now() - start < best) best = comm_now() - start;
    }
    return best;
}

static double stage_flops(const linear *ls, int n, int total_rows) {
    double flops = 0;
    for (int i = 0; i < n; i++) flops += 2.0 * total_rows * ls[i].in * ls[i].out;
    return flops;
}

/* GFLOP/s of each kind, full batch and micro-batches, the best of `steps` steps of each;
 * the two alternate step by step, so that a busy moment of the machine falls on both. */
static void measure(linear *ls, int n, int total_rows, int micro_rows, int steps,
                    double full[KINDS], double micro[KINDS]) {
    const int rows[2] = {total_rows, micro_rows};
    double *rate[2] = {full, micro};
    double best[2][KINDS];
    for (int v = 0; v < 2; v++)
        for (int k = 0; k < KINDS; k++) best[v][k] = 1e30;
    for (int s = 0; s <= steps; s++)   /* the first warms up */
        for (int v = 0; v < 2; v++) {
            double seconds[KINDS] = {0};
            stage_step(ls, n, total_rows, rows[v], seconds);
            for (int k = 0; k < KINDS && s > 0; k++)
                if (seconds[k] < best[v][k]) best[v][k] = seconds[k];
        }
    const double flops = stage_flops(ls, n, total_rows);   /* each kind does as many */
    for (int v = 0; v < 2; v++)
        for (int k = 0; k < KINDS; k++) rate[v][k] = flops / best[v][k] / 1e9;
}

/* The table, what batching the weight gradients could save, and what a kept W^T for the
 * forward saves net of its transpose a step (both as fractions of the micro-batched
 * step's products); flops: each kind's work in a step. */
static void report(const double full[KINDS], const double micro[KINDS], double flops,
                   double transpose_s) {
    printf("  %-34s", "rows per product");
    for (int k = 0; k < KINDS; k++) printf(" %12s", kind_names[k]);
    printf("\n  %-34s", "the full batch");
    for (int k = 0; k < KINDS; k++) printf(" %12.1f", full[k]);
    printf("\n  %-34s", "one sequence (m = batch)");
    for (int k = 0; k < KINDS; k++) printf(" %12.1f", micro[k]);
    printf("\n  %-34s", "one sequence / full batch");
    for (int k = 0; k < KINDS; k++) printf(" %12.2f", micro[k] / full[k]);
    /* seconds a step: each kind does the same FLOPs; batching the weight gradients turns
     * their micro-batched time into the full batch's */
    double seconds[KINDS], step = 0;
    for (int k = 0; k < KINDS; k++) seconds[k] = flops / micro[k] / 1e9;
    for (int k = FORWARD; k <= WEIGHT_GRAD; k++) step += seconds[k];
    const double w_saves = (seconds[WEIGHT_GRAD] - flops / full[WEIGHT_GRAD] / 1e9) / step;
    const double wt_saves = (seconds[FORWARD] - seconds[FORWARD_ON_W_T] - transpose_s) / step;
    printf("\n  batching the weight gradients over the micro-batches saves at most %.1f%% of"
           " these products' time\n", 100.0 * w_saves);
    printf("  the forward on a kept W^T saves %.2f ms a step at one sequence, its transpose"
           " after each update costs %.2f ms: net %.1f%% of the products' time\n",
           1e3 * (seconds[FORWARD] - seconds[FORWARD_ON_W_T]), 1e3 * transpose_s,
           100.0 * wt_saves);
    printf("RESULT forward %.3f input_grad %.3f weight_grad %.3f w_batching_saves %.4f"
           " wt_forward_saves %.4f\n", micro[FORWARD] / full[FORWARD],
           micro[INPUT_GRAD] / full[INPUT_GRAD], micro[WEIGHT_GRAD] / full[WEIGHT_GRAD],
           w_saves, wt_saves);
}

int main(int argc, char **argv) {
    run_config cfg = run_config_default();
    cfg.steps = 20;
    char *preset_args[] = {argv[0], "--preset", "bench256"};
    if (argc == 1) {
        argc = 3;
        argv = preset_args;
    }
    cli_parse(argc, argv, &cfg, NULL, argv[0],
              "The linears' products of a 2-stage pipeline's stage: full batch against"
              " micro-batches of one sequence.");
    openblas_set_num_threads(1);
    const int C = cfg.model.dim, blocks = cfg.model.layers / 2 > 0 ? cfg.model.layers / 2 : 1;
    const int total_rows = cfg.batch * cfg.model.ctx, n = 4 * blocks;
    linear *ls = malloc((size_t)n * sizeof *ls);
    for (int b = 0; b < blocks; b++) {   /* qkv, proj, fc, fc2 */
        ls[4 * b + 0] = linear_make(C, 3 * C, total_rows);
        ls[4 * b + 1] = linear_make(C, C, total_rows);
        ls[4 * b + 2] = linear_make(C, 4 * C, total_rows);
        ls[4 * b + 3] = linear_make(4 * C, C, total_rows);
    }
    double full[KINDS], micro[KINDS];
    measure(ls, n, total_rows, cfg.model.ctx, cfg.steps, full, micro);
    printf("the linears of %d block(s), dim %d, %d x %d rows a step; 1 thread, best of %d"
           " steps (GFLOP/s)\n", blocks, C, cfg.batch, cfg.model.ctx, cfg.steps);
    report(full, micro, stage_flops(ls, n, total_rows), transpose_seconds(ls, n, cfg.steps));
    for (int i = 0; i < n; i++) linear_free(&ls[i]);
    free(ls);
    return 0;
}
