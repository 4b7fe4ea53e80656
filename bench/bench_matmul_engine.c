/* The fp32 matmul engines against each other (matmul_engine.h) on the linears' products
 * of one 1F1B stage: half the preset's blocks (2 stages), m micro-batches of one
 * sequence each (m = batch), through linear_forward and linear_backward as a stage runs
 * them, the weights changed once a step (as an optimizer step does: oneDNN re-makes
 * their layouts at the step's first micro-batch). The engines alternate step by step,
 * so that a busy moment of the machine falls on both; each figure is the median over
 * the steps, and the ratio is taken step by step (oneDNN's time / OpenBLAS's).
 *   build/cpu/bench/bench_matmul_engine [--preset bench256] [--steps 15] [--matmul E]
 * One thread. Prints "RESULT micro_ratio R full_ratio R" last. With --matmul it runs
 * that engine's micro-batched steps alone, untimed, for a timer of whole processes. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "comm.h"
#include "matmul_engine.h"
#include "matmul_f32.h"
#include "ops.h"

typedef struct {
    int in, out;
    float *weight, *bias, *dweight, *dbias;
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

/* One step of the stage's linears: per micro-batch of `rows` rows, the forward through
 * every linear, then the backward in reverse; the seconds of all its products. */
static double stage_step(linear *ls, int n, int total_rows, int rows, float *x, float *y,
                         float *dy, float *dx) {
    matmul_weights_changed();   /* the step's update */
    const double start = comm_now();
    for (int first = 0; first < total_rows; first += rows) {
        for (int i = 0; i < n; i++)
            linear_forward(y, x + (size_t)first * ls[i].in, ls[i].weight, ls[i].bias, rows,
                           ls[i].in, ls[i].out);
        for (int i = n - 1; i >= 0; i--)
            linear_backward(dx, ls[i].dweight, ls[i].dbias, dy + (size_t)first * ls[i].out,
                            x + (size_t)first * ls[i].in, ls[i].weight, rows, ls[i].in,
                            ls[i].out);
    }
    return comm_now() - start;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Medians of each engine's step and of their ratio, rows a micro-batch; returns the
 * median ratio (oneDNN / OpenBLAS). */
static double compare(linear *ls, int n, int total_rows, int rows, int steps, float *bufs[4],
                      const char *label) {
    double *t[2], *ratio = malloc((size_t)steps * sizeof(double));
    for (int e = 0; e < 2; e++) t[e] = malloc((size_t)steps * sizeof(double));
    for (int s = -1; s < steps; s++)   /* step -1 warms both up (primitives, layouts) */
        for (int e = 0; e < 2; e++) {
            matmul_engine_set(e ? MATMUL_ONEDNN : MATMUL_OPENBLAS);
            const double sec = stage_step(ls, n, total_rows, rows, bufs[0], bufs[1], bufs[2],
                                          bufs[3]);
            if (s >= 0) t[e][s] = sec;
        }
    for (int s = 0; s < steps; s++) ratio[s] = t[1][s] / t[0][s];
    const double r = median(ratio, steps);
    printf("  %-34s %10.2f %10.2f %8.3f\n", label, 1e3 * median(t[0], steps),
           1e3 * median(t[1], steps), r);
    free(t[0]); free(t[1]); free(ratio);
    return r;
}

int main(int argc, char **argv) {
    run_config cfg = run_config_default();
    cfg.steps = 15;
    char *preset_args[] = {argv[0], "--preset", "bench256"};
    if (argc == 1) {
        argc = 3;
        argv = preset_args;
    }
    cli_parse(argc, argv, &cfg, NULL, argv[0],
              "The fp32 matmul engines on a 2-stage pipeline stage's linears: 1F1B's"
              " micro-batches of one sequence, and the full batch.");
    openblas_set_num_threads(1);
    const matmul_engine chosen = matmul_engine_current();
    const int C = cfg.model.dim, blocks = cfg.model.layers / 2 > 0 ? cfg.model.layers / 2 : 1;
    const int total_rows = cfg.batch * cfg.model.ctx, n = 4 * blocks;
    linear *ls = malloc((size_t)n * sizeof *ls);
    for (int b = 0; b < blocks; b++) {   /* qkv, proj, fc, fc2 */
        const int shape[4][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}};
        for (int k = 0; k < 4; k++) {
            const int in = shape[k][0], out = shape[k][1];
            ls[4 * b + k] = (linear){in, out, filled((size_t)out * in), filled((size_t)out),
                                     filled((size_t)out * in), filled((size_t)out)};
        }
    }
    /* activations at the widest linear's width (4C), every row */
    float *bufs[4];
    for (int i = 0; i < 4; i++) bufs[i] = filled((size_t)total_rows * 4 * C);
    printf("the linears of %d block(s), dim %d, %d rows a step; 1 thread, medians of %d"
           " alternated steps; fp32 linears: %s\n", blocks, C, total_rows, cfg.steps,
           matmul_f32_impl(0, 1, cfg.model.ctx, 3 * C, C));
    if (matmul_engine_chosen()) {   /* --matmul: that engine alone, for a timer outside */
        for (int s = 0; s <= cfg.steps; s++)
            stage_step(ls, n, total_rows, cfg.model.ctx, bufs[0], bufs[1], bufs[2], bufs[3]);
        printf("%d steps of one-sequence micro-batches on %s\n", cfg.steps + 1,
               matmul_engine_names[chosen]);
        return 0;
    }
    printf("  %-34s %10s %10s %8s\n", "rows per product", "OpenBLAS ms", "oneDNN ms",
           "ratio");
    const double micro = compare(ls, n, total_rows, cfg.model.ctx, cfg.steps, bufs,
                                 "one sequence (1F1B, m = batch)");
    const double full = compare(ls, n, total_rows, total_rows, cfg.steps, bufs,
                                "the full batch");
    printf("RESULT micro_ratio %.4f full_ratio %.4f\n", micro, full);
    matmul_engine_set(chosen);
    for (int i = 0; i < n; i++) {
        free(ls[i].weight); free(ls[i].bias); free(ls[i].dweight); free(ls[i].dbias);
    }
    for (int i = 0; i < 4; i++) free(bufs[i]);
    free(ls);
    matmul_f32_release_thread();
    return 0;
}
