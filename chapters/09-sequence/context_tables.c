/* Chapter 9's context-parallel part: its tables and JSON (context.h). */
#include <stdio.h>

#include "context.h"
#include "tolerances.h"

static const char *run_label(const cp_options *o) {
    if (o->kind == CP_ULYSSES) return cp_attention_name(o->kind);
    return o->split == CP_BALANCED ? "ring balanced" : "ring contiguous";
}

static double final_loss(const run_result *r) {
    return r->loss && r->steps > 0 ? r->loss[r->steps - 1] : 0.0;
}

static void print_runs(const context_report *r) {
    char grads[32] = "";
    if (r->grad_precision != PRECISION_FP32)
        snprintf(grads, sizeof grads, " with %s gradients", precision_name(r->grad_precision));
    printf("\ncontext parallelism: cp %d x dp %d on %d ranks; each rank holds %d of every"
           " sequence's %d positions (%s%s, CPU)\n", r->cp, r->dp, r->world, r->T / r->cp,
           r->T, precision_name(r->precision), grads);
    printf("%-18s %10s %9s %9s %9s %9s %9s %7s %12s %12s\n", "run", "final loss", "d loss",
           "d grads", "d params", "ms/step", "tok/s", "comm %", "sent/rank/st", "formula");
    printf("%-18s %10.4f %9s %9s %9s %9.1f %9.0f %6.1f%% %12s %12s\n", "one device",
           final_loss(&r->baseline), "-", "-", "-", run_ms_per_step(&r->baseline),
           run_tokens_per_second(&r->baseline), 0.0, "0 B", "0 B");
    for (int i = 0; i < CONTEXT_RUNS; i++) {
        const context_run *c = &r->runs[i];
        if (c->skipped[0]) printf("%-18s skipped: %s\n", run_label(&c->opts), c->skipped);
        if (!c->ran) continue;
        const run_result *x = &c->result;
        char sent[32], formula[32];
        printf("%-18s %10.4f %9.2e %9.2e %9.2e %9.1f %9.0f %6.1f%% %12s %12s\n",
               run_label(&c->opts), final_loss(x), x->diff_loss, x->diff_grads, x->diff_params,
               run_ms_per_step(x), run_tokens_per_second(x), 100.0 * run_comm_fraction(x),
               report_bytes(x->bytes_sent_per_step, sent), report_bytes(x->bytes_formula, formula));
    }
    printf("(sent: every layer's CP traffic and the gradient all-reduce over the cp x dp"
           " ranks)\n");
    printf("(tolerances%s: loss %.0e, step-1 gradients %.0e, parameters %.0e)\n",
           r->precision == PRECISION_FP32 ? "" : " in 16 bits, tolerances_for_tp's with tp 2",
           r->tol.loss, r->tol.grads, r->tol.params);
}

/* "[0, 16)" or "[0, 8) + [56, 64)" */
static const char *positions(int T, int P, int rank, cp_split split, char buf[48]) {
    const position_span s = cp_span_of(T, P, rank, split);
    int used = 0;
    for (int k = 0; k < s.pieces; k++)
        used += snprintf(buf + used, 48 - (size_t)used, "%s[%d, %d)", k ? " + " : "",
                         s.start[k], s.start[k] + s.len[k]);
    return buf;
}

static void print_work(const context_report *r) {
    const context_run *cont = &r->runs[0], *bal = &r->runs[1];
    if (!cont->ran || !bal->ran) return;
    printf("\nattention work per rank under the causal mask (score entries per step, forward"
           " + backward; cp group of ranks 0..%d)\n", r->cp - 1);
    printf("%-6s %-20s %12s   %-22s %12s\n", "rank", "contiguous", "work", "balanced", "work");
    for (int i = 0; i < r->cp; i++) {
        char a[48], b[48];
        printf("%-6d %-20s %12.0f   %-22s %12.0f\n", i,
               positions(r->T, r->cp, i, CP_CONTIGUOUS, a), cont->extra.ranks[i].attention_work,
               positions(r->T, r->cp, i, CP_BALANCED, b), bal->extra.ranks[i].attention_work);
    }
    printf("max/mean: contiguous %.3f (2P/(P+1) = %.3f: the last rank sees every earlier"
           " chunk), balanced %.3f\n", cont->extra.work_imbalance,
           2.0 * r->cp / (r->cp + 1), bal->extra.work_imbalance);
}

static void print_bytes(const context_report *r) {
    char m[32], f[32];
    const double chunk = (double)r->B * (r->T / r->cp) * r->C * sizeof(float);
    printf("\nbytes per rank per layer per step (B %d, T %d, C %d, P %d; a chunk B x T/P x C"
           " fp32 = %s)\n", r->B, r->T, r->C, r->cp, report_bytes(chunk, m));
    printf("%-16s %12s %12s   %s\n", "", "measured", "formula", "what moves");
    for (int i = 0; i < CONTEXT_RUNS; i++) {
        const context_run *c = &r->runs[i];
        if (!c->ran) continue;
        printf("%-16s %12s %12s   %s\n", run_label(&c->opts),
               report_bytes(c->extra.cp_bytes_per_layer, m),
               report_bytes(c->extra.cp_bytes_per_layer_formula, f),
               c->opts.kind == CP_ULYSSES
                   ? "Q K V O forward, dO dQ dK dV backward: 8 x (P-1)/P x chunk"
                   : "K|V forward P-1, K|V and dK|dV backward P-1 and P: (6P-4) chunks");
    }
    const int e = (int)precision_bytes(r->precision);
    printf("%-16s %12s %12s   (t = P) 4 all-gathers + 4 reduce-scatters of B x T x C: 8 (P-1)"
           " chunks%s\n", "megatron-sp", "-", report_bytes(r->sp_bytes_per_layer, f),
           e == 4 ? "" : " of 16-bit activations");
    printf("Ulysses sends P times less than SP%s and its bytes fall as 1/P, but P must divide"
           " the heads;\nthe ring takes any P that divides ctx, sends about 6 B T C elements a"
           " rank whatever P, in P-1 hops one after the other\n", e == 4 ? "" : " at equal width");
}

static void print_long(const context_report *r) {
    if (!r->long_ctx) return;
    char a[32], b[32];
    printf("\nlong sequence: ctx %d, %d layer, one sequence per DP group, one step:"
           " activation bytes per rank (allocator's tag)\n", r->long_ctx, r->long_layers);
    printf("%-16s %14s %12s %10s\n", "", "activations", "/ one device", "d loss");
    printf("%-16s %14s %12.3f %10s\n", "one device",
           report_bytes(r->long_baseline_activations, a), 1.0, "-");
    for (int i = 0; i < CONTEXT_RUNS; i++) {
        if (!r->long_ran[i]) continue;
        printf("%-16s %14s %12.3f %10.2e\n", run_label(&r->runs[i].opts),
               report_bytes(r->long_activations[i], b),
               r->long_activations[i] / r->long_baseline_activations, r->long_diff_loss[i]);
    }
    printf("(1/P = %.3f)\n", 1.0 / r->cp);
}

void context_print(const context_report *r) {
    print_runs(r);
    print_work(r);
    print_bytes(r);
    print_long(r);
    printf("%s\n", context_passed(r)
                       ? "context: every run matches one device within the tolerances, and"
                         " sends the bytes of its formula"
                       : "context: FAILED: a run left the tolerances or its formula (above)");
}

void context_json(FILE *o, const context_report *r) {
    fprintf(o, "\"context\": {\"cp\": %d, \"dp\": %d, \"runs\": [", r->cp, r->dp);
    int first = 1;
    for (int i = 0; i < CONTEXT_RUNS; i++) {
        const context_run *c = &r->runs[i];
        if (!c->ran) continue;
        fprintf(o, "%s\n  {\"attention\": \"%s\", \"split\": \"%s\", \"final_loss\": %.6f,"
                   " \"diff_vs_baseline\": {\"loss\": %.3e, \"grads\": %.3e, \"params\": %.3e},"
                   " \"ms_per_step\": %.3f, \"tokens_per_s\": %.1f,"
                   " \"bytes_sent_per_rank_per_step\": %.0f, \"bytes_formula\": %.0f,"
                   " \"cp_bytes_per_layer\": %.0f, \"cp_bytes_per_layer_formula\": %.0f,"
                   " \"work_imbalance\": %.4f, \"work_per_rank\": [",
                first ? "" : ",", cp_attention_name(c->opts.kind),
                cp_split_name(c->opts.split), final_loss(&c->result), c->result.diff_loss,
                c->result.diff_grads, c->result.diff_params, run_ms_per_step(&c->result),
                run_tokens_per_second(&c->result), c->result.bytes_sent_per_step,
                c->result.bytes_formula, c->extra.cp_bytes_per_layer,
                c->extra.cp_bytes_per_layer_formula, c->extra.work_imbalance);
        for (int k = 0; k < r->cp; k++)
            fprintf(o, "%s%.0f", k ? ", " : "", c->extra.ranks[k].attention_work);
        fprintf(o, "]}");
        first = 0;
    }
    fprintf(o, "], \"skipped\": [");
    first = 1;
    for (int i = 0; i < CONTEXT_RUNS; i++)
        if (r->runs[i].skipped[0]) {
            /* the reasons are cp_check_sizes' lines: no quotes or backslashes */
            fprintf(o, "%s{\"attention\": \"%s\", \"split\": \"%s\", \"reason\": \"%s\"}",
                    first ? "" : ", ", cp_attention_name(r->runs[i].opts.kind),
                    cp_split_name(r->runs[i].opts.split), r->runs[i].skipped);
            first = 0;
        }
    fprintf(o, "], \"passed\": %s,\n \"sp_bytes_per_layer_formula\": %.0f,"
               " \"long\": {\"ctx\": %d,"
               " \"baseline_activations\": %.0f", context_passed(r) ? "true" : "false",
            r->sp_bytes_per_layer, r->long_ctx,
            r->long_baseline_activations);
    for (int i = 0; i < CONTEXT_RUNS; i++)
        if (r->long_ran[i])
            fprintf(o, ", \"%s_activations\": %.0f",
                    cp_attention_name(r->runs[i].opts.kind),
                    r->long_activations[i]);
    fprintf(o, "}}");
}
