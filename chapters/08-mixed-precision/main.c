/* Chapter 8: mixed precision, measured.
 *   1. bytes per parameter by tag in fp32, bf16 and fp16, next to 4+4+8 and 2+2+12
 *   2. ZeRO stages 0-3 in mixed precision next to the paper's Table 1 (K = 12)
 *   3. speed: sgemm against bf16 / fp16 matmuls at the step's shapes, step times
 *   4. accuracy: loss curves of fp32, bf16, fp16 with and without loss scaling,
 *      underflow, the loss scale, and the sum bf16 gets wrong
 *   5. the wire: DDP, FSDP and TP bytes per step in each precision, the gradient dtype
 *   6. FP8, numerically (no FP8 unit here: accuracy and bytes, never speed): the grids
 *      of E4M3 and E5M2, one product's error per scaling recipe on real activations
 *      and with outlier channels, loss curves per recipe against bf16, an amax jump,
 *      bytes per parameter and ZeRO-3's all-gather
 * Parts 1-2 are `bytes`, 3 `speed`, 4 `accuracy`, 5 `wire`, 6 `fp8`.
 *
 *   make chapter8 && ./run 4 [--part all|bytes|speed|accuracy|wire|fp8] [--steps 200]
 *                            [--probe-batch 256] [--wire-steps 20] [--fp8-steps 300]
 *                            [--svg loss.svg]
 *                            [--json] */
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "ddp.h"
#include "fits.h"
#include "matmul16.h"
#include "mixed.h"
#include "report.h"

static const char *const part_names[] = {"all", "bytes", "speed", "accuracy", "wire", "fp8",
                                         NULL};
enum { PART_ALL, PART_BYTES, PART_SPEED, PART_ACCURACY, PART_WIRE, PART_FP8 };

/* flags that would change one run of the many this chapter compares */
static const char *const unused_flags[] = {"no-loss-scale", "profile", "fp8-recipe", "fp8-format",
                                           "fp8-amax-history", "fp8-margin", NULL};
#define RUNS_EVERY_PRECISION "chapter 8 runs fp32, bf16 and fp16 itself (leave it out)"

typedef struct {
    int part, probe_batch, wire_steps, fp8_steps;
    const char *svg;
} chapter_flags;

typedef struct {
    bytes_report bytes;
    speed_report speed;
    accuracy_report accuracy;
    wire_report wire;
    fp8_report fp8;
} chapter_results;

static int runs(const chapter_flags *f, int part) {
    return f->part == PART_ALL || f->part == part;
}

/* Each flag that only one part reads is refused where that part does not run. */
static void refuse_unread_flags(const chapter_flags *f) {
    char mode[32];
    snprintf(mode, sizeof mode, "--part %s", part_names[f->part]);
    if (!runs(f, PART_ACCURACY)) {
        static const char *const accuracy_only[] = {"steps", "svg", "probe-batch", NULL};
        cli_refuse_in_mode(mode, accuracy_only, "only part accuracy reads it");
    }
    if (!runs(f, PART_WIRE)) {
        static const char *const wire_only[] = {"wire-steps", NULL};
        cli_refuse_in_mode(mode, wire_only, "only part wire reads it");
    }
    if (!runs(f, PART_FP8)) {
        static const char *const fp8_only[] = {"fp8-steps", NULL};
        cli_refuse_in_mode(mode, fp8_only, "only part fp8 reads it");
    }
    if (f->part == PART_WIRE || f->part == PART_FP8) {
        static const char *const fp16_only[] = {"loss-scale", "loss-scale-window", NULL};
        cli_refuse_in_mode(mode, fp16_only, f->part == PART_WIRE ? "part wire runs no fp16"
                                                                  : "part fp8 runs no fp16");
    }
}

/* --precision and --grad-dtype name one run's precision: refused whatever their value.
 * The chapter parsed the flags as an fp16 run's (so that the loss scale's are taken:
 * they set every fp16 run's); its reference precision is fp32. */
static void refuse_precision_flags(run_config *cfg) {
    if (cli_given("precision"))
        cli_fail("--precision %s: %s", precision_name(cfg->precision), RUNS_EVERY_PRECISION);
    if (cli_given("grad-dtype"))
        cli_fail("--grad-dtype %s: %s", precision_name(cfg->grad_precision),
                 RUNS_EVERY_PRECISION);
    if (cfg->comm.trace_path)
        cli_fail("--trace %s: chapter 8 runs many strategies one after the other, and a"
                 " trace belongs to one run (trace them in chapters 1-5)", cfg->comm.trace_path);
    cfg->precision = PRECISION_FP32;
}

static void validate(run_config *cfg, const chapter_flags *f) {
    refuse_precision_flags(cfg);
    refuse_unread_flags(f);
    cli_check_at_most("probe-batch", f->probe_batch, 4096, "4096 sequences");
    cli_check_at_most("wire-steps", f->wire_steps, 10000, "10000 steps");
    cli_check_at_most("fp8-steps", f->fp8_steps, 10000, "10000 steps");
    if (f->svg) check_writable("svg", f->svg);   /* now, not after a minute of runs */
    if (runs(f, PART_BYTES) || runs(f, PART_SPEED) || runs(f, PART_WIRE))
        cli_check_batch(cfg->batch, cfg->comm.ranks, 1);
    fits_check_or_exit(cfg, 1.0);
    if (runs(f, PART_ACCURACY)) {   /* the underflow probe's one big step */
        run_config probe = *cfg;
        probe.batch = f->probe_batch;
        probe.comm.ranks = 1;
        fits_check_or_exit(&probe, 1.0);
    }
}

/* Collective runs first (every process of an mpirun takes part), then the one-rank
 * runs on world rank 0's process alone. */
static int run_parts(const run_config *cfg, const dataset *data, const chapter_flags *f,
                     chapter_results *r) {
    int status = 0;
    if (runs(f, PART_BYTES)) status = bytes_launches(cfg, data, &r->bytes);
    if (!status && runs(f, PART_SPEED)) status = speed_launches(cfg, data, &r->speed);
    if (!status && runs(f, PART_WIRE))
        status = wire_launches(cfg, data, f->wire_steps, &r->wire);
    if (status || !process_hosts_rank0()) return status;
    if (runs(f, PART_SPEED)) speed_local(cfg, data, &r->speed);
    if (runs(f, PART_ACCURACY)) accuracy_local(cfg, data, f->probe_batch, &r->accuracy);
    if (runs(f, PART_ACCURACY) && f->svg && accuracy_write_svg(f->svg, &r->accuracy))
        status = 1;
    if (runs(f, PART_FP8)) {
        fp8_local(cfg, data, &r->fp8);
        fp8_curves(cfg, data, f->fp8_steps, &r->fp8);
        fp8_gradient_errors(cfg, data, &r->fp8);
        fp8_bytes(cfg, &r->fp8);
    }
    return status;
}

static void print_tables(const chapter_flags *f, const chapter_results *r) {
    if (runs(f, PART_BYTES)) bytes_print(&r->bytes);
    if (runs(f, PART_SPEED)) speed_print(&r->speed);
    if (runs(f, PART_ACCURACY)) accuracy_print(&r->accuracy);
    if (runs(f, PART_ACCURACY) && f->svg) printf("  loss curves written to %s\n", f->svg);
    if (runs(f, PART_WIRE)) wire_print(&r->wire);
    if (runs(f, PART_FP8)) fp8_print(&r->fp8);
}

static void print_json(const run_config *cfg, const chapter_flags *f, const chapter_results *r) {
    char *extra = NULL;
    size_t len = 0;
    FILE *o = open_memstream(&extra, &len);
    if (!o) abort();
    const char *sep = "";
    fprintf(o, "\"part\": \"%s\"", part_names[f->part]);
    sep = ",\n ";
    if (runs(f, PART_BYTES)) { fputs(sep, o); bytes_json(o, &r->bytes); }
    if (runs(f, PART_SPEED)) { fputs(sep, o); speed_json(o, &r->speed); }
    if (runs(f, PART_ACCURACY)) { fputs(sep, o); accuracy_json(o, &r->accuracy); }
    if (runs(f, PART_WIRE)) { fputs(sep, o); wire_json(o, &r->wire); }
    if (runs(f, PART_FP8)) { fputs(sep, o); fp8_json(o, &r->fp8); }
    fclose(o);
    report_json(cfg, "08-mixed-precision", cfg->comm.ranks,
                launch_mpi_world_size() > 0 ? "mpi" : "threads", NULL, 0, extra);
    free(extra);
}

int main(int argc, char **argv) {
    run_config cfg = run_config_default();
    mixed_chapter_defaults(&cfg);
    chapter_flags f = {.probe_batch = 256, .wire_steps = 20, .fp8_steps = FP8_CURVE_STEPS};
    const cli_option options[] = {
        {"part", OPT_CHOICE, &f.part, "which part to run", part_names, 0},
        {"probe-batch", OPT_INT, &f.probe_batch,
         "accuracy: sequences in the one step that measures fp16's underflow", NULL, 1},
        {"wire-steps", OPT_INT, &f.wire_steps, "wire: steps of each run", NULL, 1},
        {"fp8-steps", OPT_INT, &f.fp8_steps, "fp8: steps of each loss curve (default 300)",
         NULL, 1},
        {"svg", OPT_STRING, &f.svg, "accuracy: write the loss curves as SVG", NULL, 0},
        {0},
    };
    cfg.no_checkpoints = "chapter 8 trains many short runs to compare precisions, none of"
                         " them to keep (save and resume in chapters 1-5)";
    cfg.unused_flags = unused_flags;
    cfg.unused_why = "chapter 8 runs fp32, bf16 and fp16, with and without the loss scale,"
                     " and times them itself";
    static const char *const own_precision[] = {"precision", NULL};
    cfg.refused_flags = own_precision;   /* refuse_precision_flags */
    cfg.precision = PRECISION_FP16;   /* --loss-scale and its window: the fp16 runs' */
    cfg.fp32_grads_only = RUNS_EVERY_PRECISION;
    cli_parse(argc, argv, &cfg, options, argv[0],
              "Mixed precision: bytes per parameter, ZeRO in 16 bits, matmul and step speed,"
              " loss curves and underflow, and the wire, in fp32, bf16 and fp16; FP8's"
              " formats, scaling recipes and bytes (accuracy, not speed: no FP8 unit here).");
    validate(&cfg, &f);
    dataset *data = dataset_from_config(&cfg);   /* refused before the header */
    if (!cfg.json && process_hosts_rank0())
        report_header(&cfg, "Chapter 8: mixed precision, measured", cfg.comm.ranks, 1);
    chapter_results r = {0};
    int status = run_parts(&cfg, data, &f, &r);
    if (!status && process_hosts_rank0()) {
        if (cfg.json) print_json(&cfg, &f, &r);
        else print_tables(&f, &r);
    }
    accuracy_free(&r.accuracy);
    fp8_curves_free(&r.fp8);
    dataset_free(data);
    matmul16_release_thread();
    return status;
}
