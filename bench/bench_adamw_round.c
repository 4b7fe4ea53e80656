/* AdamW on the fp32 masters and their 16-bit copy: two passes (mixed_adamw_update, then
 * mixed_round, as a step did before) against one (mixed_adamw_update_round), on the
 * preset's parameter count with fp32 gradients. The two alternate round by round, so
 * that a busy moment of the machine falls on both; each figure is the median over the
 * rounds, and the ratio is taken round by round (one pass / two).
 *   build/cpu/bench/bench_adamw_round [--preset bench256] [--steps 40] [--precision bf16]
 * One thread. Prints "RESULT ratio R" last. */
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "comm.h"
#include "model.h"
#include "ops_mixed.h"

static float *filled(size_t n, float scale) {
    float *x = malloc(n * sizeof(float));
    if (!x) {
        fprintf(stderr, "error: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) x[i] = scale * ((float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f);
    return x;
}

static int by_value(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *x, int n) {
    qsort(x, (size_t)n, sizeof *x, by_value);
    return x[n / 2];
}

int main(int argc, char **argv) {
    run_config cfg = run_config_default();
    cfg.steps = 40;
    cfg.precision = PRECISION_BF16;
    char *preset_args[] = {argv[0], "--preset", "bench256"};
    if (argc == 1) {
        argc = 3;
        argv = preset_args;
    }
    cli_parse(argc, argv, &cfg, NULL, argv[0], "AdamW and the 16-bit copy: one pass or two.");
    const precision p = cfg.precision == PRECISION_FP32 ? PRECISION_BF16 : cfg.precision;
    const gpt_shape shape = gpt_shape_make(&cfg.model, 1, 0);
    const size_t n = gpt_num_params(&shape);
    float *params = filled(n, 1.0f), *grads = filled(n, 1e-2f), *m = filled(n, 0.0f);
    float *v = filled(n, 0.0f);
    void *compute = malloc(n * precision_bytes(p));
    const int rounds = cfg.steps;
    double *two = malloc((size_t)rounds * sizeof *two), *one = malloc((size_t)rounds * sizeof *one);
    double *ratio = malloc((size_t)rounds * sizeof *ratio);
    for (int r = -1; r < rounds; r++) {   /* round -1: the warm-up, page faults */
        const int step = r + 2;
        double t = comm_now();
        mixed_adamw_update(PRECISION_FP32, params, grads, 1.0f, m, v, n, &cfg.adamw, step);
        mixed_round(p, compute, params, n);
        const double t_two = comm_now() - t;
        t = comm_now();
        mixed_adamw_update_round(PRECISION_FP32, params, grads, 1.0f, m, v, n, &cfg.adamw,
                                 step, p, compute);
        const double t_one = comm_now() - t;
        if (r < 0) continue;
        two[r] = t_two, one[r] = t_one, ratio[r] = t_one / t_two;
    }
    printf("%zu parameters, %s copy, %d rounds (medians)\n", n, precision_name(p), rounds);
    printf("  update, then round:   %8.3f ms\n", 1e3 * median(two, rounds));
    printf("  update and round:     %8.3f ms\n", 1e3 * median(one, rounds));
    printf("RESULT ratio %.3f\n", median(ratio, rounds));
    free(params), free(grads), free(m), free(v), free(compute), free(two), free(one), free(ratio);
    return 0;
}
