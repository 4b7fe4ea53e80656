/* Chapter 7: the wire as the bottleneck, and what each optimisation buys.
 *   1. the links: bandwidth, latency, ratios, one gradient all-reduce on each
 *   2. ring, naive and recursive doubling for 1 KiB .. 64 MiB on 2, 4, 8 ranks
 *   3. DDP's efficiency ladder on slow Ethernet: overlap, accumulation, compression
 *   4. DDP, FSDP and TP on every link
 * Every measurement sits next to its alpha-beta prediction (plan_time.c).
 *
 *   make chapter7 && ./run 4 [--part links|algorithms|ladder|strategies]
 *                            [--max-mib 64] [--sweep-ranks 8] [--ladder-scale S]
 *                            [--start-efficiency 0.3] [--repeat 2] [--svg plot.svg]
 *                            [--json] */
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "communication.h"
#include "ddp.h"
#include "report.h"

static const char *const part_names[] = {"all", "links", "algorithms", "ladder",
                                         "strategies", NULL};
enum { PART_ALL, PART_LINKS, PART_ALGORITHMS, PART_LADDER, PART_STRATEGIES };

typedef struct {
    int part, max_mib, sweep_ranks, repeat;
    double ladder_scale, start_efficiency;
    const char *svg;
} chapter_flags;

static int runs(const chapter_flags *f, int part) {
    return f->part == PART_ALL || f->part == part;
}

static void validate(const run_config *cfg, const chapter_flags *f) {
    if (launch_mpi_world_size() > 0)
        cli_fail("chapter 7 models the wire on the threads backend: run it without mpirun"
                 " (./run N on a build without MPI=1)");
    if (f->max_mib > 1024)
        cli_fail("--max-mib %d: at most 1024 (every rank holds the message twice)", f->max_mib);
    if (f->sweep_ranks < 2 || f->sweep_ranks > 64)
        cli_fail("--sweep-ranks %d: the largest rank count of the sweep, 2..64", f->sweep_ranks);
    /* below 1% the calibrated slow-down of a slow model passes comm's LINK_SCALE_MAX */
    if (!(f->start_efficiency >= 0.01 && f->start_efficiency <= 0.99))
        cli_fail("--start-efficiency %g: a fraction from 0.01 to 0.99 (the basic rung's"
                 " predicted efficiency)", f->start_efficiency);
    cli_check_at_most("ladder-scale", f->ladder_scale, LINK_SCALE_MAX,
                      "the most --link-scale allows");
    if (f->svg && !runs(f, PART_STRATEGIES))
        cli_fail("--svg needs the strategies part (--part all or --part strategies)");
    if (f->svg) check_writable("svg", f->svg);   /* now, not after a minute of runs */
    cli_check_batch(cfg->batch, cfg->comm.ranks, 1);
}

/* ---- JSON ---------------------------------------------------------------------------- */
static void json_algorithms(FILE *o, const algo_sweep *s) {
    fprintf(o, "\"algorithms\": [");
    for (int i = 0; i < s->count; i++) {
        const algo_point *p = &s->points[i];
        fprintf(o, "%s\n  {\"algorithm\": \"%s\", \"n\": %d, \"bytes\": %zu, \"measured_s\": "
                "%.6e, \"predicted_s\": %.6e}", i ? "," : "", algorithm_name(p->algo),
                p->ranks, p->bytes, p->measured_s, p->predicted_s);
    }
    fprintf(o, "]");
}

static void json_ladder(FILE *o, const ladder_report *r) {
    fprintf(o, "\"ladder_link_scale\": %.6g, \"ladder\": [", r->link_scale);
    for (int i = 0; i < r->count; i++) {
        const ladder_rung *g = &r->rungs[i];
        fprintf(o, "%s\n  {\"rung\": \"%s\", \"batch\": %d, \"grad_accum\": %d, \"wire\": \"%s\","
                " \"tokens_per_s\": %.1f, \"compute_ms\": %.3f, \"efficiency\": %.4f,"
                " \"comm_fraction\": %.4f,"
                " \"loss\": %.6f, \"diff_loss\": %.3e, \"predicted_efficiency\": %.4f}",
                i ? "," : "", g->name, g->batch, g->grad_accum, comm_dtype_name(g->wire),
                g->tokens_per_s, g->compute_ms, g->efficiency, g->comm_fraction, g->loss, g->diff_loss,
                g->predicted_efficiency);
    }
    fprintf(o, "]");
}

static void json_links(FILE *o, const link_row rows[LINKS]) {
    static const char *names[] = {"none", "nvlink", "ib", "ethernet"};
    fprintf(o, "\"links\": [");
    for (int i = 0; i < LINKS; i++)
        fprintf(o, "%s{\"link\": \"%s\", \"bandwidth\": %.4g, \"latency\": %.3g,"
                " \"allreduce_measured_s\": %.6e, \"allreduce_predicted_s\": %.6e}",
                i ? ", " : "", names[rows[i].link], rows[i].bandwidth, rows[i].latency,
                rows[i].measured_s, rows[i].predicted_s);
    fprintf(o, "]");
}

static void json_strategies(FILE *o, const link_strategy_row rows[LINK_STRATEGIES]) {
    fprintf(o, "\"on_links\": [");
    for (int s = 0; s < LINK_STRATEGIES; s++) {
        fprintf(o, "%s\n  {\"strategy\": \"%s\", \"ms_per_step\": [", s ? "," : "",
                rows[s].strategy);
        for (int w = 0; w <= LINKS; w++)
            fprintf(o, "%s%.3f", w ? ", " : "", rows[s].ms_per_step[w]);
        fprintf(o, "], \"efficiency\": [");
        for (int w = 0; w <= LINKS; w++) fprintf(o, "%s%.4f", w ? ", " : "", rows[s].efficiency[w]);
        fprintf(o, "]}");
    }
    fprintf(o, "]");
}

typedef struct {
    link_row links[LINKS];
    algo_sweep sweep;
    ladder_report ladder;
    link_strategy_row strategies[LINK_STRATEGIES];
} chapter_results;

static void print_json(const run_config *cfg, const chapter_flags *f, const chapter_results *r) {
    char *extra = NULL;
    size_t len = 0;
    FILE *o = open_memstream(&extra, &len);
    const char *sep = "";
    if (runs(f, PART_LINKS)) { json_links(o, r->links); sep = ",\n "; }
    if (runs(f, PART_ALGORITHMS)) { fputs(sep, o); json_algorithms(o, &r->sweep); sep = ",\n "; }
    if (runs(f, PART_LADDER)) { fputs(sep, o); json_ladder(o, &r->ladder); sep = ",\n "; }
    if (runs(f, PART_STRATEGIES)) { fputs(sep, o); json_strategies(o, r->strategies); }
    fclose(o);
    report_json(cfg, "07-communication", cfg->comm.ranks, "threads", NULL, 0, extra);
    free(extra);
}

/* ---- the parts ------------------------------------------------------------------------- */
static int run_parts(const run_config *cfg, const dataset *data, const chapter_flags *f,
                     chapter_results *r) {
    const int N = cfg->comm.ranks;
    const gpt_shape shape = gpt_shape_make(&cfg->model, 1, 0);
    const size_t gradient_bytes = gpt_num_params(&shape) * precision_bytes(cfg->grad_precision);
    int status = 0;
    if (runs(f, PART_LINKS) && !(status = links_measure(cfg, gradient_bytes, r->links)) &&
        !cfg->json)
        links_print(r->links, N, gradient_bytes);
    if (!status && runs(f, PART_ALGORITHMS)) {
        int ranks[8], count = 0;
        for (int n = 2; n <= f->sweep_ranks && count < 8; n *= 2) ranks[count++] = n;
        comm_options wire = cfg->comm;
        if (wire.link == LINK_NONE) wire.link = LINK_ETHERNET;
        status = algorithms_sweep(&wire, ranks, count, (size_t)f->max_mib << 20, &r->sweep);
        if (!status && !cfg->json) algorithms_print(&r->sweep);
    }
    if (!status && runs(f, PART_LADDER)) {
        status = ladder_run(cfg, data, f->ladder_scale, f->start_efficiency, 0, f->repeat,
                            &r->ladder);
        if (!status && !cfg->json) ladder_print(&r->ladder, N);
    }
    if (!status && runs(f, PART_STRATEGIES)) {
        double scale = runs(f, PART_LADDER) ? r->ladder.link_scale
                     : f->ladder_scale > 0 ? f->ladder_scale : 1;
        status = on_links_run(cfg, data, scale, f->repeat, r->strategies);
        if (!status && !cfg->json) on_links_print(r->strategies, scale);
        if (!status && f->svg && plot_write_svg(f->svg, r->strategies, scale)) status = 1;
        if (!status && f->svg && !cfg->json) printf("  plot written to %s\n", f->svg);
    }
    return status;
}

int main(int argc, char **argv) {
    run_config cfg = run_config_default();
    cfg.steps = 5;
    cfg.comm.link = LINK_ETHERNET;   /* part 2's wire unless --link says otherwise */
    chapter_flags f = {.max_mib = 64, .sweep_ranks = 8, .repeat = 2, .start_efficiency = 0.30};
    const cli_option options[] = {
        {"part", OPT_CHOICE, &f.part, "which part to run", part_names, 0},
        {"max-mib", OPT_INT, &f.max_mib, "largest all-reduce of part 2, MiB", NULL, 1},
        {"sweep-ranks", OPT_INT, &f.sweep_ranks, "part 2 runs 2, 4, ... up to this many ranks",
         NULL, 2},
        {"ladder-scale", OPT_FLOAT, &f.ladder_scale,
         "Ethernet slow-down of parts 3-4 (0: chosen by --start-efficiency)", NULL, 0},
        {"start-efficiency", OPT_FLOAT, &f.start_efficiency,
         "the basic rung's predicted efficiency the slow-down is chosen for", NULL, 0},
        {"repeat", OPT_INT, &f.repeat, "parts 3-4: runs of each configuration, fastest kept",
         NULL, 1},
        {"svg", OPT_STRING, &f.svg, "write efficiency against bandwidth as SVG", NULL, 0},
        {0},
    };
    /* a checkpoint belongs to one run, and this chapter trains many short ones */
    cfg.no_checkpoints = "chapter 7 trains many short runs to compare links, none of them to"
                         " keep (save and resume in chapters 1-5)";
    cli_parse(argc, argv, &cfg, options, argv[0],
              "Communication: links, all-reduce algorithms, DDP's efficiency ladder, and"
              " DDP / FSDP / TP on slow and fast wires, each next to the alpha-beta model.");
    validate(&cfg, &f);
    dataset *data = dataset_from_config(&cfg);   /* refused before the header */
    if (!cfg.json)
        report_header(&cfg, "Chapter 7: communication, measured on the modelled wire",
                      cfg.comm.ranks, 1);
    chapter_results r = {0};
    int status = run_parts(&cfg, data, &f, &r);
    if (!status && cfg.json) print_json(&cfg, &f, &r);
    algo_sweep_free(&r.sweep);
    dataset_free(data);
    return status;
}
