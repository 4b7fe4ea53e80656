/* --simulate: every chosen schedule on the event simulator, as GPU ranks would run it
 * (compute and NCCL streams) and as CPU ranks that block in each send and receive. */
#include "simulate.h"

#include <stdio.h>
#include <string.h>

#include "pp_draw.h"
#include "pp_sim.h"
#include "report.h"

enum { PICTURE_COLUMNS = 100, PICTURE_MAX_COLUMNS = 150, PICTURE_MAX_RANKS = 16,
       SVG_MAX_SPANS = 50000 };

int pipeline_micro_for(const pipeline_sim_config *c, pp_schedule_kind kind) {
    return pp_schedule_micro(kind, c->micro);
}

int pipeline_chunks_for(const pipeline_sim_config *c, pp_schedule_kind kind) {
    return pp_schedule_chunks(kind, c->chunks);
}

typedef struct {
    pp_schedule_kind kind;
    int bidirectional;           /* DualPipe itself (kind: dualpipev's placement) */
    int micro, chunks;
    pp_schedule *lists;
    pp_sim_result gpu, cpu;      /* streams; one operation at a time */
    pp_bubble formula;           /* from the papers' idle per rank, for these op times */
    double formula_idle;         /* pp_sim_idle_formula, in units of stage_ms */
} outcome;

/* Times in units of one stage forward (stage_ms); a message carries one micro-batch of
 * batch / micro sequences. */
static pp_sim_options sim_options(const pipeline_sim_config *c, int micro, int sequential) {
    pp_sim_options o = pp_sim_options_default();
    o.forward = c->time_f / c->stage_ms;
    o.backward_input = c->time_b / c->stage_ms;
    o.backward_weight = c->time_w / c->stage_ms;
    o.backward = o.backward_input + o.backward_weight;
    o.fb_overlap = c->fb_overlap;
    o.link_alpha = c->link_alpha_ms / c->stage_ms;
    o.link_time_per_byte = c->link_ms_per_byte / c->stage_ms;
    o.message_bytes = c->message_bytes * c->micro / micro;
    o.sequential = sequential;
    return o;
}

static const char *outcome_name(const outcome *o) {
    return o->bidirectional ? "dualpipe" : pp_schedule_name(o->kind);
}

static int run_one(const pipeline_sim_config *c, pp_schedule_kind kind, int bidirectional,
                   outcome *out) {
    *out = (outcome){.kind = kind, .bidirectional = bidirectional,
                     .micro = pipeline_micro_for(c, kind), .chunks = pipeline_chunks_for(c, kind)};
    out->lists = bidirectional ? pp_dualpipe_make(c->pp, out->micro, c->order)
                               : pp_schedule_make(kind, c->pp, out->micro, out->chunks, c->order);
    pp_sim_options gpu = sim_options(c, out->micro, 0), cpu = sim_options(c, out->micro, 1);
    /* the papers' idle per rank against the busy time of m forwards and backwards */
    const double busy = out->micro * (gpu.forward + gpu.backward);
    out->formula_idle = bidirectional
        ? pp_sim_dualpipe_idle_formula(c->pp, &gpu)
        : pp_sim_idle_formula(kind, c->pp, out->micro, out->chunks, &gpu);
    out->formula = (pp_bubble){out->formula_idle / (out->formula_idle + busy),
                               out->formula_idle / busy};
    int ok = pp_simulate(out->lists, &gpu, &out->gpu);
    ok = pp_simulate(out->lists, &cpu, &out->cpu) && ok;
    if (!ok)
        fprintf(stderr, "chapter4: %s: %s\n", outcome_name(out),
                out->gpu.ok ? out->cpu.error : out->gpu.error);
    return ok;
}

static void free_outcome(outcome *o) {
    pp_sim_result_free(&o->gpu);
    pp_sim_result_free(&o->cpu);
    pp_schedule_free(o->lists);
}

/* ---- the human view --------------------------------------------------------------------- */
static void print_header(const pipeline_sim_config *c) {
    printf("Chapter 4: pipeline schedules on the event simulator: p = %d stages, m = %d"
           " micro-batches", c->pp, c->micro);
    if (c->runs[PP_INTERLEAVED] || c->skipped[PP_INTERLEAVED])
        printf(", v = %d chunks per rank (interleaved)", c->chunks);
    printf("\n  forward of one micro-batch on a stage %.3g ms, backward %.3g ms (zero bubble: B %.3g"
           " + W %.3g ms); a chunk of v: 1/v of that\n", c->time_f, c->time_b + c->time_w,
           c->time_b, c->time_w);
    if (c->runs[PP_DUALPIPE_V])
        printf("  dualpipev's F&B on GPU ranks: %.0f%% of the shorter pass hidden under the other"
               " (--fb-overlap); CPU ranks run the two one after the other\n",
               100 * c->fb_overlap);
    if (c->link_name)
        printf("  messages over %s: %.4g ms + %.0f B at %.4g GB/s = %.4g ms each (the activation"
               " or gradient of a micro-batch)\n", c->link_name, c->link_alpha_ms, c->message_bytes,
               1e-6 / c->link_ms_per_byte,
               c->link_alpha_ms + c->message_bytes * c->link_ms_per_byte);
    else
        printf("  messages free (give --link to time them); sends wait for their receive, as"
               " NCCL's\n");
    if (c->order == PP_COMM_EAGER)
        printf("  --comm-order eager: every send right after its pass, every receive right"
               " before\n");
    printf("\n");
}

/* Bytes the busiest rank sends per step: its sends in the lists x one micro-batch's
 * activations (or gradients). */
static double max_bytes_sent(const pipeline_sim_config *c, const outcome *o) {
    int most = 0;
    for (int r = 0; r < o->lists->stages; r++) {
        int sends = 0;
        for (int i = 0; i < o->lists->ranks[r].count; i++) {
            pp_op_kind k = o->lists->ranks[r].ops[i].kind;
            sends += k == PP_SEND_ACT || k == PP_SEND_GRAD;
        }
        if (sends > most) most = sends;
    }
    return most * c->message_bytes * c->micro / o->micro;
}

static void print_peaks(const pp_schedule *s) {
    int shown = s->stages < 8 ? s->stages : 8;
    for (int r = 0; r < shown; r++) printf(" %d", pp_peak_in_flight(s, r));
    if (shown < s->stages) printf(" ...");
}

/* dualpipev: the spread of idle over the ranks, and when DeepSeek's formula holds. */
static void print_dualpipev_note(const pipeline_sim_config *c, const outcome *o) {
    double least = o->gpu.idle[0], most = o->gpu.idle[0];
    for (int r = 1; r < c->pp; r++) {
        if (o->gpu.idle[r] < least) least = o->gpu.idle[r];
        if (o->gpu.idle[r] > most) most = o->gpu.idle[r];
    }
    printf("dualpipev: idle per rank %.2f .. %.2f ms against the formula's %.2f ms. DeepSeek's"
           " (PP/2 - 1)(F&B + B - 3W) holds on every rank at F&B = F + B (its F&B hides"
           " communication; --fb-overlap 0, and always on CPU ranks), F = B and W <= F;"
           " overlapped F&B (--fb-overlap) gives rank r 2m - 3p + r + 1 pairs, and so idle"
           " that grows rank by rank\n", least * c->stage_ms, most * c->stage_ms,
           o->formula_idle * c->stage_ms);
}

/* DualPipe beside dualpipev: what it is, or why it did not run. */
static void print_dualpipe_note(const pipeline_sim_config *c) {
    char why[256];
    if (!pp_dualpipe_validate(c->pp, c->micro, c->pp, c->micro, why, sizeof why))
        printf("skipped dualpipe: %s\n", why);
    else
        printf("dualpipe: DualPipe itself, both directions: the model cut into PP = %d stages"
               " and held twice (copy 0's stage r and copy 1's stage %d-r on rank r: 2/%d of"
               " the parameters a rank, 2x), half the micro-batches fed in at each end; its"
               " formula (PP/2 - 1)(F&B + B - 3W) with a stage's times; simulated only\n",
               c->pp, c->pp - 1, c->pp);
}

static void print_table(const pipeline_sim_config *c, const outcome *runs, int n) {
    printf("%-12s %4s %3s  %8s %8s  %10s %8s  %9s  %10s  %9s %9s  %10s  %s\n", "schedule", "m",
           "v", "bubble", "formula", "over ideal", "formula", "CPU ranks", "step", "idle/rank",
           "formula", "sent/rank", "peak in flight per rank");
    for (int i = 0; i < n; i++) {
        const outcome *o = &runs[i];
        printf("%-12s %4d %3d  ", outcome_name(o), o->micro, o->chunks);
        if (!o->gpu.ok) {
            printf("%8s  (deadlock: see above)\n", "-");
            continue;
        }
        char sent[32];
        double idle = 0;
        for (int r = 0; r < c->pp; r++) idle += o->gpu.idle[r] / c->pp;
        printf("%8.4f %8.4f  %10.4f %8.4f  %9.4f  %7.1f ms  %6.2f ms %6.2f ms  %10s ",
               o->gpu.bubble_fraction, o->formula.fraction, o->gpu.bubble_over_ideal,
               o->formula.over_ideal, o->cpu.ok ? o->cpu.bubble_fraction : -1,
               o->gpu.makespan * c->stage_ms, idle * c->stage_ms, o->formula_idle * c->stage_ms,
               report_bytes(max_bytes_sent(c, o), sent));
        print_peaks(o->lists);
        printf("\n");
    }
    for (int i = 0; i < n; i++)
        if (runs[i].kind == PP_DUALPIPE_V && !runs[i].bidirectional && runs[i].gpu.ok)
            print_dualpipev_note(c, &runs[i]);
    if (c->with_dualpipe && c->runs[PP_DUALPIPE_V])
        print_dualpipe_note(c);
    for (int k = 0; k < PP_NSCHEDULES; k++)
        if (c->skipped[k]) printf("skipped %s: %s\n", pp_schedule_name(k), c->skipped[k]);
    printf("\nbubble: idle over all rank-time (GPU ranks: compute and NCCL streams); over ideal:"
           " idle over busy;\nCPU ranks: the same lists, one operation at a time;"
           " idle/rank: the mean, next to the papers' formula (pp_sim.h);\n"
           "sent/rank: activations and gradients the busiest rank sends per step;"
           " peak: micro-batches (x chunks) whose activations a rank holds at once\n");
}

/* Whole columns per shortest pass, so that cells line up: as many as fit in
 * PICTURE_COLUMNS, but 2 or 3 (room for "F7") while that fits in PICTURE_MAX_COLUMNS; a
 * long schedule gets PICTURE_COLUMNS and rounding. Several chunks are drawn in cells of
 * their own width, in bands of PICTURE_COLUMNS. */
static int picture_width(const outcome *o) {
    if (o->chunks > 1) return PICTURE_COLUMNS;
    double quanta = o->gpu.makespan;
    int per_quantum = (int)(PICTURE_COLUMNS / quanta);
    for (int want = 3; want >= 2 && per_quantum < want; want--)
        if (quanta * want <= PICTURE_MAX_COLUMNS) per_quantum = want;
    return per_quantum >= 1 ? (int)(quanta * per_quantum + 0.5) : PICTURE_COLUMNS;
}

static void print_pictures(const pipeline_sim_config *c, const outcome *runs, int n) {
    if (c->pp > PICTURE_MAX_RANKS) {
        printf("\n(pictures drawn for up to %d stages; --svg draws any)\n", PICTURE_MAX_RANKS);
        return;
    }
    for (int i = 0; i < n; i++) {
        const outcome *o = &runs[i];
        if (!o->gpu.ok) continue;
        printf("\n%s, p %d, m %d, v %d: bubble %.4f\n", outcome_name(o), c->pp,
               o->micro, o->chunks, o->gpu.bubble_fraction);
        pp_draw_text(stdout, o->gpu.spans, o->gpu.nspans, c->pp, picture_width(o), c->stage_ms);
    }
}

void pipeline_svg_path(const char *path, const char *name, int several, char *out,
                       size_t size) {
    size_t len = strlen(path);
    int has_ext = len > 4 && strcmp(path + len - 4, ".svg") == 0;
    if (!several) snprintf(out, size, "%s", path);
    else snprintf(out, size, "%.*s-%s.svg", (int)(has_ext ? len - 4 : len), path, name);
}

static int write_svgs(const pipeline_sim_config *c, const outcome *runs, int n) {
    int status = 0;
    for (int i = 0; i < n && c->svg_path; i++) {
        const outcome *o = &runs[i];
        if (!o->gpu.ok) continue;
        char path[1024], title[128];
        pipeline_svg_path(c->svg_path, outcome_name(o), n > 1, path, sizeof path);
        if (o->gpu.nspans > SVG_MAX_SPANS) {
            fprintf(stderr, "chapter4: %s: %d operations are too many to draw (at most %d): try a"
                    " smaller --micro or --pp\n", path, o->gpu.nspans, SVG_MAX_SPANS);
            status = 1;
            continue;
        }
        snprintf(title, sizeof title, "%s: p %d, m %d, v %d; bubble %.4f (formula %.4f)",
                 outcome_name(o), c->pp, o->micro, o->chunks, o->gpu.bubble_fraction,
                 o->formula.fraction);
        if (pp_draw_svg(path, o->gpu.spans, o->gpu.nspans, c->pp, c->stage_ms, title)) status = 1;
        else if (!c->json) printf("wrote %s\n", path);
    }
    return status;
}

/* ---- --json ---------------------------------------------------------------------------- */
static void json_ms_list(const char *key, const double *values, int n, double scale) {
    printf(", \"%s\": [", key);
    for (int r = 0; r < n; r++) printf("%s%.6g", r ? ", " : "", values[r] * scale);
    printf("]");
}

static void json_run(const pipeline_sim_config *c, const outcome *o) {
    printf("\"schedule\": \"%s\", \"pp\": %d, \"micro\": %d, \"virtual\": %d",
           outcome_name(o), c->pp, o->micro, o->chunks);
    if (!o->gpu.ok) {
        printf(", \"error\": \"%s\"", o->gpu.error);   /* the simulator's text has no quotes */
        return;
    }
    printf(", \"bubble_fraction\": %.6g, \"bubble_over_ideal\": %.6g, \"formula\":"
           " {\"bubble_fraction\": %.6g, \"bubble_over_ideal\": %.6g}", o->gpu.bubble_fraction,
           o->gpu.bubble_over_ideal, o->formula.fraction, o->formula.over_ideal);
    if (o->cpu.ok)
        printf(", \"cpu_ranks\": {\"bubble_fraction\": %.6g, \"bubble_over_ideal\": %.6g}",
               o->cpu.bubble_fraction, o->cpu.bubble_over_ideal);
    printf(", \"step_ms\": %.6g, \"bytes_sent_per_rank_per_step\": %.0f",
           o->gpu.makespan * c->stage_ms, max_bytes_sent(c, o));
    json_ms_list("busy_ms_per_rank", o->gpu.busy, c->pp, c->stage_ms);
    json_ms_list("idle_ms_per_rank", o->gpu.idle, c->pp, c->stage_ms);
    printf(", \"formula_idle_ms_per_rank\": %.6g", o->formula_idle * c->stage_ms);
    printf(", \"peak_in_flight_per_rank\": [");
    for (int r = 0; r < c->pp; r++) printf("%s%d", r ? ", " : "", pp_peak_in_flight(o->lists, r));
    printf("]");
}

static void print_json(const pipeline_sim_config *c, const outcome *runs, int n) {
    printf("{\"chapter\": \"04-pipeline\", \"simulate\": true, ");
    if (n == 1) {   /* one schedule: its keys at the top */
        json_run(c, &runs[0]);
        printf("}\n");
        return;
    }
    printf("\"pp\": %d, \"micro\": %d, \"virtual\": %d, \"runs\": [", c->pp, c->micro, c->chunks);
    for (int i = 0; i < n; i++) {
        printf("%s{", i ? ", " : "");
        json_run(c, &runs[i]);
        printf("}");
    }
    printf("], \"skipped\": [");
    for (int k = 0, first = 1; k < PP_NSCHEDULES; k++)
        if (c->skipped[k]) {
            printf("%s{\"schedule\": \"%s\", \"reason\": \"%s\"}", first ? "" : ", ",
                   pp_schedule_name(k), c->skipped[k]);
            first = 0;
        }
    printf("]}\n");
}

int pipeline_simulate(const pipeline_sim_config *c) {
    outcome runs[PP_NSCHEDULES + 1];
    int n = 0, status = 0;
    char why[256];
    for (int k = 0; k < PP_NSCHEDULES; k++)
        if (c->runs[k] && !run_one(c, k, 0, &runs[n++])) status = 1;
    if (c->with_dualpipe && c->runs[PP_DUALPIPE_V] &&
        pp_dualpipe_validate(c->pp, c->micro, c->pp, c->micro, why, sizeof why) &&
        !run_one(c, PP_DUALPIPE_V, 1, &runs[n++]))
        status = 1;
    if (c->json) {
        print_json(c, runs, n);
    } else {
        print_header(c);
        print_table(c, runs, n);
        print_pictures(c, runs, n);
    }
    if (write_svgs(c, runs, n)) status = 1;
    for (int i = 0; i < n; i++) free_outcome(&runs[i]);
    return status;
}
