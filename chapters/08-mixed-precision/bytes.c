/* Part 1-2: bytes per parameter by tag in fp32, bf16 and fp16, and ZeRO's stages in
 * fp32 and in the paper's mixed precision (K = 12), measured next to the formulas. */
#include "mixed.h"

#include <math.h>
#include <stdio.h>

#include "ddp.h"
#include "zero_rule.h"

const precision_case bytes_cases[BYTES_CASES] = {
    {"fp32", PRECISION_FP32, PRECISION_FP32, 0},
    {"bf16 fp32-grads", PRECISION_BF16, PRECISION_FP32, 0},
    {"bf16", PRECISION_BF16, PRECISION_BF16, 0},
    {"fp16", PRECISION_FP16, PRECISION_FP16, 0},
};
/* the ZeRO table's two precisions: fp32, and bf16 with bf16 gradients (the paper's) */
static const int zero_cases[2] = {0, 2};

void bytes_formula_per_param(const precision_case *c, double out[3]) {
    const int mixed = c->p != PRECISION_FP32;
    out[0] = (double)precision_bytes(c->p);
    out[1] = (double)precision_bytes(c->grads);
    out[2] = mixed ? 12 : 8;   /* masters + m + v, or m + v beside fp32 weights */
}

double bytes_paper_k12(int stage, size_t P, int N) {
    return state_total(zero_paper_bytes(stage, (double)P, N, 12.0));
}

double bytes_grads_peak(const precision_case *c, const gpt_config *model) {
    const gpt_shape s = gpt_shape_make(model, 1, 0);
    const double held = (double)precision_bytes(c->grads) * (double)gpt_num_params(&s);
    if (c->grads == PRECISION_FP32) return held;
    const double slab = fmax((double)gpt_slab_numel(&s, 1),
                             (double)gpt_slab_numel(&s, gpt_final_slab(&s)));
    return held + 4.0 * ((double)gpt_slab_numel(&s, gpt_embed_slab(&s)) + slab);
}

double bytes_fp32_stored(int stage, size_t P, int N) {
    return state_total(zero_stored_bytes(stage, (double)P, N, PRECISION_FP32));
}

/* What the largest rank holds beyond P/N when a slab does not divide by N: one element
 * per slab for each vector the stage shards (optimizer from 1, gradients from 2,
 * compute weights at 3). */
static double padding_bytes(const precision_case *c, int stage, size_t shard_len, size_t P,
                            int N) {
    double f[3];
    bytes_formula_per_param(c, f);
    return zero_sharded_bytes(stage, f[0], f[1], f[2]) * ((double)shard_len - (double)P / N);
}

static int run_stage(const run_config *cfg, const dataset *data, const precision_case *c,
                     int stage, strategy_outcome *o, zero_extra *x) {
    const run_config rc = mixed_case_config(cfg, c, BYTES_STEPS);
    const zero_options opts = {.stage = stage};
    *o = (strategy_outcome){.extra = x};
    return zero_launch(&rc, data, &opts, o);
}

/* DDP's communication buffers (its gradient buckets' wire copies and the backend's
 * staging) and bytes sent: ZeRO-0 reduces the gradient vector in place. */
static int ddp_buffers(const run_config *cfg, const dataset *data, const precision_case *c,
                       bytes_report *r, int i) {
    const run_config rc = mixed_case_config(cfg, c, BYTES_STEPS);
    const ddp_options opts = ddp_options_default();
    strategy_outcome o = {0};
    const int status = ddp_launch(&rc, data, &opts, &o);
    r->comm_buffers[i] = (double)o.result.memory.peak[MEM_COMM];
    r->sent[i] = o.result.bytes_sent_per_step;
    strategy_outcome_free(&o);
    return status;
}

int bytes_launches(const run_config *cfg, const dataset *data, bytes_report *r) {
    const gpt_shape shape = gpt_shape_make(&cfg->model, 1, 0);
    r->num_params = gpt_num_params(&shape);
    r->ranks = cfg->comm.ranks;
    int status = 0;
    for (int i = 0; i < BYTES_CASES && !status; i++) {
        strategy_outcome o;
        zero_extra x = {0};
        status = run_stage(cfg, data, &bytes_cases[i], 0, &o, &x);
        for (int t = 0; t < 3; t++) r->state[i][t] = o.state[t];
        r->grads_peak[i] = (double)o.result.memory.peak[MEM_GRADS];
        r->activations[i] = (double)o.result.memory.peak[MEM_ACTIVATIONS];
        for (int z = 0; z < 2; z++)
            if (zero_cases[z] == i) r->zero_state[z][0] = state_total(
                (state_bytes){o.state[0], o.state[1], o.state[2]});
        strategy_outcome_free(&o);
        if (!status) status = ddp_buffers(cfg, data, &bytes_cases[i], r, i);
    }
    for (int z = 0; z < 2 && !status; z++)
        for (int stage = 1; stage < ZERO_STAGES && !status; stage++) {
            strategy_outcome o;
            zero_extra x = {0};
            const precision_case *c = &bytes_cases[zero_cases[z]];
            status = run_stage(cfg, data, c, stage, &o, &x);
            r->zero_state[z][stage] = o.state[0] + o.state[1] + o.state[2];
            r->zero_padding[z][stage] =
                padding_bytes(c, stage, x.shard_len_largest, r->num_params, r->ranks);
            strategy_outcome_free(&o);
        }
    return status;
}

static void print_per_param(const bytes_report *r) {
    const double P = (double)r->num_params;
    printf("\n1. Bytes per parameter, measured by tag (ZeRO-0 = DDP on %d ranks, a replica each;"
           " P = %zu)\n", r->ranks, r->num_params);
    printf("%-16s %7s %7s %9s %7s | %-13s | %10s %18s %10s %10s\n", "run", "params", "grads",
           "optimizer", "total", "formula", "grads peak", "activations (peak)", "comm bufs",
           "sent");
    for (int i = 0; i < BYTES_CASES; i++) {
        double f[3];
        bytes_formula_per_param(&bytes_cases[i], f);
        char formula[32];
        snprintf(formula, sizeof formula, "%.0f + %.0f + %.0f", f[0], f[1], f[2]);
        const double *s = r->state[i];
        char b[3][32];
        printf("%-16s %7.2f %7.2f %9.2f %7.2f | %-13s | %10.2f %10s %6.3fx %10s %10s\n",
               bytes_cases[i].label, s[0] / P, s[1] / P, s[2] / P, (s[0] + s[1] + s[2]) / P,
               formula, r->grads_peak[i] / P, report_bytes(r->activations[i], b[0]),
               r->activations[i] / r->activations[0], report_bytes(r->comm_buffers[i], b[1]),
               report_bytes(r->sent[i], b[2]));
    }
    printf("(params: the weights forward reads, 16-bit copies in bf16/fp16; optimizer: the fp32"
           " master weights\n (4 B, mixed precision only) and AdamW's m and v (8 B); grads peak:"
           " the most the tag held in a\n step, per parameter: 16-bit gradients add backward's"
           " fp32 working copies of two slabs (the tied\n embedding's and one block's), which"
           " do not grow with depth; activations: peak per rank, x fp32's;\n comm bufs: DDP's peak of the buffers its all-reduces"
           " stage through, 0 where they reduce in\n place; sent: bytes a rank sends a"
           " step)\n");
    printf("Mixed precision does not shrink the model state: 4 + 4 + 8 = 16 bytes in fp32,"
           " 2 + 2 + 12 = 16\nin 16 bits, because the fp32 copy of the weights the optimizer"
           " updates moves from params into\nthe optimizer (with fp32 gradients, as Megatron"
           " keeps them for bf16, 2 + 4 + 12 = 18: more).\nWhat it halves is what scales with"
           " the batch: the activations and the bytes on the wire.\n");
}

static void print_zero(const bytes_report *r) {
    const size_t P = r->num_params;
    const int N = r->ranks;
    printf("\n2. ZeRO in mixed precision: model state per rank (largest), %d ranks\n", N);
    printf("%-6s %12s %12s | %12s %12s %8s %8s | %8s\n", "stage", "fp32", "4+4+8 form.",
           "bf16", "K=12 paper", "diff", "uneven", "saving");
    for (int s = 0; s < ZERO_STAGES; s++) {
        const double paper = bytes_paper_k12(s, P, N);
        printf("zero%-2d %12.0f %12.0f | %12.0f %12.0f %+8.0f %8.0f | %7.2fx\n", s,
               r->zero_state[0][s], bytes_fp32_stored(s, P, N), r->zero_state[1][s], paper,
               r->zero_state[1][s] - paper, r->zero_padding[1][s],
               r->zero_state[1][0] / r->zero_state[1][s]);
    }
    printf("(bf16: 16-bit weights and gradients, fp32 masters + m + v: the paper's Table 1 with"
           " K = 12,\n 2P + 2P + 12P, 2P + 2P + 12P/N, 2P + (2 + 12)P/N, (2 + 2 + 12)P/N, as"
           " chapter 2's --estimate\n prints it; diff: measured minus paper, uneven: what"
           " shards that do not divide by N add)\n");
    printf("Both precisions hold 16 B a parameter at stage 0, but stage 1 shards 12 of them in"
           " mixed precision\nagainst 8 in fp32: at N = %d, stage 1 keeps %.2f B/param in"
           " bf16 and %.2f in fp32, and stage 2\n%.2f against %.2f; at stage 3 both are"
           " 16/N = %.2f.\n", N, r->zero_state[1][1] / (double)P,
           r->zero_state[0][1] / (double)P, r->zero_state[1][2] / (double)P,
           r->zero_state[0][2] / (double)P, 16.0 / N);
}

void bytes_print(const bytes_report *r) {
    print_per_param(r);
    print_zero(r);
}

void bytes_json(FILE *o, const bytes_report *r) {
    fprintf(o, "\"num_params\": %zu, \"bytes_per_param\": [", r->num_params);
    for (int i = 0; i < BYTES_CASES; i++) {
        double f[3];
        bytes_formula_per_param(&bytes_cases[i], f);
        fprintf(o, "%s\n  {\"run\": \"%s\", \"precision\": \"%s\", \"grad_dtype\": \"%s\","
                   " \"params\": %.0f, \"grads\": %.0f, \"optimizer\": %.0f,"
                   " \"formula_per_param\": [%.0f, %.0f, %.0f], \"grads_peak\": %.0f,"
                   " \"activations_peak\": %.0f,"
                   " \"comm_peak\": %.0f, \"sent_per_step\": %.0f}",
                i ? "," : "", bytes_cases[i].label, precision_name(bytes_cases[i].p),
                precision_name(bytes_cases[i].grads), r->state[i][0], r->state[i][1],
                r->state[i][2], f[0], f[1], f[2], r->grads_peak[i], r->activations[i],
                r->comm_buffers[i],
                r->sent[i]);
    }
    fprintf(o, "],\n \"zero_mixed\": [");
    for (int s = 0; s < ZERO_STAGES; s++)
        fprintf(o, "%s\n  {\"stage\": %d, \"fp32_bytes\": %.0f, \"fp32_formula\": %.0f,"
                   " \"bf16_bytes\": %.0f, \"paper_k12\": %.0f, \"uneven_bytes\": %.0f}",
                s ? "," : "", s, r->zero_state[0][s],
                bytes_fp32_stored(s, r->num_params, r->ranks), r->zero_state[1][s],
                bytes_paper_k12(s, r->num_params, r->ranks), r->zero_padding[1][s]);
    fprintf(o, "]");
}
