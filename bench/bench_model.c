/* One rank, one thread: how close does a training step of the model come to the
 * machine's matmul speed? Prints the one-thread cblas_sgemm rate (1024^3), then the
 * baseline's ms/step, tokens/s and model GFLOP/s for a preset, and their ratio.
 *   build/cpu/bench/bench_model [--preset bench256] [--steps 20] */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "comm.h"
#include "report.h"
#include "baseline.h"
#include "replica.h"

static double sgemm_gflops(int n, int repeats) {
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n),
          *c = malloc(sizeof(float) * n * n);
    for (int i = 0; i < n * n; i++) {
        a[i] = (float)(i % 7) * 0.1f;
        b[i] = (float)(i % 5) * 0.1f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    double best = 1e30;
    for (int r = 0; r < repeats; r++) {
        double start = comm_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n,
                    0.0f, c, n);
        double t = comm_now() - start;
        if (t < best) best = t;
    }
    free(a);
    free(b);
    free(c);
    return 2.0 * n * n * n / best / 1e9;
}

int main(int argc, char **argv) {
    run_config cfg = run_config_default();
    cfg.steps = 20;
    cfg.quiet = 1;
    char *preset_args[] = {argv[0], "--preset", "bench256"};
    if (argc == 1) {
        argc = 3;
        argv = preset_args;
    }
    cli_parse(argc, argv, &cfg, NULL, argv[0], "Model speed against the sgemm rate.");
    cfg.quiet = 1;
    openblas_set_num_threads(1);
    double sgemm = sgemm_gflops(1024, 5);
    dataset *data = dataset_from_config(&cfg);
    baseline_run *b = baseline_train(&cfg, data);
    double ms = run_ms_per_step(&b->result);
    double flops = gpt_flops_per_step(&cfg.model, cfg.batch, cfg.model.ctx);
    double model_gflops = flops / (ms * 1e-3) / 1e9;
    printf("model: layers %d heads %d dim %d ctx %d batch %d vocab %d; %d timed steps\n",
           cfg.model.layers, cfg.model.heads, cfg.model.dim, cfg.model.ctx, cfg.batch,
           cfg.model.vocab, b->result.timed_steps);
    printf("%-34s %10.1f GFLOP/s\n", "cblas_sgemm 1024^3, 1 thread", sgemm);
    printf("%-34s %10.2f ms/step %10.0f tok/s %8.1f GFLOP/s  = %.0f%% of sgemm\n",
           "baseline training step, 1 thread", ms, run_tokens_per_second(&b->result),
           model_gflops, 100.0 * model_gflops / sgemm);
    baseline_free(b);
    dataset_free(data);
    return 0;
}
