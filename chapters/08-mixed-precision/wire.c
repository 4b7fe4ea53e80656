/* Part 5: the wire. Bytes a rank sends per step for DDP, FSDP (ZeRO-3) and TP in fp32,
 * in bf16 with fp32 gradients (the library's default, Megatron's choice for bf16) and in
 * bf16 with bf16 gradients (--grad-dtype bf16), measured next to the library's formulas;
 * and what reducing gradients in bf16 does to DDP's loss. */
#include "mixed.h"

#include <math.h>
#include <stdlib.h>

#include "ddp.h"
#include "tp_train.h"

const precision_case wire_cases[WIRE_CASES] = {
    {"fp32", PRECISION_FP32, PRECISION_FP32, 0},
    {"bf16, fp32 grads", PRECISION_BF16, PRECISION_FP32, 0},
    {"bf16, bf16 grads", PRECISION_BF16, PRECISION_BF16, 0},
};
const char *const wire_strategy_names[WIRE_STRATEGIES] = {"ddp", "fsdp", "tp"};
enum { WIRE_DDP, WIRE_FSDP, WIRE_TP };

static int launch_one(const run_config *rc, const dataset *data, int strategy,
                      strategy_outcome *o) {
    if (strategy == WIRE_DDP) {
        const ddp_options opts = ddp_options_default();
        return ddp_launch(rc, data, &opts, o);
    }
    if (strategy == WIRE_FSDP) {
        const zero_options opts = {.stage = 3};
        return zero_launch(rc, data, &opts, o);
    }
    return tp_launch(rc, data, tp_largest_size(rc), NULL, o);   /* x DDP over the rest */
}

/* DDP's losses of each case, against fp32's */
static void loss_gaps(wire_report *r, float *losses[WIRE_CASES]) {
    for (int c = 0; c < WIRE_CASES; c++) {
        double gap = 0;
        for (int s = 0; s < r->steps && losses[0] && losses[c]; s++)
            gap = fmax(gap, fabs((double)losses[c][s] - losses[0][s]));
        r->loss_gap[c] = gap;
        r->final_loss[c] = losses[c] ? losses[c][r->steps - 1] : 0;
    }
    r->grad_dtype_gap = 0;
    for (int s = 0; s < r->steps && losses[1] && losses[2]; s++)
        r->grad_dtype_gap = fmax(r->grad_dtype_gap, fabs((double)losses[2][s] - losses[1][s]));
}

int wire_launches(const run_config *cfg, const dataset *data, int steps, wire_report *r) {
    r->ranks = cfg->comm.ranks;
    r->steps = steps;
    r->tp = tp_largest_size(cfg);
    float *ddp_losses[WIRE_CASES] = {0};
    int status = 0;
    for (int s = 0; s < WIRE_STRATEGIES && !status; s++)
        for (int c = 0; c < WIRE_CASES && !status; c++) {
            /* TP's row: fp32 gradients (its 16-bit ones: chapters 3-5) */
            if (s == WIRE_TP && wire_cases[c].grads != PRECISION_FP32) continue;
            const run_config rc = mixed_case_config(cfg, &wire_cases[c], steps);
            strategy_outcome o = {0};
            status = launch_one(&rc, data, s, &o);
            r->ran[s][c] = 1;
            r->sent[s][c] = o.result.bytes_sent_per_step;
            r->formula[s][c] = o.result.bytes_formula;
            if (s == WIRE_DDP && o.loss) {
                ddp_losses[c] = malloc((size_t)steps * sizeof(float));
                if (!ddp_losses[c]) abort();
                for (int i = 0; i < steps; i++) ddp_losses[c][i] = o.loss[i];
            }
            strategy_outcome_free(&o);
        }
    loss_gaps(r, ddp_losses);
    for (int c = 0; c < WIRE_CASES; c++) free(ddp_losses[c]);
    return status;
}

void wire_print(const wire_report *r) {
    char b[2][32];
    printf("\n5. The wire: bytes a rank sends per step (largest rank), %d ranks, measured vs"
           " formula\n", r->ranks);
    printf("%-6s", "");
    for (int c = 0; c < WIRE_CASES; c++) printf(" | %-23s", wire_cases[c].label);
    printf("\n");
    for (int s = 0; s < WIRE_STRATEGIES; s++) {
        char label[16];   /* TP names its size: the largest that divides the ranks */
        if (s == WIRE_TP) snprintf(label, sizeof label, "tp%d", r->tp);
        else snprintf(label, sizeof label, "%s", wire_strategy_names[s]);
        printf("%-6s", label);
        for (int c = 0; c < WIRE_CASES; c++) {
            if (!r->ran[s][c]) {
                printf(" | %-23s", "(fp32 grads only)");
                continue;
            }
            char cell[64];
            snprintf(cell, sizeof cell, "%s / %s", report_bytes(r->sent[s][c], b[0]),
                     report_bytes(r->formula[s][c], b[1]));
            printf(" | %-23s", cell);
        }
        printf("\n");
    }
    printf("(measured / formula: DDP 2(N-1)/N x P x gradient bytes; FSDP an all-gather of"
           " 16-bit weights\n twice and a reduce-scatter of gradients; TP 4 all-reduces a"
           " block of activations, 2 B each in bf16)\n");
    printf("Gradient dtype: DDP's loss over %d steps, largest |loss - fp32's| and the last"
           " loss\n", r->steps);
    for (int c = 0; c < WIRE_CASES; c++)
        printf("  %-18s %10.2e %10.4f\n", wire_cases[c].label, r->loss_gap[c],
               r->final_loss[c]);
    printf("bf16 gradients halve DDP's bytes; the reduction then rounds every sum to 8 bits of"
           " mantissa,\nwhich is why Megatron-LM reduces bf16 gradients in fp32 (and PyTorch"
           " FSDP users set\nreduce_dtype to fp32). Here the gradient dtype alone moves the loss"
           " by %.2e nat at most,\nagainst the %.2e that computing in bf16 puts between its run"
           " and fp32's.\n", r->grad_dtype_gap, r->loss_gap[1]);
}

void wire_json(FILE *o, const wire_report *r) {
    fprintf(o, "\"wire\": [");
    int first = 1;
    for (int s = 0; s < WIRE_STRATEGIES; s++)
        for (int c = 0; c < WIRE_CASES; c++) {
            if (!r->ran[s][c]) continue;
            fprintf(o, "%s\n  {\"strategy\": \"%s\", \"precision\": \"%s\", \"grad_dtype\":"
                       " \"%s\", \"sent_per_step\": %.0f, \"formula\": %.0f}",
                    first ? "" : ",", wire_strategy_names[s], precision_name(wire_cases[c].p),
                    precision_name(wire_cases[c].grads), r->sent[s][c], r->formula[s][c]);
            first = 0;
        }
    fprintf(o, "],\n \"grad_dtype_loss\": [");
    for (int c = 0; c < WIRE_CASES; c++)
        fprintf(o, "%s{\"run\": \"%s\", \"max_loss_gap\": %.6e, \"final_loss\": %.6f}",
                c ? ", " : "", wire_cases[c].label, r->loss_gap[c], r->final_loss[c]);
    fprintf(o, "], \"grad_dtype_gap\": %.6e, \"wire_steps\": %d, \"tp_size\": %d",
            r->grad_dtype_gap, r->steps, r->tp);
}
