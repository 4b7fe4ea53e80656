/* Chapter 9: the sequence, split.
 *   sp       Megatron sequence parallelism on the TP group: TP against TP + SP, each
 *            against the single-device baseline; bytes by collective next to the
 *            formulas (a ring all-reduce is a reduce-scatter + an all-gather),
 *            activations, tokens/s and time in communication
 *   memory   activation bytes per layer per rank of six configurations (none, TP,
 *            TP + SP, TP + selective, TP + SP + selective, full recomputation), measured,
 *            next to Korthikanti et al. 2022's Table 2 re-derived for this model
 *   context  context parallelism: ring attention and Ulysses (context.h)
 *
 *   make chapter9 && ./run 4 [--part all|sp|memory|context] [--tp 4]
 *                            [--recompute none|selective|full] [--svg memory.svg]
 *                            [--trace sp.json] [--json] */
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "fits.h"
#include "report.h"
#include "context.h"
#include "sequence.h"

static const char *const part_names[] = {"all", "sp", "memory", "context", NULL};
enum { PART_ALL, PART_SP, PART_MEMORY, PART_CONTEXT };
static const char *const recompute_names[] = {"none", "selective", "full", NULL};

typedef struct {
    int part, tp, recompute;
    const char *svg;
    context_flags context;
} chapter_flags;

typedef struct {
    sp_report sp;
    memory_report memory;
    context_report context;
} chapter_results;

static int runs(const chapter_flags *f, int part) {
    return f->part == PART_ALL || f->part == part;
}

/* Each flag that only one part reads is refused where that part does not run. */
static void refuse_unread_flags(const chapter_flags *f, const run_config *cfg) {
    char mode[32];
    snprintf(mode, sizeof mode, "--part %s", part_names[f->part]);
    if (!runs(f, PART_SP)) {
        static const char *const sp_only[] = {"recompute", "trace", NULL};
        cli_refuse_in_mode(mode, sp_only, "only part sp reads it");
    }
    if (!runs(f, PART_MEMORY)) {
        static const char *const memory_only[] = {"svg", NULL};
        cli_refuse_in_mode(mode, memory_only, "only part memory reads it");
    }
    if (!runs(f, PART_SP) && !runs(f, PART_MEMORY)) {
        static const char *const tp_only[] = {"tp", NULL};
        cli_refuse_in_mode(mode, tp_only, "parts sp and memory read it");
    }
    if (!runs(f, PART_CONTEXT)) context_refuse_flags(mode);
    if (cfg->comm.trace_path && f->part != PART_SP)
        cli_fail("--trace %s: a trace belongs to one run; give --part sp (it traces the"
                 " TP + SP run)", cfg->comm.trace_path);
}

/* The TP size: --tp, or the largest that divides heads, ranks and ctx; sequence
 * parallelism needs it to divide ctx and be 2 or more. */
static void choose_tp(run_config *cfg, chapter_flags *f) {
    char err[512];
    const int world = cfg->comm.ranks;
    if (f->tp == 0) f->tp = sp_largest_tp(cfg);
    if (f->tp == 1 && !cli_given("tp"))
        cli_fail("./run %d: sequence parallelism needs a TP group of 2 or more ranks, and no"
                 " such size divides --heads %d, --ctx %d and %d rank%s (with --batch %d over"
                 " the rest): run on 2 or 4 ranks", world, cfg->model.heads, cfg->model.ctx,
                 world, world > 1 ? "s" : "", cfg->batch);
    if (!tp_check_sizes(cfg, world, f->tp, err, sizeof err) ||
        !tp_sequence_check(cfg, f->tp, err, sizeof err)) {
        cli_fail("%s", err);   /* one line, from the first process */
    }
}

static void validate(run_config *cfg, chapter_flags *f) {
    refuse_unread_flags(f, cfg);
    if (f->svg) check_writable("svg", f->svg);
    if (runs(f, PART_SP) || runs(f, PART_MEMORY)) choose_tp(cfg, f);
    if (runs(f, PART_CONTEXT))
        context_check_flags(cfg, cfg->comm.ranks, &f->context, f->part == PART_CONTEXT);
    fits_check_or_exit(cfg, 1.0);
}

/* Collective: every process of an mpirun runs every part. */
static int run_parts(const run_config *cfg, const dataset *data, const chapter_flags *f,
                     chapter_results *r) {
    int status = 0;
    if (runs(f, PART_SP)) status = sp_launches(cfg, data, f->tp, f->recompute, &r->sp);
    if (!status && runs(f, PART_MEMORY)) status = memory_launches(cfg, f->tp, &r->memory);
    r->context.flags = f->context;
    if (!status && runs(f, PART_CONTEXT)) status = context_launches(cfg, data, &r->context);
    if (!status && process_hosts_rank0() && runs(f, PART_MEMORY) && f->svg)
        status = memory_write_svg(f->svg, &r->memory);
    return status;
}

/* 0 when every part that ran holds its claims. */
static int verdict(const chapter_flags *f, const chapter_results *r) {
    int ok = 1;
    if (runs(f, PART_SP)) ok &= sp_passed(&r->sp);
    if (runs(f, PART_MEMORY)) ok &= memory_passed(&r->memory);
    if (runs(f, PART_CONTEXT)) ok &= context_passed(&r->context);
    return ok ? 0 : 1;
}

static void print_tables(const run_config *cfg, const chapter_flags *f,
                         const chapter_results *r) {
    if (runs(f, PART_SP)) sp_print(cfg, &r->sp);
    if (runs(f, PART_MEMORY)) memory_print(&r->memory);
    if (runs(f, PART_MEMORY) && f->svg) printf("  bars written to %s\n", f->svg);
    if (runs(f, PART_CONTEXT)) context_print(&r->context);
}

static void print_json(const run_config *cfg, const chapter_flags *f, const chapter_results *r) {
    char *extra = NULL;
    size_t len = 0;
    FILE *o = open_memstream(&extra, &len);
    if (!o) abort();
    fprintf(o, "\"part\": \"%s\"", part_names[f->part]);
    if (runs(f, PART_SP)) { fputs(",\n ", o); sp_json(o, &r->sp); }
    if (runs(f, PART_MEMORY)) { fputs(",\n ", o); memory_json(o, &r->memory); }
    if (runs(f, PART_CONTEXT)) { fputs(",\n ", o); context_json(o, &r->context); }
    fclose(o);
    report_json(cfg, "09-sequence", cfg->comm.ranks,
                launch_mpi_world_size() > 0 ? "mpi" : "threads", NULL, 0, extra);
    free(extra);
}

int main(int argc, char **argv) {
    run_config cfg = run_config_default();
    cfg.model.layers = 2;   /* the default run, every part, well under a minute */
    chapter_flags f = {0};
    const cli_option options[] = {
        {"part", OPT_CHOICE, &f.part, "which part to run", part_names, 0},
        {"tp", OPT_INT, &f.tp, "sp, memory: tensor-parallel size (default: the largest that"
         " divides heads, ranks and ctx)", NULL, 1},
        {"recompute", OPT_CHOICE, &f.recompute, "sp: recomputation in both runs (selective:"
         " the attention's probabilities; full: all but the block inputs)", recompute_names, 0},
        {"svg", OPT_STRING, &f.svg, "memory: write the six configurations' bars as SVG", NULL,
         0},
        CONTEXT_CLI_OPTIONS(f.context),
        {0},
    };
    cfg.no_checkpoints = "chapter 9 compares short runs, none of them to keep (save and"
                         " resume in chapters 1-5)";
    cli_parse(argc, argv, &cfg, options, argv[0],
              "Sequence parallelism (Megatron SP) against TP, activation memory per layer"
              " against Korthikanti et al. 2022, and context parallelism.");
    dataset *data = dataset_from_config(&cfg);   /* a bad --data first, as in every program */
    validate(&cfg, &f);
    if (!cfg.json && process_hosts_rank0())
        report_header(&cfg, "Chapter 9: the sequence, split", cfg.comm.ranks, 1);
    chapter_results r = {0};
    int status = run_parts(&cfg, data, &f, &r);
    if (!status && process_hosts_rank0()) {
        if (cfg.json) print_json(&cfg, &f, &r);
        else print_tables(&cfg, &f, &r);
        status = verdict(&f, &r);
    }
    sp_free(&r.sp);
    context_report_free(&r.context);
    dataset_free(data);
    return status;
}
