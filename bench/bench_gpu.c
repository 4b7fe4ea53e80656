/* A GPT-2-small-sized training step on one GPU: ms/step, tokens/s and achieved TFLOP/s,
 * FP32 and TF32, for the comparison with PyTorch eager on the same model
 * (bench/pytorch_gpt2.py prints the same lines).
 *
 * The model is the course's own (common/model.c on the CUDA ops): 12 layers, 12 heads,
 * dim 768, ctx 1024, vocab 50304 (GPT-2's, padded to a multiple of 64), tied LM head,
 * AdamW; a batch of random tokens, uploaded every step as training does. Untimed
 * warm-up steps first; the timed ones are measured with CUDA events on the rank's
 * stream. FLOPs per step: gpt_flops_per_step (6 x parameters x tokens + attention).
 *   GPU=1 make benches && build/cpu-gpu/bench/bench_gpu [--batch 16] [--steps 10]
 *       [--untimed 3] [--math fp32|tf32|both]
 * Without a GPU (or in a build without GPU=1) it prints "SKIP: <why>" and exits 0.
 * Besides the table it prints one "RESULT ..." line per precision for scripts. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "alloc.h"
#include "cli.h"
#include "device.h"
#include "ops.h"
#include "rng.h"
#include "baseline.h"
#include "replica.h"

#ifdef USE_CUDA
#include <cuda_runtime.h>

#include "cuda_check.h"
#include "ops_cuda.h"

typedef struct {
    double ms_per_step, tokens_per_s, tflops;
    float first_loss, last_loss;
    size_t peak_bytes;
} bench_result;

static bench_result run_precision(const run_config *cfg, int tf32, int warmup) {
    const int B = cfg->batch, T = cfg->model.ctx, V = cfg->model.vocab;
    const size_t N = (size_t)B * T;
    cuda_set_tf32(tf32);
    mem_stats stats = {0};
    mem_stats *caller = mem_stats_current();
    mem_stats_bind(&stats);

    gpt_shape shape = gpt_shape_make(&cfg->model, 1, 0);
    replica rep;
    replica_init(&rep, &shape, cfg->seed, 1);
    gpt_model *model = gpt_model_create(&shape, B, T, NULL);
    /* random tokens: speed should not depend on the text */
    int *tokens = malloc(2 * N * sizeof(int));
    for (size_t i = 0; i < 2 * N; i++)
        tokens[i] = (int)(rng_hash(cfg->seed, 5, i) % (uint64_t)V);
    const float dloss = 1.0f / (float)N;

    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    bench_result r = {0};
    for (int step = 1; step <= warmup + cfg->steps; step++) {
        if (step == warmup + 1) CUDA_CHECK(cudaEventRecord(start, cuda_thread_stream()));
        gpt_set_batch(model, tokens, tokens + N);
        vec_zero(rep.grads, rep.num_params);
        float loss = gpt_forward(model, rep.params);
        gpt_backward(model, rep.params, rep.grads, dloss, NULL, NULL);
        replica_adamw(&rep, &cfg->adamw);
        if (step == 1) r.first_loss = loss;
        r.last_loss = loss;
    }
    CUDA_CHECK(cudaEventRecord(stop, cuda_thread_stream()));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    r.ms_per_step = ms / cfg->steps;
    r.tokens_per_s = (double)N / (r.ms_per_step * 1e-3);
    r.tflops = gpt_flops_per_step(&cfg->model, B, T) / (r.ms_per_step * 1e-3) / 1e12;
    r.peak_bytes = stats.peak_total;

    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    free(tokens);
    gpt_model_free(model);
    replica_free(&rep);
    mem_stats_bind(caller);
    cuda_set_tf32(0);
    return r;
}
#endif

int main(int argc, char **argv) {
    run_config cfg = run_config_default();
    cfg.model = (gpt_config){.vocab = 50304, .ctx = 1024, .layers = 12, .heads = 12, .dim = 768};
    cfg.batch = 16;
    cfg.steps = 10;
    cfg.adamw.warmup_steps = 0;
    /* (--warmup and --precision are every program's: the learning rate's warm-up, and
     * fp32, bf16, ...) */
    int untimed = 3, math = 2;
    static const char *const maths[] = {"fp32", "tf32", "both", NULL};
    const cli_option options[] = {
        {"untimed", OPT_INT, &untimed, "untimed steps before the timed ones", NULL, 0},
        {"math", OPT_CHOICE, &math, "the products' math: fp32, TF32 or both", maths, 0},
        {0},
    };
    cli_parse(argc, argv, &cfg, options, argv[0],
              "GPT-2-small training step on one GPU: ms/step, tokens/s, TFLOP/s.");
    if (device_gpu_count() == 0) {
        char why[160];
        printf("SKIP: no GPU to time: %s\n", device_no_gpu_reason(why, sizeof why));
        return 0;
    }
#ifdef USE_CUDA
    device_select(DEVICE_CUDA, 0);
    char name[96];
    cuda_device_name(0, name, sizeof name);
    gpt_shape shape = gpt_shape_make(&cfg.model, 1, 0);
    printf("GPT-2 small training step on %s: layers %d, heads %d, dim %d, ctx %d, vocab %d"
           " = %.1fM parameters; batch %d x %d tokens; %d warm-up + %d timed steps\n",
           name, cfg.model.layers, cfg.model.heads, cfg.model.dim, cfg.model.ctx,
           cfg.model.vocab, gpt_num_params(&shape) / 1e6, cfg.batch, cfg.model.ctx, untimed,
           cfg.steps);
    printf("%-10s %10s %12s %9s %22s %12s\n", "precision", "ms/step", "tokens/s", "TFLOP/s",
           "loss first -> last", "device mem");
    int status = 0;
    for (int tf32 = 0; tf32 <= 1; tf32++) {
        if ((math == 0 && tf32) || (math == 1 && !tf32)) continue;
        bench_result r = run_precision(&cfg, tf32, untimed);
        char mem[32];
        printf("%-10s %10.1f %12.0f %9.2f %10.4f -> %-9.4f %12s\n", tf32 ? "tf32" : "fp32",
               r.ms_per_step, r.tokens_per_s, r.tflops, r.first_loss, r.last_loss,
               report_bytes((double)r.peak_bytes, mem));
        printf("RESULT impl=c precision=%s batch=%d ms=%.3f tokens_per_s=%.0f tflops=%.3f"
               " loss=%.4f\n", tf32 ? "tf32" : "fp32", cfg.batch, r.ms_per_step,
               r.tokens_per_s, r.tflops, r.last_loss);
        fflush(stdout);
        /* random tokens: the first loss is about ln(vocab); anything else is a bug */
        if (!isfinite(r.first_loss) || fabs(r.first_loss - log((double)cfg.model.vocab)) > 1.0)
            status = 1;
    }
    return status;
#else
    return 0;
#endif
}
