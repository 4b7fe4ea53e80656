#include "training.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "compare.h"
#include "pp_draw.h"
#include "pp_sim.h"
#include "report.h"
#include "pp_train.h"
#include "tp_train.h"

/* One schedule's JSON keys (pp, micro, virtual, bubbles, activations per stage). */
static char *run_json(const pp_extra *o) {
    size_t cap = 512 + 24 * (size_t)o->stages, n = 0;
    char *s = malloc(cap);
    n += snprintf(s + n, cap - n, "\"pp\": %d, \"micro\": %d, \"virtual\": %d, "
                  "\"bubble_fraction\": %.6f, \"bubble_over_ideal\": %.6f, "
                  "\"bubble_formula\": %.6f, \"bubble_over_ideal_formula\": %.6f, "
                  "\"bubble_cpu_ranks\": %.6f, \"bubble_over_ideal_cpu_ranks\": %.6f, "
                  "\"stage_ms\": %g, \"peak_activations_per_stage\": [", o->stages,
                  o->opts.micro, o->opts.chunks, o->measured.bubble_fraction,
                  o->measured.bubble_over_ideal, o->formula.fraction, o->formula.over_ideal,
                  o->cpu_ranks.fraction, o->cpu_ranks.over_ideal, 1e3 * o->opts.stage_seconds);
    for (int k = 0; k < o->stages; k++)
        n += snprintf(s + n, cap - n, "%s%.0f", k ? ", " : "", o->measured.peak_activations[k]);
    n += snprintf(s + n, cap - n, "], \"in_flight_per_stage\": [");
    for (int k = 0; k < o->stages; k++)
        n += snprintf(s + n, cap - n, "%s%d", k ? ", " : "", o->measured.in_flight[k]);
    snprintf(s + n, cap - n, "]");
    return s;
}

/* The bubble a run should show: the simulator's for ranks that do one operation at a
 * time (as these do) when it differs from the formula (interleaving), else the formula. */
static double expected_bubble(const pp_extra *o) {
    return o->cpu_ranks.fraction >= 0 ? o->cpu_ranks.fraction : o->formula.fraction;
}

static void print_overrun(const strategy_outcome *runs, int n) {
    if (n == 0 || pp_extra_of(&runs[0])->opts.stage_seconds <= 0) {
        printf("  (--stage-ms 0: real compute time; with more ranks than cores, idle time is"
               " partly waiting for a core)\n");
        return;
    }
    double late = 0;
    for (int i = 0; i < n; i++)
        if (pp_extra_of(&runs[i])->measured.overrun_ms > late)
            late = pp_extra_of(&runs[i])->measured.overrun_ms;
    printf("  (compute model --stage-ms %g: a forward of one micro-batch through a stage"
           " lasts that long, a backward twice; passes ended %.2f ms/step later than modelled"
           " at most, computing longer or waking late)\n",
           1e3 * pp_extra_of(&runs[0])->opts.stage_seconds,
           late);
}

static void print_bubbles(const strategy_outcome *runs, int n) {
    printf("\nBubble (idle over all ranks' time, timed steps; formula for forward 1,"
           " backward 2)\n");
    printf("  %-15s %10s %10s %10s %8s   busy / idle ms per step, rank by rank\n", "schedule",
           "measured", "formula", "CPU ranks", "error");
    for (int i = 0; i < n; i++) {
        const pp_extra *o = pp_extra_of(&runs[i]);
        const double e = expected_bubble(o), m = o->measured.bubble_fraction;
        printf("  %-15s %9.1f%% %9.1f%% %9.1f%% %7.0f%%  ", runs[i].result.strategy, 100 * m,
               100 * o->formula.fraction, 100 * e, e > 0 ? 100 * (m - e) / e : 0.0);
        for (int k = 0; k < o->stages; k++)
            printf(" %.0f/%.0f", o->measured.busy_ms[k], o->measured.idle_ms[k]);
        printf("\n");
    }
    printf("  (formula: the textbook's, for ranks that compute while their messages wait, as"
           " a GPU's streams; CPU ranks: the simulator on these lists for ranks that do one"
           " operation at a time, as here, and the error is against it: interleaving loses"
           " what the formula overlaps)\n");
    print_overrun(runs, n);
    if (launch_mpi_world_size() > 0 && pp_extra_of(&runs[0])->opts.stage_seconds > 0)
        printf("  (Open MPI: a message over the shared-memory eager limit moves only while its"
               " sender is inside an MPI call; the compute model lets it move every 0.5 ms while"
               " a rank waits out a pass, but not while the rank really computes, so idle time"
               " above the CPU-ranks column is partly that wait, not the schedule)\n");
}

static void print_memory(const strategy_outcome *runs, int n) {
    const int p = pp_extra_of(&runs[0])->stages;
    char b[32];
    printf("\nActivations per stage (measured peak bytes; micro-batches held at once,"
           " measured / the schedule's most)\n  %-15s", "schedule");
    for (int k = 0; k < p; k++) printf("       stage %-3d", k);
    printf("\n");
    for (int i = 0; i < n; i++) {
        const pp_extra *o = pp_extra_of(&runs[i]);
        printf("  %-15s", runs[i].result.strategy);
        for (int k = 0; k < p; k++)
            printf(" %9s %2d/%-2d", report_bytes(o->measured.peak_activations[k], b),
                   o->measured.in_flight[k], o->in_flight_formula[k]);
        printf("\n");
    }
    printf("  (GPipe holds all m micro-batches before the first backward; 1F1B at most p - r"
           " on stage r; each held micro-batch keeps its blocks' activations)\n");
}

static void print_traffic(const strategy_outcome *runs, int n, const run_config *cfg) {
    const gpt_shape whole = gpt_shape_make(&cfg->model, 1, 0);
    const pp_extra *first = pp_extra_of(&runs[0]);
    const int p = first->stages, ranks = cfg->comm.ranks;
    const int grad = (int)precision_bytes(cfg->grad_precision);   /* --grad-dtype's */
    const double ddp = 2.0 * (ranks - 1) / ranks * (double)gpt_num_params(&whole) * grad;
    char a[32], b[32], c[32];
    printf("\nPoint-to-point traffic per step (bytes each stage sends: activations forward,"
           " gradients backward)\n");
    for (int i = 0; i < n; i++) {
        const pp_extra *o = pp_extra_of(&runs[i]);
        printf("  %-15s", runs[i].result.strategy);
        for (int k = 0; k < p; k++) printf(" %10s", report_bytes(o->measured.bytes_sent[k], a));
        printf("\n");
    }
    const int act = (int)precision_bytes(cfg->precision);   /* activations' bytes */
    printf("  per boundary: 2 x m x b x s x h x %d B = 2 x %d x %d x %d x %d B = %s (%s;"
           " interleaving crosses v times as many boundaries)\n", act,
           cfg->batch / first->replicas, cfg->model.ctx, cfg->model.dim, act,
           report_bytes(first->bytes_formula, b), precision_name(cfg->precision));
    printf("  DDP on the same %d ranks would all-reduce 2(N-1)/N x %zu parameters x %d B = %s"
           " per rank per step: a pipeline sends activations, not the model, which is why it"
           " suits slow links between machines\n", ranks, gpt_num_params(&whole), grad,
           report_bytes(ddp, c));
}

/* The busiest stage's activations in micro-batches' worth (a chunk's pass is 1/v of
 * one) as the papers give them: GPipe m, 1F1B, ZB-H1 and ZB-V p (Qi et al.: ZB-V's
 * p M_B), DualPipeV PP + 1 chunks = p + 1/2; interleaving: its lists' rank 0. */
static double papers_peak(const pp_extra *o) {
    const int p = o->stages, m = o->opts.micro, v = o->opts.chunks;
    switch (o->opts.schedule) {
    case PP_NAIVE: return 1;
    case PP_GPIPE: return m;
    case PP_INTERLEAVED: return (double)o->in_flight_formula[0] / v;
    case PP_DUALPIPE_V: return p + 0.5;
    default: return p < m ? p : m;
    }
}

/* DualPipe itself on the same p ranks and m, simulated only (the executor does not run
 * it): CPU ranks of the compute model (F = B = W), its formula, PP + 1 stage passes
 * held, the model twice (2/p a rank), the busiest rank's messages of one micro-batch's
 * activations (half of a boundary's 2 m messages' bytes each). */
static void print_dualpipe_row(const pp_extra *first) {
    const int p = first->stages, m = first->opts.micro;
    char why[256], b[32];
    if (!pp_dualpipe_validate(p, m, p, m, why, sizeof why)) {
        printf("  %-15s not simulated: %s\n", "dualpipe", why);
        return;
    }
    pp_schedule *s = pp_dualpipe_make(p, m, PP_COMM_ORDERED);
    pp_sim_options o = pp_sim_options_default();
    o.sequential = 1;
    pp_sim_result res;
    if (!pp_simulate(s, &o, &res)) {
        printf("  %-15s %s\n", "dualpipe", res.error);
        pp_sim_result_free(&res);
        pp_schedule_free(s);
        return;
    }
    const double idle = pp_sim_dualpipe_idle_formula(p, &o), busy = m * (o.forward + o.backward);
    int sends = 0, peak = 0;
    for (int r = 0; r < p; r++) {
        int n = 0;
        for (int i = 0; i < s->ranks[r].count; i++)
            n += s->ranks[r].ops[i].kind == PP_SEND_ACT || s->ranks[r].ops[i].kind == PP_SEND_GRAD;
        if (n > sends) sends = n;
        if (pp_peak_in_flight(s, r) > peak) peak = pp_peak_in_flight(s, r);
    }
    printf("  %-15s %9s %8.1f%% %8.1f%% %7.1f / %-5.1f %9s 2/p %12s  (DualPipe, simulated"
           " only)\n", "dualpipe", "-", 100 * res.bubble_fraction, 100 * idle / (idle + busy),
           (double)peak, p + 1.0,
           "", report_bytes(sends * first->bytes_formula / (2.0 * m), b));
    pp_sim_result_free(&res);
    pp_schedule_free(s);
}

/* Item by item what the papers compare: the bubble three ways, the busiest stage's
 * activations, the parameters a device holds, the busiest rank's point-to-point bytes. */
static void print_papers(const strategy_outcome *runs, int n) {
    char b[32];
    printf("\nThe schedules side by side (bubble: measured, simulated for these CPU ranks,"
           " formula; activations: the busiest stage, micro-batches' worth, measured / the"
           " papers')\n  %-15s %9s %9s %9s %15s %12s %12s\n", "schedule", "measured",
           "simulated", "formula", "activations", "parameters", "p2p / step");
    for (int i = 0; i < n; i++) {
        const pp_extra *o = pp_extra_of(&runs[i]);
        double most = 0, sent = 0;
        for (int k = 0; k < o->stages; k++) {
            if (o->measured.in_flight[k] > most) most = o->measured.in_flight[k];
            if (o->measured.bytes_sent[k] > sent) sent = o->measured.bytes_sent[k];
        }
        printf("  %-15s %8.1f%% %8.1f%% %8.1f%% %7.1f / %-5.1f %9s 1/p %12s\n",
               runs[i].result.strategy, 100 * o->measured.bubble_fraction,
               100 * expected_bubble(o), 100 * o->formula.fraction, most / o->opts.chunks,
               papers_peak(o), "", report_bytes(sent, b));
    }
    for (int i = 0; i < n; i++)
        if (pp_extra_of(&runs[i])->opts.schedule == PP_DUALPIPE_V) {
            print_dualpipe_row(pp_extra_of(&runs[i]));
            break;
        }
    printf("  (parameters: every schedule here holds 1/p of the model on a device, once;"
           " DualPipe's two directions hold it twice, 2/p; dualpipev's F&B"
           " runs as two passes on these ranks, F&B = F + B, the formula's own assumption (its"
           " overlap hides communication); with the two computations overlapped"
           " (--simulate --fb-overlap) the idle grows rank by rank and no one formula fits)\n");
}

void pipeline_svg_title(const strategy_outcome *run, char *out, size_t size) {
    const pp_extra *o = pp_extra_of(run);
    snprintf(out, size, "%s: p = %d, m = %d, v = %d, the last step as it ran; bubble %.1f%%"
             " (CPU ranks %.1f%%)", run->result.strategy, o->stages, o->opts.micro,
             o->opts.chunks, 100 * o->measured.bubble_fraction, 100 * expected_bubble(o));
}

static void draw(const strategy_outcome *run, const pipeline_sim_config *c, int several) {
    const pp_extra *o = pp_extra_of(run);
    printf("\n%s, the last step as it ran (ms):\n", run->result.strategy);
    pp_draw_text(stdout, o->spans, o->nspans, o->stages, 96, 1e3);
    if (!c->svg_path) return;
    char path[1024];
    pipeline_svg_path(c->svg_path, pp_schedule_name(o->opts.schedule), several, path,
                      sizeof path);
    char title[160];
    pipeline_svg_title(run, title, sizeof title);
    if (pp_draw_svg(path, o->spans, o->nspans, o->stages, 1e3, title) == 0)
        printf("  (drawn to %s)\n", path);
}

int pipeline_train(const pipeline_sim_config *c, const run_config *cfg) {
    dataset *data = dataset_from_config(cfg);
    const int root = process_hosts_rank0();
    baseline_run *baseline = NULL;
    if (root) {
        report_header(cfg, "Chapter 4: pipeline parallelism against single-device training",
                      cfg->comm.ranks, 1);
        baseline = baseline_reference(cfg, data);
    }
    strategy_outcome runs[PP_NSCHEDULES];
    pp_extra extras[PP_NSCHEDULES];
    int n = 0, status = 0;
    for (int k = 0; k < PP_NSCHEDULES; k++) {
        if (!c->runs[k]) continue;
        pipeline_options opts = {.schedule = k, .micro = pipeline_micro_for(c, k),
                                 .chunks = pipeline_chunks_for(c, k),
                                 .stage_seconds = 1e-3 * c->stage_ms};
        runs[n] = (strategy_outcome){.extra = &extras[n]};
        status = pp_launch(cfg, data, c->pp, &opts, &runs[n]);
        if (root && status == 0 && baseline) strategy_outcome_compare(&runs[n], baseline);
        if (root) runs[n].result.json_extra = run_json(&extras[n]);
        n++;
        if (status != 0) break;   /* a failed run (reported) gets no table and no verdict */
    }
    if (root && n > 0 && status == 0) {
        run_result rows[PP_NSCHEDULES + 1];
        rows[0] = baseline->result;
        for (int i = 0; i < n; i++) rows[i + 1] = runs[i].result;
        if (cfg->json) {
            report_json(cfg, "04-pipeline", cfg->comm.ranks,
                        launch_backend_name(&cfg->comm, cfg->comm.ranks), rows, n + 1, NULL);
        } else {
            for (int k = 0; k < PP_NSCHEDULES; k++)
                if (c->skipped[k])
                    printf("skipped %s: %s\n", pp_schedule_name(k), c->skipped[k]);
            const pp_extra *first = &extras[0];
            if (first->replicas > 1)
                printf("%d pipelines of %d stages, data parallel: each trains on %d of the %d"
                       " sequences, and each stage's gradients are all-reduced over the %d"
                       " pipelines (the tables below are pipeline 0's)\n", first->replicas,
                       first->stages, cfg->batch / first->replicas, cfg->batch,
                       first->replicas);
            report_table(cfg, rows, n + 1);
            print_bubbles(runs, n);
            print_memory(runs, n);
            print_traffic(runs, n, cfg);
            print_papers(runs, n);
            for (int i = 0; i < n; i++) draw(&runs[i], c, n > 1);
        }
        double worst = 0;
        const char *name = "-";
        /* its precision, and 16-bit gradients rounded once on each pipeline */
        const run_tolerances bounds = tolerances_with_grads16(
            tp_run_tolerances(cfg, 1, baseline), cfg, extras[0].replicas,
            baseline_largest_grad(baseline));
        for (int i = 0; i < n; i++) {
            double f = run_worst_fraction_of(&runs[i].result, bounds);
            if (f >= worst) worst = f, name = runs[i].result.strategy;
        }
        if (!cfg->json)
            printf("\n%s: every schedule against the baseline (%s tolerances: gradients of step"
                   " 1 %.0e, loss %.0e, parameters %.0e); worst: %s at %.0f%% of its tolerance\n",
                   worst <= 1 ? "OK" : "FAILED", precision_name(cfg->precision), bounds.grads,
                   bounds.loss, bounds.params, name, 100 * worst);
        if (worst > 1) status = 1;
    }
    for (int i = 0; i < n; i++) {
        free((char *)runs[i].result.json_extra);
        strategy_outcome_free(&runs[i]);
        pp_extra_free(&extras[i]);
    }
    baseline_free(baseline);
    dataset_free(data);
    return status;
}
