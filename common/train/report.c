#include "report.h"

#include "fp8_linear.h"
#include "matmul_engine.h"
#include "restart.h"
#include "op_profile.h"

#include <math.h>
#include <string.h>

double run_ms_per_step(const run_result *r) {
    return r->timed_steps > 0 ? 1e3 * r->seconds / r->timed_steps : 0.0;
}

double run_tokens_per_second(const run_result *r) {
    return r->seconds > 0 ? r->tokens_per_step * r->timed_steps / r->seconds : 0.0;
}

double run_comm_fraction(const run_result *r) {
    return r->seconds > 0 ? r->comm_seconds / r->seconds : 0.0;
}

const char *report_bytes(double bytes, char buf[32]) {
    const char *units[] = {"B", "KB", "MB", "GB", "TB"};
    int u = 0;
    while (fabs(bytes) >= 1000.0 && u < 4) {
        bytes /= 1000.0;
        u++;
    }
    snprintf(buf, 32, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
    return buf;
}

void report_step(const run_config *cfg, const char *strategy, int step, float loss,
                 double seconds, double tokens) {
    if (cfg->quiet || cfg->json) return;
    printf("  %-10s step %4d/%-4d loss %.4f  %8.1f ms  %8.0f tok/s\n", strategy, step,
           cfg->steps, loss, 1e3 * seconds, seconds > 0 ? tokens / seconds : 0.0);
    fflush(stdout);
}

void report_header(const run_config *cfg, const char *title, int world, int launches) {
    gpt_shape s = gpt_shape_make(&cfg->model, 1, 0);
    report_header_counting(cfg, title, world, launches, (double)gpt_num_params(&s));
}

void report_header_counting(const run_config *cfg, const char *title, int world,
                            int launches, double params) {
    if (cfg->json) return;
    const gpt_config *m = &cfg->model;
    printf("%s\n", title);
    printf("model: layers %d, heads %d, dim %d, ctx %d, vocab %d = %.0f parameters;"
           " global batch %d x %d tokens; %d steps\n",
           m->layers, m->heads, m->dim, m->ctx, m->vocab, params, cfg->batch, m->ctx,
           cfg->steps);
    const char *backend = launches ? launch_backend_name(&cfg->comm, world) : NULL;
    if (backend) printf("ranks: %d (%s backend)", world, backend);
    else if (world > 1) printf("ranks: %d threads of one process (no communicator)", world);
    else printf("ranks: 1 (no communicator)");
    printf("; data: %s; seed %llu\n",
           cfg->data_path ? cfg->data_path : "built-in sentences",
           (unsigned long long)cfg->seed);
    char where[320];   /* what launch will really run: device and communicator */
    launch_describe(&cfg->comm, world, where, sizeof where);
    if (!launches) where[strcspn(where, ";")] = 0;   /* no communicator to describe */
    printf("%s\n", where);
    if (cfg->precision != PRECISION_FP32 && cfg->grad_precision == PRECISION_FP32)
        printf("precision: %s compute (activations, compute weights), fp32 master weights,"
               " gradients and AdamW\n", precision_name(cfg->precision));
    else if (cfg->precision != PRECISION_FP32)
        printf("precision: %s compute (activations, compute weights) and gradients, fp32"
               " master weights and AdamW\n", precision_name(cfg->precision));
    const int hybrid = cfg->fp8_format == FP8_FORMAT_HYBRID;
    if (cfg->fp8)
        printf("fp8: the linears' forward products on E4M3 inputs scaled %s (emulated, fp32"
               " sums; backward products %s; LM head bf16); no FP8 unit here: accuracy,"
               " not speed\n", fp8_recipe_name(cfg->fp8_recipe),
               hybrid ? "on E5M2 gradients and E4M3 W, X (hybrid)" : "bf16");
    printf("\n");
}

static void print_diff(double d) {
    if (d < 0) printf(" %9s", "-");
    else printf(" %9.2e", d);
}

void report_table(const run_config *cfg, const run_result *runs, int n) {
    if (cfg->json) return;
    int name_width = 12;   /* as wide as the longest strategy name ("pp-interleaved") */
    for (int i = 0; i < n; i++)
        if ((int)strlen(runs[i].strategy) > name_width) name_width = (int)strlen(runs[i].strategy);
    printf("\n%-*s %10s %9s %9s %9s %9s %9s %7s %12s %12s %10s\n", name_width, "strategy",
           "final loss", "d loss", "d grads", "d params", "ms/step", "tok/s", "comm %",
           "sent/rank/st", "formula", "peak mem");
    for (int i = 0; i < n; i++) {
        const run_result *r = &runs[i];
        char sent[32], formula[32], peak[32];
        printf("%-*s %10.4f", name_width, r->strategy,
               r->steps > 0 ? r->loss[r->steps - 1] : NAN);
        print_diff(r->diff_loss);
        print_diff(r->diff_grads);
        print_diff(r->diff_params);
        printf(" %9.1f %9.0f %6.1f%% %12s %12s %10s\n", run_ms_per_step(r),
               run_tokens_per_second(r), 100.0 * run_comm_fraction(r),
               report_bytes(r->bytes_sent_per_step, sent),
               r->bytes_formula >= 0 ? report_bytes(r->bytes_formula, formula) : "-",
               report_bytes((double)r->memory.peak_total, peak));
    }
    if (cfg->precision == PRECISION_FP16)
        for (int i = 0; i < n; i++)
            printf("%-*s fp16 loss scale after the last step %g; steps skipped for overflowing"
                   " gradients: %d\n", name_width, runs[i].strategy,
                   (double)runs[i].loss_scale, runs[i].skipped_steps);
}

static void json_number(double v) {
    if (!isfinite(v)) printf("null");
    else printf("%.9g", v);
}

void report_json(const run_config *cfg, const char *chapter, int world,
                 const char *backend, const run_result *runs, int n, const char *extra) {
    const gpt_config *m = &cfg->model;
    printf("{\"chapter\": \"%s\", \"world\": %d, \"backend\": \"%s\", \"device\": \"%s\",\n",
           chapter, world, backend, cfg->comm.device == DEVICE_CUDA ? "cuda" : "cpu");
    printf(" \"config\": {\"layers\": %d, \"heads\": %d, \"dim\": %d, \"ctx\": %d, "
           "\"batch\": %d, \"vocab\": %d, \"steps\": %d, \"seed\": %llu},\n",
           m->layers, m->heads, m->dim, m->ctx, cfg->batch, m->vocab, cfg->steps,
           (unsigned long long)cfg->seed);
    printf(" \"precision\": \"%s\", \"grad_dtype\": \"%s\",",
           cfg->fp8 ? "fp8" : precision_name(cfg->precision), precision_name(cfg->grad_precision));
    if (cfg->fp8)
        printf(" \"fp8_recipe\": \"%s\", \"fp8_format\": \"%s\",", fp8_recipe_name(cfg->fp8_recipe),
               fp8_training_format_name((fp8_training_format)cfg->fp8_format));
    printf("\n");
    printf(" \"runs\": [");
    for (int i = 0; i < n; i++) {
        const run_result *r = &runs[i];
        printf("%s\n  {\"strategy\": \"%s\", \"loss\": [", i ? "," : "", r->strategy);
        for (int s = 0; s < r->steps; s++) {
            if (s) printf(", ");
            json_number(r->loss[s]);
        }
        printf("],\n   \"diff_vs_baseline\": {\"loss\": ");
        json_number(r->diff_loss < 0 ? NAN : r->diff_loss);
        printf(", \"grads\": ");
        json_number(r->diff_grads < 0 ? NAN : r->diff_grads);
        printf(", \"params\": ");
        json_number(r->diff_params < 0 ? NAN : r->diff_params);
        printf("},\n   \"ms_per_step\": ");
        json_number(run_ms_per_step(r));
        printf(", \"tokens_per_s\": ");
        json_number(run_tokens_per_second(r));
        printf(", \"comm_fraction\": ");
        json_number(run_comm_fraction(r));
        printf(", \"comm_hidden_s\": ");
        json_number(r->hidden_seconds);
        printf(", \"loss_scale\": ");
        json_number(r->loss_scale);
        printf(", \"skipped_steps\": %d", r->skipped_steps);
        printf(",\n   \"bytes_sent_per_rank_per_step\": %.0f, \"bytes_formula\": ",
               r->bytes_sent_per_step);
        json_number(r->bytes_formula < 0 ? NAN : r->bytes_formula);
        printf(",\n   \"memory_per_rank\": {\"params\": %zu, \"grads\": %zu, "
               "\"optimizer\": %zu, \"activations\": %zu, \"comm\": %zu, \"peak\": %zu}",
               r->memory.peak[MEM_PARAMS], r->memory.peak[MEM_GRADS],
               r->memory.peak[MEM_OPTIMIZER], r->memory.peak[MEM_ACTIVATIONS],
               r->memory.peak[MEM_COMM], r->memory.peak_total);
        if (r->sgemm_floor_seconds > 0)
            printf(",\n   \"sgemm_floor_ms_per_step\": %.4f, \"fastest_ms_per_step\": %.4f,"
                   " \"blas_kernel\": \"%s\", \"matmul_engine\": \"%s\"",
                   1e3 * r->sgemm_floor_seconds, 1e3 * r->fastest_step_seconds,
                   op_profile_blas_kernel(), matmul_engine_names[matmul_engine_current()]);
        if (r->sgemm_floor_seconds > 0 && cfg->precision != PRECISION_FP32)
            printf(", \"matmul16_kernel\": \"%s\"", op_profile_matmul16_kernel());
        if (r->json_extra) printf(",\n   %s", r->json_extra);
        printf("}");
    }
    printf("]%s%s", extra ? ",\n " : "", extra ? extra : "");
    restart_json_keys(cfg);   /* after failures: what they cost */
    printf("}\n");
}

/* The measurements that are maximised over ranks, packed as doubles. */
enum { M_SECONDS, M_COMM, M_COMM_LEAST, M_HIDDEN, M_BYTES, M_INTRA, M_INTER, M_PEAK0,
       M_COUNT = M_PEAK0 + MEM_NTAGS + 1 };

void run_result_take_max(comm *group, run_result *r) {
    double mine[M_COUNT];
    mine[M_SECONDS] = r->seconds;
    mine[M_COMM] = r->comm_seconds;
    mine[M_COMM_LEAST] = -r->comm_seconds;   /* the largest of minus: the least */
    mine[M_HIDDEN] = r->hidden_seconds;
    mine[M_BYTES] = r->bytes_sent_per_step;
    mine[M_INTRA] = r->tier_bytes_per_step[COMM_TIER_INTRA];
    mine[M_INTER] = r->tier_bytes_per_step[COMM_TIER_INTER];
    for (int t = 0; t < MEM_NTAGS; t++) mine[M_PEAK0 + t] = (double)r->memory.peak[t];
    mine[M_PEAK0 + MEM_NTAGS] = (double)r->memory.peak_total;
    comm_allreduce(group, mine, M_COUNT, COMM_F64, COMM_MAX);
    r->seconds = mine[M_SECONDS];
    r->comm_seconds = mine[M_COMM];
    r->comm_seconds_least = -mine[M_COMM_LEAST];
    r->hidden_seconds = mine[M_HIDDEN];
    r->bytes_sent_per_step = mine[M_BYTES];
    r->tier_bytes_per_step[COMM_TIER_INTRA] = mine[M_INTRA];
    r->tier_bytes_per_step[COMM_TIER_INTER] = mine[M_INTER];
    for (int t = 0; t < MEM_NTAGS; t++) r->memory.peak[t] = (size_t)mine[M_PEAK0 + t];
    r->memory.peak_total = (size_t)mine[M_PEAK0 + MEM_NTAGS];
}

void run_result_add_comm(run_result *r, comm *world, int steps) {
    comm_stats s = comm_stats_all(world);
    r->comm_seconds = comm_stats_total_seconds(&s);
    r->hidden_seconds = s.hidden_seconds;
    r->bytes_sent_per_step = steps > 0 ? (double)comm_stats_total_sent(&s) / steps : 0;
}
