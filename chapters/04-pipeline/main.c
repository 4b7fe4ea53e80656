/* Chapter 4: pipeline parallelism. The model is cut by layers into stages, one per
 * rank; micro-batches and the order of forwards and backwards (the schedule) decide
 * how long ranks wait for each other (the bubble).
 *
 *   ./run 4 --simulate [--schedule all] [--micro 8] [--virtual 2] [--stage-ms 1]
 *           [--link ethernet] [--svg pipe.svg] [--json]
 *   ./run 1 --simulate --pp 64 --micro 3072 --schedule 1f1b
 *
 * --simulate runs each schedule's op lists (the ones real ranks will run) on the event
 * simulator: forward 1, backward 2 (zb-h1: B 1 + W 1) in units of --stage-ms, messages
 * free unless --link is given. Training on real ranks comes next. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "compare.h"
#include "fits.h"
#include "simulate.h"
#include "training.h"
#include "baseline.h"
#include "replica.h"

enum { SCHEDULE_ALL = PP_NSCHEDULES };   /* --schedule all: after pp_schedule.h's names */
static const char *const order_choices[] = {"ordered", "eager", NULL};

typedef struct {
    run_config cfg;
    int pp, micro, chunks, schedule, simulate, order;
    double stage_ms;
    double time_f, time_b, time_w, fb_overlap;   /* --simulate's op times; < 0: not given */
    const char *svg_path;
} chapter_args;

/* The wire as comm.h models it: latency, bandwidth (GB = 1e9 B), both x --link-scale. */
static void link_model(const comm_options *o, double *alpha_ms, double *ms_per_byte) {
    const comm_link_figures link = comm_link_spec(o->link);
    *alpha_ms = *ms_per_byte = 0;
    if (o->link == LINK_NONE) return;
    *alpha_ms = 1e3 * link.latency * o->link_scale;
    *ms_per_byte = 1e3 / link.bandwidth * o->link_scale;
}

/* Training: p stages on the ranks, the other ranks more pipelines side by side (data
 * parallel, each on batch / d sequences). Returns d; a size that cannot be laid out on
 * the ranks is one line and exit 2. */
static int pipelines_on_ranks(const chapter_args *a, int p) {
    const int ranks = a->cfg.comm.ranks;
    if (a->simulate) return 1;   /* the simulator runs any p on one process */
    if (p > ranks)
        cli_fail("--pp %d: more stages than the %d ranks (a stage is a rank: use --pp 1 to %d,"
                 " or --simulate)", p, ranks, ranks);
    if (ranks % p != 0)
        cli_fail("--pp %d does not divide the %d ranks (the ranks form pipelines of p stages,"
                 " the rest data parallel: use a divisor of %d)", p, ranks, ranks);
    const int d = ranks / p;
    if (a->cfg.batch % d != 0)
        cli_fail("--batch %d does not split over %d pipelines (--pp %d on %d ranks: use a"
                 " multiple of %d)", a->cfg.batch, d, p, ranks, d);
    return d;
}

/* pp_validate with each pipeline's share of the batch; the line names the split. */
static int fits_pipeline(pp_schedule_kind k, const pipeline_sim_config *c, int layers,
                         int batch, char *err, size_t size) {
    const int d = c->replicas;
    if (pp_validate(k, c->pp, pipeline_micro_for(c, k), pipeline_chunks_for(c, k), layers,
                    batch / d, err, size))
        return 1;
    if (d > 1) {
        const size_t len = strlen(err);
        snprintf(err + len, size - len, "; each of the %d pipelines trains on %d of the"
                 " --batch %d sequences", d, batch / d, batch);
    }
    return 0;
}

/* ./run 4 on the default 4 layers cannot interleave 4 stages x 2 chunks: the default
 * model grows to v x p layers, said in one line, so that the default run shows every
 * schedule. A model the user chose (--layers, --preset, --virtual, --resume) is kept,
 * and so is one that restarts (--max-restarts): a restart resumes the checkpoint, on
 * fewer ranks with --elastic, so its depth must not follow the rank count. */
static void fit_interleaving(chapter_args *a, const pipeline_sim_config *c) {
    static const char *const chosen[] = {"layers", "preset", "virtual", "resume",
                                         "max-restarts", NULL};
    for (int i = 0; chosen[i]; i++)
        if (cli_given(chosen[i])) return;
    const int vshape = a->schedule != SCHEDULE_ALL && pp_schedule_vshape(a->schedule);
    if (a->schedule != SCHEDULE_ALL && a->schedule != PP_INTERLEAVED && !vshape) return;
    const pp_schedule_kind kind = vshape ? (pp_schedule_kind)a->schedule : PP_INTERLEAVED;
    const int layers = a->cfg.model.layers;
    const int wanted = c->pp * (vshape ? 2 : c->chunks);   /* a V: 2 chunks a rank */
    pipeline_sim_config one_chunk = *c;
    one_chunk.chunks = 1;
    char err[512];
    if (wanted <= layers || !fits_pipeline(PP_GPIPE, &one_chunk, layers, a->cfg.batch, err,
                                           sizeof err) ||
        !fits_pipeline(kind, c, wanted, a->cfg.batch, err, sizeof err))
        return;   /* it fits; the others do not; or another reason (m, the batch) */
    a->cfg.model.layers = wanted;
    if (!a->cfg.json && process_hosts_rank0())
        printf("chapter 4: --layers %d rather than the default %d, so that the %s schedule"
               " fits (%d stages x %d chunks); give --layers to choose\n", wanted, layers,
               vshape ? pp_schedule_name(kind) : "interleaved", c->pp, wanted / c->pp);
}

/* Settles which schedules run; a bad size is one line and exit 2. With --schedule all,
 * a schedule that cannot take these sizes is skipped with the reason. */
static void choose_schedules(const chapter_args *a, pipeline_sim_config *c) {
    const gpt_config *m = &a->cfg.model;
    char err[512];
    /* What every schedule needs (p, m against the model and batch) is checked once. */
    pipeline_sim_config every = *c;
    every.chunks = 1;
    if (!fits_pipeline(PP_GPIPE, &every, m->layers, a->cfg.batch, err, sizeof err))
        cli_fail("%s", err);
    for (int k = 0; k < PP_NSCHEDULES; k++) {
        if (a->schedule != SCHEDULE_ALL && a->schedule != k) continue;
        static char reasons[PP_NSCHEDULES][512];
        int fits = fits_pipeline(k, c, m->layers, a->cfg.batch, reasons[k], sizeof reasons[k]);
        if (!fits && a->schedule != SCHEDULE_ALL) cli_fail("%s", reasons[k]);
        c->runs[k] = fits;
        c->skipped[k] = fits ? NULL : reasons[k];
    }
}

/* Flags that a mode ignores, and sizes whose lists would not fit or never end: one line
 * and exit 2 before any work. */
enum { MAX_STAGES = 1024, MAX_CHUNK_PASSES = 1 << 20 };
static const double max_stage_ms = 60e3;

static int in_argv(int argc, char **argv, const char *name) {
    for (int i = 1; i < argc; i++)
        if (strncmp(argv[i], "--", 2) == 0 && strcmp(argv[i] + 2, name) == 0) return 1;
    return 0;
}

/* Whether --schedule (a kind, or all) runs a schedule with chunks per rank. */
static int takes_virtual(int schedule) {
    return schedule == SCHEDULE_ALL || pp_schedule_about(schedule)->takes_virtual;
}

static void refuse_unused_flags(const chapter_args *a) {
    static const char *const training_only[] = {"save-every", "grad-dtype", NULL};
    static const char *const simulator_only[] = {"comm-order", "time-f", "time-b", "time-w",
                                                 "fb-overlap", NULL};
    static const char *const interleaved_only[] = {"virtual", NULL};
    if (a->simulate)
        cli_refuse_in_mode("--simulate", training_only, "the simulator trains no model");
    else
        cli_refuse_in_mode("training", simulator_only, "the ranks run the ordered lists, paced"
                           " by --stage-ms, and F&B one pass after the other; these are for"
                           " --simulate");
    if (!takes_virtual(a->schedule)) {
        char mode[64];
        snprintf(mode, sizeof mode, "--schedule %s", pp_schedule_name(a->schedule));
        cli_refuse_in_mode(mode, interleaved_only,
                           pp_schedule_vshape(a->schedule)
                               ? "a V always places 2 chunks on each rank"
                               : "only the interleaved schedule has chunks");
    }
}

static void bound_sizes(const chapter_args *a, int p) {
    cli_check_at_most("stage-ms", a->stage_ms, max_stage_ms, "a minute per modelled pass");
    static const char *const times[] = {"time-f", "time-b", "time-w"};
    const double values[] = {a->time_f, a->time_b, a->time_w};
    for (int i = 0; i < 3; i++)
        cli_check_at_most(times[i], values[i], max_stage_ms, "a minute per modelled pass");
    if (cli_given("time-f") && a->time_f == 0)
        cli_fail("--time-f 0: a forward must take some time (valid: more than 0 ms)");
    cli_check_at_most("fb-overlap", a->fb_overlap, 1, "a fraction of the shorter pass");
    if (p > MAX_STAGES)
        cli_fail("--pp %d: at most %d stages (building the schedules' lists takes time and"
                 " memory that grow as p squared)", p, MAX_STAGES);
    /* chunks per rank: --virtual's, or a V's 2 (with all, the more of the two) */
    const int vshape = a->schedule == SCHEDULE_ALL || pp_schedule_vshape(a->schedule);
    int v = takes_virtual(a->schedule) ? a->chunks : 1;
    if (vshape && v < 2) v = 2;
    const double passes = (double)p * a->micro * v;
    if (passes > MAX_CHUNK_PASSES)
        cli_fail("--pp %d x --micro %d%s = %.0f forwards through a chunk, more than %d (the lists"
                 " would take a gigabyte and seconds): use a smaller --pp or --micro", p, a->micro,
                 v == 1 ? "" : v == a->chunks && takes_virtual(a->schedule) ? " x --virtual"
                                                                            : " x 2 chunks (a V)",
                 passes, MAX_CHUNK_PASSES);
}

/* The SVG file of every schedule that runs (FILE-<schedule>.svg for several). */
static void check_svgs_writable(const pipeline_sim_config *c) {
    int n = 0;
    for (int k = 0; k < PP_NSCHEDULES; k++) n += c->runs[k];
    for (int k = 0; k < PP_NSCHEDULES && c->svg_path; k++) {
        if (!c->runs[k]) continue;
        char path[1024];
        pipeline_svg_path(c->svg_path, pp_schedule_name(k), n > 1, path, sizeof path);
        check_writable("svg", path);
    }
}

static pipeline_sim_config sim_config(const chapter_args *a) {
    const run_config *cfg = &a->cfg;
    pipeline_sim_config c = {
        .pp = a->pp ? a->pp : cfg->comm.ranks, .micro = a->micro, .chunks = a->chunks,
        .stage_ms = a->stage_ms > 0 ? a->stage_ms : 1.0,   /* the simulator's unit */
        .order = (pp_comm_order)a->order,
        .svg_path = a->svg_path, .json = cfg->json,
        .with_dualpipe = a->schedule == SCHEDULE_ALL,
        .link_name = cfg->comm.link == LINK_NONE ? NULL : comm_link_spec(cfg->comm.link).name,
    };
    /* one micro-batch's activations: batch/m sequences x ctx x dim fp32 */
    /* op times: F --time-f (default: --stage-ms), B and W --time-b and --time-w (F) */
    c.time_f = a->time_f >= 0 ? a->time_f : c.stage_ms;
    c.time_b = a->time_b >= 0 ? a->time_b : c.time_f;
    c.time_w = a->time_w >= 0 ? a->time_w : c.time_f;
    c.fb_overlap = a->fb_overlap >= 0 ? a->fb_overlap : 0;
    c.message_bytes = (double)precision_bytes(cfg->precision) * cfg->batch / a->micro *
                      cfg->model.ctx * cfg->model.dim;   /* activations in the run's precision */
    link_model(&cfg->comm, &c.link_alpha_ms, &c.link_ms_per_byte);
    c.replicas = pipelines_on_ranks(a, c.pp);
    /* the default m: at most one sequence per micro-batch in each pipeline's share */
    if (!cli_given("micro") && c.micro > cfg->batch / c.replicas)
        c.micro = cfg->batch / c.replicas;
    return c;
}

int main(int argc, char **argv) {
    chapter_args a = {.cfg = run_config_default(), .micro = 8, .chunks = 2,
                      .schedule = SCHEDULE_ALL, .stage_ms = -1, .time_f = -1, .time_b = -1,
                      .time_w = -1, .fb_overlap = -1};
    a.cfg.steps = 5;   /* five schedules, each paced by the compute model */
    const char *schedule_choices[PP_NSCHEDULES + 2];
    pp_schedule_choices(schedule_choices, "all");
    const cli_option options[] = {
        {"pp", OPT_INT, &a.pp, "pipeline stages (default: the rank count)", NULL, 1},
        {"micro", OPT_INT, &a.micro, "micro-batches per step (must divide --batch)", NULL, 1},
        {"virtual", OPT_INT, &a.chunks, "model chunks per rank for the interleaved schedule",
         NULL, 1},
        {"schedule", OPT_CHOICE, &a.schedule, "pipeline schedule", schedule_choices, 0},
        {"stage-ms", OPT_FLOAT, &a.stage_ms, "modelled forward time of one micro-batch on a"
         " stage, backward twice that (default 1 in --simulate)", NULL, 0},
        {"simulate", OPT_FLAG, &a.simulate, "run the schedules on the event simulator, no"
         " training", NULL, 0},
        {"time-f", OPT_FLOAT, &a.time_f, "--simulate: a forward of one micro-batch on a stage"
         " (default --stage-ms)", NULL, 0},
        {"time-b", OPT_FLOAT, &a.time_b, "--simulate: its input-gradient backward B (default"
         " --time-f; a whole backward is B + W)", NULL, 0},
        {"time-w", OPT_FLOAT, &a.time_w, "--simulate: its weight-gradient backward W (default"
         " --time-f)", NULL, 0},
        {"fb-overlap", OPT_FLOAT, &a.fb_overlap, "--simulate: the share of the shorter pass of"
         " dualpipev's F&B hidden under the other on GPU streams (default 0)", NULL, 0},
        {"comm-order", OPT_CHOICE, &a.order, "sends and receives as the schedule orders them,"
         " or eagerly (deadlocks 1f1b when sends wait for receives)", order_choices, 0},
        {"svg", OPT_STRING, &a.svg_path, "write the schedule drawn per rank as an SVG here"
         " (with several schedules: FILE-<schedule>.svg)", NULL, 0},
        {0},
    };
    /* before cli_parse, whose check of --save would make the directory first */
    if (in_argv(argc, argv, "simulate"))
        a.cfg.no_checkpoints = "does nothing with --simulate (the simulator trains no model)";
    cli_parse(argc, argv, &a.cfg, options, argv[0],
              "Pipeline parallelism: naive, GPipe, 1F1B, interleaved 1F1B, ZB-H1, ZB-V and"
              " DualPipeV schedules, their bubbles and pictures.");
    refuse_unused_flags(&a);
    bound_sizes(&a, a.pp ? a.pp : a.cfg.comm.ranks);
    pipeline_sim_config c = sim_config(&a);
    fit_interleaving(&a, &c);
    choose_schedules(&a, &c);
    dataset_free(dataset_from_config(&a.cfg));   /* --data is checked before anything runs */
    check_svgs_writable(&c);
    if (a.simulate) return pipeline_simulate(&c);
    fits_check_or_exit(&a.cfg, 1.0 / c.pp);   /* a stage holds 1/p of the model */
    /* on real ranks the compute model is on unless --stage-ms 0 says real time */
    c.stage_ms = a.stage_ms >= 0 ? a.stage_ms : PIPELINE_TRAIN_STAGE_MS;
    return pipeline_train(&c, &a.cfg);
}
