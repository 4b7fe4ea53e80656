#include "tables.h"

#include <stdio.h>
#include <stdlib.h>

#include "zero_rule.h"

static const char *const stage_labels[ZERO_STAGES] = {"zero0 (DDP)", "zero1", "zero2",
                                                      "zero3 (FSDP)"};
static const char *const stored_formulas[ZERO_STAGES] = {
    "4P + 4P + 8P", "4P + 4P + 8P/N", "4P + (4+8)P/N", "(4+4+8)P/N"};
/* mixed precision: 16-bit compute weights, fp32 gradients, masters + m + v */
static const char *const stored_mixed_formulas[ZERO_STAGES] = {
    "2P + 4P + 12P", "2P + 4P + 12P/N", "2P + (4+12)P/N", "(2+4+12)P/N"};
/* 16-bit gradients (--grad-dtype): the paper's own storage */
static const char *const stored_grads16_formulas[ZERO_STAGES] = {
    "2P + 2P + 12P", "2P + 2P + 12P/N", "2P + (2+12)P/N", "(2+2+12)P/N"};
static const char *const paper_formulas[ZERO_STAGES] = {
    "2P + 2P + KP", "2P + 2P + KP/N", "2P + (2+K)P/N", "(2+2+K)P/N"};

static double state_sum(const strategy_outcome *o) {
    return o->state[0] + o->state[1] + o->state[2];
}

double stage_stored_formula(int stage, size_t num_params, int N, precision p) {
    return stage_stored_formula_grads(stage, num_params, N, p, PRECISION_FP32);
}

double stage_stored_formula_grads(int stage, size_t num_params, int N, precision p,
                                  precision gp) {
    return state_total(zero_stored_bytes_grads(stage, (double)num_params, N, p, gp));
}

/* Bytes per element of the vectors a stage shards: from stage 1 the optimizer state
 * (m, v, and in mixed precision the fp32 masters), from 2 the gradients, at 3 the
 * parameters (the compute weights). */
static double sharded_bytes_per_element(int stage, precision p, precision gp) {
    const double optimizer = p == PRECISION_FP32 ? 8 : 12;
    return zero_sharded_bytes(stage, (double)precision_bytes(p), (double)precision_bytes(gp),
                              optimizer);
}

double stage_padding_bytes(const strategy_outcome *o, size_t num_params) {
    const double even = (double)num_params / o->world_size;
    const zero_extra *x = zero_extra_of(o);
    return sharded_bytes_per_element(x->opts.stage, x->opts.precision, x->opts.grad_precision) *
           ((double)x->shard_len_largest - even);
}

/* The stage-0 run to compare savings with, if it ran. */
static const strategy_outcome *stage0_of(const strategy_outcome *runs, int n) {
    for (int i = 0; i < n; i++)
        if (zero_extra_of(&runs[i])->opts.stage == 0) return &runs[i];
    return NULL;
}

void print_memory_table(const run_config *cfg, const strategy_outcome *runs, int n) {
    if (cfg->json || n == 0) return;
    gpt_shape shape = gpt_shape_make(&cfg->model, 1, 0);
    const size_t P = gpt_num_params(&shape);
    const int N = runs[0].world_size;
    const strategy_outcome *base = stage0_of(runs, n);
    char b[8][32];
    printf("\nMemory per rank: bytes measured by the accounting allocator (largest rank)%s\n",
           zero_extra_of(&runs[0])->opts.checkpoint_activations
               ? ", activation checkpointing on" : "");
    printf("%-13s %10s %10s %10s %12s %10s | %12s %8s\n", "stage", "params", "grads",
           "optimizer", "activations", "peak", "model state", "saving");
    printf("%-13s %10s %10s %10s %12s %10s | %12s %8s\n", "", "(peak)", "(peak)", "(peak)",
           "(peak)", "(total)", "(held)", "vs zero0");
    for (int i = 0; i < n; i++) {
        const strategy_outcome *o = &runs[i];
        const mem_stats *m = &o->result.memory;
        printf("%-13s %10s %10s %10s %12s %10s | %12s",
               stage_labels[zero_extra_of(o)->opts.stage],
               report_bytes((double)m->peak[MEM_PARAMS], b[0]),
               report_bytes((double)m->peak[MEM_GRADS], b[1]),
               report_bytes((double)m->peak[MEM_OPTIMIZER], b[2]),
               report_bytes((double)m->peak[MEM_ACTIVATIONS], b[3]),
               report_bytes((double)m->peak_total, b[4]), report_bytes(state_sum(o), b[5]));
        if (base) printf(" %7.2fx\n", state_sum(base) / state_sum(o));
        else printf(" %8s\n", "-");
    }
    printf("(peak: the most held at once during a timed step, temporaries included: whole-slab"
           "\n gradients in stages 2-3, gathered slabs in stage 3; held: between steps)\n");

    printf("\nModel state held between steps vs the formulas: P = %zu parameters, N = %d\n", P,
           N);
    const int fp32 = cfg->precision == PRECISION_FP32;
    char stored_title[32];
    const int grads16 = cfg->grad_precision != PRECISION_FP32;
    snprintf(stored_title, sizeof stored_title, "as stored %s",
             fp32 ? "fp32" : grads16 ? "16-bit grads" : "mixed");
    printf("%-13s %11s | %-15s %11s %9s %9s | %-15s %11s\n", "stage", "measured",
           stored_title, "= bytes", "diff", "uneven", "ZeRO paper K=12", "= bytes");
    for (int i = 0; i < n; i++) {
        const strategy_outcome *o = &runs[i];
        const int stage = zero_extra_of(o)->opts.stage;
        const double stored =
            stage_stored_formula_grads(stage, P, N, cfg->precision, cfg->grad_precision);
        const double paper = state_total(zero_paper_bytes(stage, (double)P, N, 12.0));
        printf("%-13s %11.0f | %-15s %11.0f %+9.0f %9.0f | %-15s %11.0f\n", stage_labels[stage],
               state_sum(o),
               (fp32 ? stored_formulas : grads16 ? stored_grads16_formulas
                                                 : stored_mixed_formulas)[stage], stored,
               state_sum(o) - stored, stage_padding_bytes(o, P), paper_formulas[stage], paper);
    }
    if (fp32)
        printf("(as stored: fp32 parameters, gradients, Adam m and v, which this program keeps;"
               " diff: measured minus\n formula; uneven: what the largest rank holds beyond P/N"
               " when a slab does not divide by N, one\n element per slab and sharded vector;"
               " the paper's fp16 + K = 12 totals 16 bytes/param too, split 2+2+12)\n");
    else if (grads16)
        printf("(as stored: %s compute weights and gradients (--grad-dtype), fp32 master"
               " weights + Adam m and v\n (K = 12) as optimizer state: the paper's own table;"
               " grads (peak) adds backward's fp32\n working copies, the tied embedding's slab"
               " and one other (AdamW widens a chunk at a time);\n uneven: what the largest"
               " rank holds beyond P/N, one element per slab and sharded vector)\n",
               precision_name(cfg->precision));
    else
        printf("(as stored: %s compute weights, fp32 gradients, and fp32 master weights + Adam"
               " m and v (K = 12)\n as optimizer state; the paper's 16-bit gradients would"
               " save 2 bytes/param more; diff: measured\n minus formula; uneven: what the"
               " largest rank holds beyond P/N, one element per slab and sharded vector)\n",
               precision_name(cfg->precision));
}

static const char *kind_label(int kind) {
    switch (kind) {
    case COMM_KIND_ALLREDUCE: return "all-reduce";
    case COMM_KIND_REDUCE_SCATTER: return "reduce-scatter";
    case COMM_KIND_ALLGATHER: return "all-gather";
    default: return comm_kind_name((comm_kind)kind);
    }
}

void print_comm_table(const run_config *cfg, const char *backend, int bytes_modelled,
                      const strategy_outcome *runs, int n) {
    if (cfg->json || n == 0) return;
    gpt_shape shape = gpt_shape_make(&cfg->model, 1, 0);
    const double P = (double)gpt_num_params(&shape);
    const int N = runs[0].world_size;
    char b[4][32];
    printf("\nCommunication per rank per step (largest rank; bytes %s by the %s backend;"
           " theory: a ring\nsends (N-1)/N of the elements, 4 bytes each; an all-reduce"
           " counts 2 elements per element)\n",
           bytes_modelled ? "modelled" : "measured", backend);
    printf("%-13s %-15s %6s %12s %12s %11s %10s\n", "stage", "collective", "calls", "sent",
           "theory", "elements", "blocked");
    double stage0_elements = 0;
    for (int i = 0; i < n; i++) {
        const strategy_outcome *o = &runs[i];
        const zero_options *zo = &zero_extra_of(o)->opts;
        comm_plan plan = zero_comm_plan_grads(&shape, zo->stage, zo->precision,
                                              zo->grad_precision);
        double calls = 0, sent = 0, theory = 0, elements = 0, blocked = 0;
        const char *label = stage_labels[zero_extra_of(o)->opts.stage];
        for (int k = 0; k < COMM_NKINDS; k++) {
            if (o->comm_calls[k] == 0 && plan.calls[k] == 0) continue;
            printf("%-13s %-15s %6.0f %12s %12s %9.2f P %8.2f ms\n", label, kind_label(k),
                   o->comm_calls[k], report_bytes(o->comm_bytes[k], b[0]),
                   report_bytes(plan_ring_bytes(&plan, k, N), b[1]), plan.elements[k] / P,
                   1e3 * o->comm_seconds[k]);
            label = "";
            calls += o->comm_calls[k];
            sent += o->comm_bytes[k];
            theory += plan_ring_bytes(&plan, k, N);
            elements += plan.elements[k];
            blocked += o->comm_seconds[k];
        }
        if (zero_extra_of(o)->opts.stage == 0) stage0_elements = elements;
        printf("%-13s %-15s %6.0f %12s %12s %9.2f P %8.2f ms", label, "total", calls,
               report_bytes(sent, b[2]), report_bytes(theory, b[3]), elements / P,
               1e3 * blocked);
        if (stage0_elements > 0) printf("   %.2fx zero0", elements / stage0_elements);
        printf("\n");
        if (zero_extra_of(o)->opts.stage == 3 && o->async_seconds > 0)
            printf("%-13s prefetch: %.2f ms of all-gather in flight per step, %.2f ms of it"
                   " hidden behind compute\n", "", 1e3 * o->async_seconds,
                   1e3 * o->hidden_seconds);
    }
}

/* ZeRO++'s keys of a stage-3 run with --zeropp (docs/json.md). */
static void json_zeropp(FILE *f, const run_config *cfg, const gpt_shape *shape,
                        const strategy_outcome *o) {
    const int pieces = zero_extra_of(o)->opts.zeropp;
    if (!pieces) return;
    const int N = o->world_size, K = cfg->comm.ranks_per_node > 0 ? cfg->comm.ranks_per_node : N;
    char name[32];
    double formula[2];
    zeropp_tier_bytes(shape, pieces, 0, N, K, formula);
    const double *m = o->result.tier_bytes_per_step;
    fprintf(f, ",\n   \"zeropp\": {\"pieces\": \"%s\", \"tier_bytes_per_step\": {\"intra\": %.0f,"
               " \"inter\": %.0f}, \"formula_tier_bytes\": {\"intra\": %.0f, \"inter\": %.0f},"
               " \"hpz_extra_bytes\": %.0f}", zeropp_name(pieces, name, sizeof name), m[0], m[1],
            formula[0], formula[1], pieces & ZEROPP_HPZ ? zeropp_hpz_extra_bytes(shape, K) : 0);
}

char *tables_json(const run_config *cfg, const strategy_outcome *runs, int n) {
    gpt_shape shape = gpt_shape_make(&cfg->model, 1, 0);
    const size_t P = gpt_num_params(&shape);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) abort();
    const int N = n > 0 ? runs[0].world_size : 1;
    fprintf(f, "\"num_params\": %zu, \"prefetch\": %s, \"checkpoint_activations\": %s,\n"
               " \"zero\": [", P, n > 0 && zero_extra_of(&runs[n - 1])->opts.prefetch ? "true" : "false",
            n > 0 && zero_extra_of(&runs[0])->opts.checkpoint_activations ? "true" : "false");
    for (int i = 0; i < n; i++) {
        const strategy_outcome *o = &runs[i];
        const int stage = zero_extra_of(o)->opts.stage;
        comm_plan plan =
            zero_comm_plan_grads(&shape, stage, cfg->precision, cfg->grad_precision);
        fprintf(f, "%s\n  {\"strategy\": \"%s\", \"stage\": %d,"
                   " \"model_state_bytes\": {\"params\": %.0f, \"grads\": %.0f,"
                   " \"optimizer\": %.0f},\n   \"formula_stored_bytes\": %.0f,"
                   " \"uneven_shard_bytes\": %.0f, \"formula_paper_k12_bytes\": %.0f,\n"
                   "   \"comm_per_step\": {",
                i ? "," : "", zero_strategy_name(stage), stage, o->state[0], o->state[1],
                o->state[2],
                stage_stored_formula_grads(stage, P, N, cfg->precision, cfg->grad_precision),
                stage_padding_bytes(o, P),
                state_total(zero_paper_bytes(stage, (double)P, N, 12.0)));
        int first = 1;
        for (int k = 0; k < COMM_NKINDS; k++) {
            if (o->comm_calls[k] == 0 && plan.calls[k] == 0) continue;
            fprintf(f, "%s\"%s\": {\"calls\": %.0f, \"bytes\": %.0f, \"theory_bytes\": %.0f,"
                       " \"elements_over_P\": %.6g}", first ? "" : ", ", comm_kind_name(k),
                    o->comm_calls[k], o->comm_bytes[k], plan_ring_bytes(&plan, k, N),
                    plan.elements[k] / (double)P);
            first = 0;
        }
        fprintf(f, "},\n   \"async_s_per_step\": %.9g, \"hidden_s_per_step\": %.9g",
                o->async_seconds, o->hidden_seconds);
        json_zeropp(f, cfg, &shape, o);
        fprintf(f, "}");
    }
    fprintf(f, "]");
    fclose(f);
    return text;
}
