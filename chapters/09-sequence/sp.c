/* Part sp: the whole model trained with TP and with TP + SP on the same ranks, each
 * against the single-device baseline; bytes per rank by collective next to the
 * formulas, activation peaks, tokens/s and time in communication. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "sequence.h"
#include "tolerances.h"

int sp_largest_tp(const run_config *cfg) {
    char err[512];
    for (int t = cfg->comm.ranks; t > 1; t--)
        if (tp_check_sizes(cfg, cfg->comm.ranks, t, err, sizeof err) &&
            tp_sequence_check(cfg, t, err, sizeof err))
            return t;
    return 1;
}

/* A copy of a row's loss curve that outlives its run (the row points at it). */
static void keep_losses(sp_report *r, int slot, run_result *row) {
    r->losses[slot] = malloc((size_t)row->steps * sizeof(float));
    if (!r->losses[slot]) abort();
    memcpy(r->losses[slot], row->loss, (size_t)row->steps * sizeof(float));
    row->loss = r->losses[slot];
}

void sp_free(sp_report *r) {
    for (int i = 0; i <= SP_RUNS; i++) free(r->losses[i]);
}

/* One of the two runs; world rank 0's process compares it with baseline b. */
static int sp_run(const run_config *cfg, const dataset *data, int which, const baseline_run *b,
                  sp_report *r) {
    run_config quiet = *cfg;
    quiet.quiet = 1;
    if (which == SP_RUN_TP) quiet.comm.trace_path = NULL;   /* --trace: the TP + SP run */
    const tp_options opts = {.sequence_parallel = which == SP_RUN_SP,
                             .recompute_attention = r->recompute == RECOMPUTE_SELECTIVE,
                             .checkpoint_activations = r->recompute == RECOMPUTE_FULL};
    strategy_outcome out = {.extra = &r->extra[which]};
    const int status = tp_launch(&quiet, data, r->tp, &opts, &out);
    if (!status && b) {
        compare_to_baseline(&out.result, b, out.loss, out.first_grads, out.final_params);
        r->worst[which] = run_worst_fraction_of_tolerance(&out.result, r->tolerances.grads,
                                                          r->tolerances.loss,
                                                          r->tolerances.params);
        r->run[which] = out.result;
        keep_losses(r, which + 1, &r->run[which]);
    }
    strategy_outcome_free(&out);
    return status;
}

int sp_launches(const run_config *cfg, const dataset *data, int tp, plan_recompute recompute,
                sp_report *r) {
    *r = (sp_report){.tp = tp, .dp = cfg->comm.ranks / tp, .recompute = recompute,
                     .precision = cfg->precision};
    baseline_run *b = NULL;
    if (process_hosts_rank0()) {
        run_config quiet = *cfg;
        quiet.quiet = 1;
        quiet.comm.trace_path = NULL;
        b = baseline_reference(&quiet, data);
        b->result.strategy = "baseline";
        r->baseline = b->result;
        keep_losses(r, 0, &r->baseline);
        /* 16-bit gradients (--grad-dtype): each of the dp groups' sums rounded too */
        r->tolerances = tolerances_with_grads16(tp_run_tolerances(cfg, tp, b), cfg, r->dp,
                                                baseline_largest_grad(b));
    }
    int status = 0;
    for (int which = 0; which < SP_RUNS && !status; which++)
        status = sp_run(cfg, data, which, b, r);
    const int B = cfg->batch / r->dp;
    const precision p = cfg->precision;
    r->bytes_added = tp_sequence_bytes_added(&cfg->model, p, B, cfg->model.ctx, tp);
    r->bytes_gathered_again = tp_sequence_bytes_gathered_again(&cfg->model, p, B,
                                                               cfg->model.ctx, tp);
    r->bytes_layernorm_grads = tp_sequence_bytes_layernorm_grads(&cfg->model, tp);
    for (int which = 0; which < SP_RUNS; which++)
        r->activations_per_layer[which] = activation_bytes_per_layer(
            &cfg->model, B, cfg->precision,
            (activation_setup){.tp = tp, .sp = which == SP_RUN_SP, .recompute = recompute});
    baseline_free(b);
    return status;
}

/* Both runs within TP's tolerances of the baseline and on their formulas' bytes. */
int sp_passed(const sp_report *r) {
    for (int i = 0; i < SP_RUNS; i++)
        if (!(r->worst[i] <= 1) || r->run[i].bytes_sent_per_step != r->run[i].bytes_formula)
            return 0;
    return sp_allreduce_identity_error(r) == 0;
}

static void print_bytes_row(const char *name, const tp_extra *x, const run_result *run) {
    char a[32], b[32], c[32], d[32], e[32];
    printf("  %-8s %12s %15s %12s %12s %12s\n", name, report_bytes(x->tp_allreduce_bytes, a),
           report_bytes(x->tp_reduce_scatter_bytes, b), report_bytes(x->tp_allgather_bytes, c),
           report_bytes(run->bytes_sent_per_step, d), report_bytes(run->bytes_formula, e));
}

/* TP's all-reduces of activations moved the same bytes as SP's reduce-scatters and
 * all-gathers less the gathers SP does again: a ring all-reduce IS a reduce-scatter and
 * an all-gather. Both sides measured but for the formula's gathers and LayerNorms. */
double sp_allreduce_identity_error(const sp_report *r) {
    const tp_extra *tp = &r->extra[SP_RUN_TP], *sp = &r->extra[SP_RUN_SP];
    /* all-reduces both runs do: the loss's numbers (SP's less its LayerNorm gradients) */
    const double loss_numbers = sp->tp_allreduce_bytes - r->bytes_layernorm_grads;
    const double tp_activations = tp->tp_allreduce_bytes - loss_numbers;
    const double sp_activations = sp->tp_reduce_scatter_bytes + sp->tp_allgather_bytes -
                                  r->bytes_gathered_again;
    return sp_activations - tp_activations;
}

static void print_why(const sp_report *r) {
    const tp_extra *tp = &r->extra[SP_RUN_TP], *sp = &r->extra[SP_RUN_SP];
    const double loss_numbers = sp->tp_allreduce_bytes - r->bytes_layernorm_grads;
    char a[32], b[32], c[32], d[32];
    printf("  why: a ring all-reduce is a reduce-scatter then an all-gather, (t-1)/t of the"
           " bytes each:\n  TP's all-reduces of activations %s = SP's reduce-scatters +"
           " all-gathers %s\n  less what SP alone gathers, %s: the layer inputs again in"
           " backward (2 per block: it keeps them split) -> %s\n",
           report_bytes(tp->tp_allreduce_bytes - loss_numbers, a),
           report_bytes(sp->tp_reduce_scatter_bytes + sp->tp_allgather_bytes, b),
           report_bytes(r->bytes_gathered_again, c),
           sp_allreduce_identity_error(r) == 0 ? "equal to the byte" : "DIFFERENT");
    printf("  SP's all-reduces: the LayerNorm weight gradients %s (each rank saw 1/t of the"
           " tokens) and the vocab-parallel loss's numbers, as TP's\n",
           report_bytes(r->bytes_layernorm_grads, d));
}

void sp_print(const run_config *cfg, const sp_report *r) {
    printf("\nPart sp. Megatron sequence parallelism: TP = %d%s, LayerNorms and residual"
           " stream split along the sequence (%d of %d positions per rank)\n", r->tp,
           r->dp > 1 ? " x DP" : "", cfg->model.ctx / r->tp, cfg->model.ctx);
    if (r->recompute != RECOMPUTE_NONE)
        printf("  both runs with %s recomputation\n", plan_recompute_names[r->recompute]);
    const run_result rows[3] = {r->baseline, r->run[SP_RUN_TP], r->run[SP_RUN_SP]};
    report_table(cfg, rows, 3);
    printf("\nbytes sent per rank per step on the TP group, by collective (measured)\n");
    printf("  %-8s %12s %15s %12s %12s %12s\n", "", "all-reduce", "reduce-scatter",
           "all-gather", "total", "formula");
    print_bytes_row("tp", &r->extra[SP_RUN_TP], &r->run[SP_RUN_TP]);
    print_bytes_row("tp+sp", &r->extra[SP_RUN_SP], &r->run[SP_RUN_SP]);
    print_why(r);
    char a[32], b[32], c[32], d[32];
    printf("\nactivations per rank: peak %s (tp) and %s (tp+sp) measured; per layer %s and %s"
           " by the re-derived Table 2\n",
           report_bytes((double)r->run[SP_RUN_TP].memory.peak[MEM_ACTIVATIONS], a),
           report_bytes((double)r->run[SP_RUN_SP].memory.peak[MEM_ACTIVATIONS], b),
           report_bytes(r->activations_per_layer[SP_RUN_TP], c),
           report_bytes(r->activations_per_layer[SP_RUN_SP], d));
    printf("tolerances vs baseline (TP's): grads %.0e, loss %.0e, params %.0e;"
           " worst fraction: tp %.2f, tp+sp %.2f -> %s\n", r->tolerances.grads,
           r->tolerances.loss, r->tolerances.params, r->worst[SP_RUN_TP], r->worst[SP_RUN_SP],
           sp_passed(r) ? "equal to the baseline, bytes equal to the formulas" : "FAILED");
}

void sp_json(FILE *o, const sp_report *r) {
    fprintf(o, "\"sp\": {\"tp\": %d, \"dp\": %d, \"recompute\": \"%s\", \"runs\": [", r->tp,
            r->dp, plan_recompute_names[r->recompute]);
    for (int i = 0; i < SP_RUNS; i++) {
        const run_result *run = &r->run[i];
        const tp_extra *x = &r->extra[i];
        fprintf(o, "%s\n  {\"strategy\": \"%s\", \"diff_vs_baseline\": {\"loss\": %.3e,"
                " \"grads\": %.3e, \"params\": %.3e}, \"worst_fraction_of_tolerance\": %.3f,"
                " \"tokens_per_s\": %.0f, \"comm_fraction\": %.4f,"
                " \"bytes_sent_per_rank_per_step\": %.0f, \"bytes_formula\": %.0f,"
                " \"allreduce_bytes\": %.0f, \"reduce_scatter_bytes\": %.0f,"
                " \"allgather_bytes\": %.0f, \"activations_peak\": %zu,"
                " \"activations_per_layer_formula\": %.0f}", i ? "," : "", run->strategy,
                run->diff_loss, run->diff_grads, run->diff_params, r->worst[i],
                run_tokens_per_second(run), run_comm_fraction(run), run->bytes_sent_per_step,
                run->bytes_formula, x->tp_allreduce_bytes, x->tp_reduce_scatter_bytes,
                x->tp_allgather_bytes, run->memory.peak[MEM_ACTIVATIONS],
                r->activations_per_layer[i]);
    }
    fprintf(o, "],\n \"sp_bytes_added_formula\": %.0f, \"passed\": %s}", r->bytes_added,
            sp_passed(r) ? "true" : "false");
}
