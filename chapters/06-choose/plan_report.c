/* The planner's output: one table of strategies, the decision tree walked, the time of
 * the choice, training days, the largest models and how often to save a checkpoint; or
 * the same as one JSON object. */
#include <stdio.h>

#include "plan_cp.h"
#include "planner.h"
#include "report.h"

#define GB 1e9
static const char *const max_names[] = {"ddp", "zero1", "zero2", "zero3"};

static double tokens_per_second(const plan_request *r, const plan_row *row) {
    return row->step.total > 0 ? (double)r->global_batch * r->model.seq / row->step.total : 0;
}

static void print_header(const plan_request *r) {
    const plan_model *m = &r->model;
    printf("Planning a GPT of %.4g parameters (Narayanan eq. 2): %d layers, hidden %d, %d heads,"
           " vocabulary %d, sequence %d\n", plan_params(m), m->layers, m->hidden, m->heads,
           m->vocab, m->seq);
    char precision[512];
    printf("on %d GPUs of %.0f GB (%d per node, NVLink inside, %s between), %.0f TFLOP/s"
           " achieved per GPU;\nglobal batch %d sequences, micro-batch %d;\n%s\n\n",
           r->cluster.gpus, r->gpu_bytes / GB,
           r->cluster.gpus_per_node,
           comm_link_spec(r->cluster.between_nodes).title,
           r->cluster.flops_per_gpu / 1e12, r->global_batch, r->micro_batch,
           plan_precision_line(r, precision, sizeof precision));
}

static void print_rows(const plan_request *r, const plan_row *rows, int n) {
    printf("%-6s %4s %4s %5s %5s %3s %4s %-9s %10s %10s %10s %10s %10s %5s %10s %10s\n", "",
           "tp", "pp", "dp", "shard", "cp", "zero", "recompute", "params", "grads", "optimizer", "activ.", "total", "fits",
           "step s", "tokens/s");
    for (int i = 0; i < n; i++) {
        const plan_row *row = &rows[i];
        printf("%-6s %4d %4d %5d %5d %3d %4d ", row->name, row->mesh.tp, row->mesh.pp,
               row->mesh.dp, plan_dp_shard_size(&row->mesh), plan_cp_size(&row->mesh),
               row->mesh.zero_stage);
        if (!row->feasible) {
            printf("(global batch %d does not split into %d x %d sequences)\n", r->global_batch,
                   row->mesh.dp, r->micro_batch);
            continue;
        }
        const plan_bytes *b = &row->memory;
        char sizes[5][32];
        printf("%-9s %10s %10s %10s %10s %10s %5s %10.3g %10.3g\n",
               plan_recompute_names[row->mesh.recompute], report_bytes(b->params, sizes[0]),
               report_bytes(b->grads, sizes[1]), report_bytes(b->optimizer, sizes[2]),
               report_bytes(b->activations, sizes[3]), report_bytes(plan_total(*b), sizes[4]),
               row->fits ? "yes" : "no", row->step.total, tokens_per_second(r, row));
    }
    printf("(memory per GPU on the GPU that holds the most; GB = 1e9 bytes. shard: the dp ranks"
           " ZeRO shards over,\n less than dp for HSDP's groups. Activations: Korthikanti et"
           " al. 2022, with sequence parallelism\n wherever tp > 1 and the lightest"
           " recomputation that fits)\n\n");
}

/* A row's context parallelism: what a rank keeps and sends (plan_cp.h). */
static void print_cp(const plan_request *r, const plan_row *row) {
    if (!row || row->mesh.cp < 2 || !row->feasible) return;
    const plan_mesh *m = &row->mesh;
    const plan_precision bytes = plan_precision_for(r);
    char chunk[32], sent[32], layer[32];
    printf("Context parallelism of the %s row: cp %d, %s attention; a GPU holds %d of every"
           " sequence's %d positions\n", row->name, m->cp, cp_attention_names[m->cp_attention],
           r->model.seq / m->cp, r->model.seq);
    printf("  per layer and micro-batch a GPU sends %.4g chunks of b x s/cp x h/t = %s: %s"
           " (%s)\n", plan_cp_chunks_per_layer(m),
           report_bytes(plan_cp_chunk_bytes(&r->model, m, bytes.activation), chunk),
           report_bytes(plan_cp_bytes_per_layer(&r->model, m, bytes.activation), sent),
           m->cp_attention == CP_RING ? "ring: 6 cp - 4, K/V forward, K/V and dK/dV"
                                             " backward, the 2 cp of dK/dV in fp32"
                                           : "Ulysses: 8 all-to-alls of (cp-1)/cp of a chunk");
    printf("  activations per layer %s (Korthikanti's of the chunk, %s); CP %.3g s a step,"
           " not overlapped\n\n",
           report_bytes(bytes.activation / 2 * plan_layer_activations_cp(&r->model, m), layer),
           m->cp_attention == CP_RING ? "no s x s probabilities: a log-sum-exp and one K/V"
                                             " block in flight"
                                           : "whole-sequence Q, K, V, output and probabilities"
                                             " of a / (t cp) heads",
           row->step.cp_comm);
}

static void print_time(const plan_request *r, const plan_decision *d, double tokens) {
    const plan_step *t = &d->choice.step;
    const plan_mesh *m = &d->choice.mesh;
    const double flops = plan_flops_per_iteration(&r->model, r->global_batch, m->recompute);
    printf("\nTime of one iteration of %s: %.4g FLOPs (Narayanan eq. 3, %s recomputation:"
           " %s)\n", d->strategy, flops, plan_recompute_names[m->recompute],
           m->recompute == RECOMPUTE_FULL ? "4 passes" : m->recompute == RECOMPUTE_SELECTIVE
                                                             ? "3 passes + attention again"
                                                             : "3 passes");
    char cp[32] = "";
    if (m->cp > 1) snprintf(cp, sizeof cp, " + CP %.3g s", t->cp_comm);
    printf("  compute %.3g s + bubble %.3g s ((p-1)/m = %d/%d) + TP %.3g s%s + PP %.3g s +"
           " DP %.3g s = %.3g s, %.4g tokens/s\n", t->compute, t->bubble, m->pp - 1,
           plan_micro_batches(m), t->tp_comm, cp, t->pp_comm, t->dp_comm, t->total,
           tokens_per_second(r, &d->choice));
    if (tokens > 0)
        printf("  %.3g tokens: %.1f days at this step time (%.1f days at the throughput alone,"
               " Narayanan's estimate)\n", tokens,
               tokens / ((double)r->global_batch * r->model.seq) * t->total / 86400,
               plan_training_seconds_at(&r->model, r->global_batch, m->recompute, tokens,
                                        r->cluster.gpus, r->cluster.flops_per_gpu) / 86400);
}

/* With a mesh given, its tp x pp is the model parallelism MP of the ZeRO paper's
 * Table 2 and ZeRO shards over the rest; without one, over every GPU. */
static int model_parallel(const plan_request *r) {
    return r->mesh.tp ? r->mesh.tp * r->mesh.pp : 1;
}

static double max_params_of(const plan_request *r, int stage) {
    const int mp = model_parallel(r);
    return plan_max_params(stage, r->gpu_bytes, r->cluster.gpus / mp, mp,
                           plan_precision_for(r));
}

static void print_max_params(const plan_request *r) {
    printf("\nLargest model that fits %d GPUs of %.4g GB with model parallelism %d, model"
           " states only (the ZeRO paper's Table 2 arithmetic), in %s:\n", r->cluster.gpus,
           r->gpu_bytes / GB, model_parallel(r), precision_name(r->dtype));
    for (int stage = 0; stage <= 3; stage++)
        printf("  %-6s %10.4g parameters\n", max_names[stage], max_params_of(r, stage));
}

void plan_print_max_params(const plan_request *r, int json) {
    if (!json) {
        print_max_params(r);
        return;
    }
    printf("{\"chapter\": \"06-choose\", \"precision\": \"%s\", \"cluster\": {\"gpus\": %d,"
           " \"gpu_bytes\": %.0f}, \"model_parallel\": %d,\n \"max_params\": {",
           precision_name(r->dtype), r->cluster.gpus, r->gpu_bytes, model_parallel(r));
    for (int stage = 0; stage <= 3; stage++)
        printf("%s\"%s\": %.6g", stage ? ", " : "", max_names[stage], max_params_of(r, stage));
    printf("}}\n");
}

void plan_print(const plan_request *r, const plan_row *rows, int n,
                const plan_decision *d, double tokens, int max_params) {
    print_header(r);
    print_rows(r, rows, n);
    print_cp(r, plan_find_row(rows, n, "3d"));   /* the search's, when it split the sequence */
    print_cp(r, plan_find_row(rows, n, "mesh"));
    printf("The decision tree (the course's \"how to choose\"), in %s:\n",
           precision_name(r->dtype));
    for (int i = 0; i < d->num_steps; i++) printf("  %s\n", d->steps[i]);
    if (d->found) {
        const plan_mesh *m = &d->choice.mesh;
        char cp[16] = "", hsdp[48] = "";
        if (m->cp > 1) snprintf(cp, sizeof cp, ", cp %d", m->cp);
        if (plan_dp_replicas(m) > 1)
            snprintf(hsdp, sizeof hsdp, " (shards of %d, %d replicas)", plan_dp_shard_size(m),
                     plan_dp_replicas(m));
        printf("Recommendation: %s: tp %d%s, pp %d, dp %d%s, ZeRO stage %d, recomputation %s,"
               " %d micro-batches of %d\n", d->strategy, m->tp, cp, m->pp, m->dp, hsdp,
               m->zero_stage, plan_recompute_names[m->recompute], plan_micro_batches(m),
               m->micro_batch);
        print_time(r, d, tokens);
    } else {
        printf("Recommendation: none: the model does not fit this cluster\n");
    }
    if (max_params) print_max_params(r);
    failures_print(r);
}

/* ---- --json --------------------------------------------------------------------- */

static void json_row(const plan_row *row, int last) {
    const plan_bytes *b = &row->memory;
    printf("  {\"name\": \"%s\", \"tp\": %d, \"pp\": %d, \"dp\": %d, \"dp_shard\": %d,"
           " \"zero_stage\": %d,"
           " \"recompute\": \"%s\", \"feasible\": %s,\n   \"memory_per_gpu\": {\"params\": %.0f,"
           " \"grads\": %.0f, \"optimizer\": %.0f, \"activations\": %.0f, \"total\": %.0f},\n"
           "   \"fits\": %s, \"step_seconds\": %.6g, \"cp\": %d, \"cp_attention\": \"%s\","
           " \"cp_seconds\": %.6g}%s\n", row->name, row->mesh.tp,
           row->mesh.pp, row->mesh.dp, plan_dp_shard_size(&row->mesh), row->mesh.zero_stage,
           plan_recompute_names[row->mesh.recompute], row->feasible ? "true" : "false",
           b->params, b->grads, b->optimizer, b->activations, plan_total(*b),
           row->fits ? "true" : "false", row->step.total, plan_cp_size(&row->mesh),
           cp_attention_names[row->mesh.cp_attention], row->step.cp_comm, last ? "" : ",");
}

static void json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') putchar('\\');
        putchar(*s);
    }
    putchar('"');
}

void plan_print_json(const plan_request *r, const plan_row *rows, int n,
                     const plan_decision *d, double tokens, int max_params) {
    const plan_model *m = &r->model;
    const plan_mesh *c = &d->choice.mesh;
    printf("{\"chapter\": \"06-choose\", \"precision\": \"%s\", \"params\": %.0f,\n"
           " \"model\": {\"layers\": %d,"
           " \"hidden\": %d, \"heads\": %d, \"vocab\": %d, \"seq\": %d},\n \"cluster\":"
           " {\"gpus\": %d, \"gpus_per_node\": %d, \"gpu_bytes\": %.0f, \"flops_per_gpu\": %.6g,"
           " \"global_batch\": %d, \"micro_batch\": %d},\n \"strategies\": [\n",
           r->fp8 ? "fp8" : precision_name(r->dtype), plan_params(m), m->layers, m->hidden, m->heads, m->vocab, m->seq, r->cluster.gpus,
           r->cluster.gpus_per_node, r->gpu_bytes, r->cluster.flops_per_gpu, r->global_batch,
           r->micro_batch);
    for (int i = 0; i < n; i++) json_row(&rows[i], i == n - 1);
    printf(" ],\n \"recommendation\": {\"name\": ");
    json_string(d->found ? d->strategy : "none");
    printf(", \"tp\": %d, \"pp\": %d, \"dp\": %d, \"dp_shard\": %d, \"zero_stage\": %d,"
           " \"checkpoint_activations\": %s, \"recompute\": \"%s\", \"micro_batches\": %d},\n"
           " \"decision\": [", c->tp, c->pp, c->dp, plan_dp_shard_size(c), c->zero_stage,
           c->recompute == RECOMPUTE_FULL ? "true" : "false", plan_recompute_names[c->recompute],
           d->found ? plan_micro_batches(c) : 0);
    for (int i = 0; i < d->num_steps; i++) {
        printf("%s\n  ", i ? "," : "");
        json_string(d->steps[i]);
    }
    printf("],\n \"flops_per_iteration\": %.6g",
           plan_flops_per_iteration(m, r->global_batch, d->found ? c->recompute : RECOMPUTE_FULL));
    if (tokens > 0 && d->found)
        printf(",\n \"training_days\": %.6g, \"training_days_at_throughput\": %.6g",
               tokens / ((double)r->global_batch * m->seq) * d->choice.step.total / 86400,
               plan_training_seconds_at(m, r->global_batch, c->recompute, tokens,
                                        r->cluster.gpus, r->cluster.flops_per_gpu) / 86400);
    if (max_params) {
        printf(",\n \"max_params\": {");
        for (int stage = 0; stage <= 3; stage++)
            printf("%s\"%s\": %.6g", stage ? ", " : "", max_names[stage], max_params_of(r, stage));
        printf("}");
    }
    failures_print_json(r);
    printf("}\n");
}
