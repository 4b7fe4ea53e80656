/* Chapter 5: 3D parallelism. Tensor parallelism inside each pipeline stage, pipeline
 * stages across ranks, data-parallel replicas of the whole pipeline, on one device
 * mesh, trained against the single-device baseline; and the course text's meshes
 * checked by arithmetic.
 *
 *   make chapter5 && ./run 8                      tp 2 x pp 2 x dp 2
 *   ./run 8 --tp 2 --pp 4 --dp 1 --schedule zb-h1 --zero 1
 *   ./run 8 --zero 3                              FSDP across dp, inside TP and PP
 *   ./run 1 --mesh-only --world 1024 --tp 8 --pp 16 --dp 8 [--json]
 *   ./run 1 --examples                            GPT-3 and MT-NLG */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "compare.h"
#include "fits.h"
#include "mesh_table.h"
#include "report.h"
#include "mesh_train.h"
#include "tp_train.h"

typedef struct {
    run_config cfg;
    mesh_shape shape;           /* 0: not given */
    int schedule, micro, chunks, zero, mesh_only, world, examples;
} chapter_args;

/* What the model and batch can take, for mesh_check's suggestions. */
static int model_fits(const mesh_shape *m, const void *ctx) {
    const chapter_args *a = ctx;
    const gpt_config *g = &a->cfg.model;
    return g->heads % m->tp == 0 && m->pp * a->chunks <= g->layers &&
           a->cfg.batch % (m->dp * a->micro) == 0;
}

/* Sizes not given: completed for the world (mesh_complete), or one line and exit. */
static void complete_mesh(chapter_args *a, int world) {
    char err[160];
    if (!mesh_complete(&a->shape, world, a->cfg.model.heads, a->cfg.model.layers, err,
                       sizeof err))
        cli_fail("%s", err);
}

/* One line: what does not fit, and the meshes of these ranks that would. */
static void refuse(const chapter_args *a, int world, const char *why) {
    char try[192];
    mesh_suggest(&a->shape, world, model_fits, a, 2, try, sizeof try);
    if (try[0]) cli_fail("%s; with %d ranks try %s", why, world, try);
    cli_fail("%s", why);
}

static void check_or_exit(chapter_args *a, int world) {
    char err[512];
    const gpt_config *g = &a->cfg.model;
    if (a->schedule == PP_INTERLEAVED && a->chunks < 2) a->chunks = 2;
    a->chunks = pp_schedule_chunks(a->schedule, a->chunks);
    a->micro = pp_schedule_micro(a->schedule, a->micro);
    const mesh_config mc = {.shape = a->shape, .world = world,
                            .fits = a->mesh_only ? NULL : model_fits, .ctx = a};
    if (mesh_check(&mc, err, sizeof err)) cli_fail("%s", err);
    if (a->mesh_only) return;
    if (g->heads % a->shape.tp != 0) {
        snprintf(err, sizeof err, "--tp %d does not divide --heads %d (each TP rank takes"
                 " whole heads)", a->shape.tp, g->heads);
        refuse(a, world, err);
    }
    if (a->cfg.batch % a->shape.dp != 0) {
        snprintf(err, sizeof err, "--batch %d does not split over --dp %d replicas",
                 a->cfg.batch, a->shape.dp);
        refuse(a, world, err);
    }
    if (!pp_validate(a->schedule, a->shape.pp, a->micro, a->chunks, g->layers,
                     a->cfg.batch / a->shape.dp, err, sizeof err)) {
        char why[768];
        if (a->shape.dp == 1) snprintf(why, sizeof why, "%s", err);
        else snprintf(why, sizeof why, "%s; each of the --dp %d replicas trains on %d of"
                      " the --batch %d sequences", err, a->shape.dp,
                      a->cfg.batch / a->shape.dp, a->cfg.batch);
        refuse(a, world, why);
    }
}

/* ---- the tables ---------------------------------------------------------------------- */

static const char *what_moves[PIPELINE_GROUP_KINDS] = {
    "all-reduces of b s h: 2 forward + 2 backward per block and micro-batch"
    " (+ embedding, head, loss)",
    "activations forward, gradients backward: b s h per micro-batch and boundary",
    NULL,   /* by ZeRO stage: dp_moves */
    "the tied embedding's gradient between the first and last stage"};

/* What the dp group's collectives move per step, P the rank's stage slice (elements):
 * gradients of g bytes (--grad-dtype), compute weights of c bytes. */
static const char *dp_moves(int zero, int g, int c) {
    static char line[160];
    switch (zero) {
    case 1:
        snprintf(line, sizeof line, "ZeRO-1: reduce-scatter of the gradient (d-1)/d x %dP +"
                 " all-gather of the parameters (d-1)/d x %dP", g, c);
        break;
    case 2:
        return "ZeRO-2: the same as ZeRO-1 (gradient shards kept, parameters gathered)";
    case 3:
        snprintf(line, sizeof line, "ZeRO-3: all-gather of the parameters once per step"
                 " (d-1)/d x %dP + reduce-scatter of the gradient (d-1)/d x %dP", c, g);
        break;
    default:
        snprintf(line, sizeof line, "all-reduce of the stage slice's gradient: 2 (d-1)/d x %dP",
                 g);
    }
    return line;
}

static void print_collectives(const mesh_extra *o, int world, const run_config *cfg) {
    char a[32], b[32];
    printf("\nCollectives per step, by group kind (bytes each rank sends, measured, next to the"
           " formula for that rank; the largest rank shown)\n");
    printf("  %-10s %8s %12s %12s   what moves\n", "group", "calls", "measured", "formula");
    for (int k = 0; k < PIPELINE_GROUP_KINDS; k++) {
        int at = 0;
        for (int w = 1; w < world; w++)
            if (o->ranks[w].bytes[k] > o->ranks[at].bytes[k]) at = w;
        const mesh_rank_traffic *t = &o->ranks[at];
        printf("  %-10s %8.0f %12s %12s   %s\n", pipeline_group_kind_name(k), t->calls[k],
               report_bytes(t->bytes[k], a), report_bytes(t->formula[k], b),
               k == PIPELINE_DP ? dp_moves(o->shape.dp > 1 ? o->opts.zero_stage : 0,
                                           (int)precision_bytes(cfg->grad_precision),
                                           (int)precision_bytes(cfg->precision))
                                : what_moves[k]);
    }
    printf("  largest |measured / formula - 1| over all ranks and kinds: %.1e\n",
           o->worst_bytes_error);
}

/* The ZeRO paper's model states per rank, with P the rank's stage slice (its TP
 * slice of its pipeline stages) and d the dp degree; in mixed precision 16-bit compute
 * weights, fp32 gradients and fp32 masters with m and v. */
static const char *state_formula(int zero, precision p, precision g) {
    static const char *const fp32[4] = {
        "4P params + 4P grads + 8P Adam (nothing sharded)",
        "4P params + 4P grads + 8P/d Adam (ZeRO-1)",
        "4P params + 4P/d grads + 8P/d Adam (ZeRO-2)",
        "4P/d params + 4P/d grads + 8P/d Adam (ZeRO-3; between steps: during one, the"
        " stage's whole 4P params and 4P grads as well)"};
    static const char *const mixed[4] = {
        "2P params + 4P grads + 12P masters and Adam (nothing sharded)",
        "2P params + 4P grads + 12P/d masters and Adam (ZeRO-1)",
        "2P params + 4P/d grads + 12P/d masters and Adam (ZeRO-2)",
        "2P/d params + 4P/d grads + 12P/d masters and Adam (ZeRO-3; between steps: during"
        " one, the stage's whole 2P params and 4P grads as well)"};
    /* --grad-dtype bf16|fp16: held in 16 bits, summed over a step's micro-batches in
     * an fp32 vector that lives from backward to the reduction */
    static const char *const grads16[4] = {
        "2P params + 2P grads + 12P masters and Adam (nothing sharded; during a step 4P"
        " fp32 sums as well)",
        "2P params + 2P grads + 12P/d masters and Adam (ZeRO-1; during a step 4P fp32 sums"
        " as well)",
        "2P params + 2P/d grads + 12P/d masters and Adam (ZeRO-2; during a step 4P fp32"
        " sums as well)",
        "2P/d params + 2P/d grads + 12P/d masters and Adam (ZeRO-3; between steps: during"
        " one, the stage's whole 2P params and 4P fp32 sums as well)"};
    const char *const *rows = p == PRECISION_FP32 ? fp32 : g == PRECISION_FP32 ? mixed : grads16;
    return rows[zero >= 0 && zero <= 3 ? zero : 0];
}

static void print_memory(const mesh_extra *o, int world, precision p,
                         precision grad_precision) {
    char a[32], b[32], c[32], d[32], e[32], f[32], g[32];
    printf("\nModel state per rank (bytes held, measured | as stored: %s, P the rank's stage"
           " slice, d = %d; a piece is exact to the element)\n",
           state_formula(o->shape.dp > 1 ? o->opts.zero_stage : 0, p, grad_precision),
           o->shape.dp);
    printf("  %-5s %-9s %10s %10s %10s | %10s %10s %10s %12s\n", "rank", "(tp pp dp)", "params",
           "grads", "optimizer", "params", "grads", "optimizer", "activations");
    for (int w = 0; w < world; w++) {
        if (world > 16 && w == 8) {
            printf("  ...\n");
            w = world - 2;
            continue;
        }
        const mesh_rank_traffic *t = &o->ranks[w];
        const mesh_coord c0 = mesh_coord_of(&o->shape, w);
        printf("  %-5d (%d %d %d)   %10s %10s %10s | %10s %10s %10s %12s\n", w, c0.tp, c0.pp,
               c0.dp, report_bytes(t->state[0], a), report_bytes(t->state[1], b),
               report_bytes(t->state[2], c), report_bytes(t->state_formula[0], d),
               report_bytes(t->state_formula[1], e), report_bytes(t->state_formula[2], f),
               report_bytes(t->activations, g));
    }
    printf("  (model states shrink to about 1/(t x p) of the model's 16 bytes per parameter,"
           " and with ZeRO by d more; the first and last stages also hold the tied"
           " embedding)\n");
}

/* With more rank threads than cores, a rank waiting in a collective is often waiting
 * for its partner to get a core: comm % counts that wait too. */
static void print_comm_note(int world) {
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (launch_mpi_world_size() > 0 || cores <= 0 || world <= cores) return;
    printf("comm %%: the share of a step a rank waits in collectives. Here %d ranks share %ld"
           " cores, so that wait includes\nwaiting for a partner to get a core: most of a step"
           " shows as communication, however few bytes move (one rank a core: the wire alone)\n",
           world, cores);
}

static char *run_json(const mesh_extra *o, int world) {
    double largest[PIPELINE_GROUP_KINDS] = {0}, formula[PIPELINE_GROUP_KINDS] = {0};
    for (int w = 0; w < world; w++)
        for (int k = 0; k < PIPELINE_GROUP_KINDS; k++)
            if (o->ranks[w].bytes[k] >= largest[k])
                largest[k] = o->ranks[w].bytes[k], formula[k] = o->ranks[w].formula[k];
    char *s = malloc(1024);
    snprintf(s, 1024, "\"mesh\": {\"tp\": %d, \"pp\": %d, \"dp\": %d}, \"schedule\": \"%s\", "
             "\"micro\": %d, \"virtual\": %d, \"zero\": %d, \"bytes_per_group_kind\": {\"tp\": "
             "%.0f, \"pp\": %.0f, \"dp\": %.0f, \"embedding\": %.0f}, \"bytes_formula_per_group_"
             "kind\": {\"tp\": %.0f, \"pp\": %.0f, \"dp\": %.0f, \"embedding\": %.0f}, "
             "\"worst_bytes_error\": %g", o->shape.tp, o->shape.pp, o->shape.dp,
             pp_schedule_name(o->opts.schedule), o->opts.micro, o->opts.chunks,
             o->opts.zero_stage, largest[0], largest[1], largest[2], largest[3], formula[0],
             formula[1], formula[2], formula[3], o->worst_bytes_error);
    return s;
}

static int train(chapter_args *a, int world) {
    const run_config *cfg = &a->cfg;
    dataset *data = dataset_from_config(cfg);
    const int root = process_hosts_rank0();
    baseline_run *baseline = NULL;
    if (root) {
        char title[200], zero_name[40] = "";
        if (a->zero) snprintf(zero_name, sizeof zero_name, ", ZeRO-%d across dp", a->zero);
        snprintf(title, sizeof title, "Chapter 5: 3D parallelism, tp %d x pp %d x dp %d (%s,"
                 " %d micro-batches%s) against single-device training", a->shape.tp,
                 a->shape.pp, a->shape.dp, pp_schedule_name(a->schedule), a->micro,
                 zero_name);
        report_header(cfg, title, world, 1);
        if (!cfg->json) print_mesh(a->shape);
        baseline = baseline_reference(cfg, data);
    }
    pipeline_options opts = {.schedule = a->schedule, .micro = a->micro,
                             .chunks = a->chunks, .zero_stage = a->zero};
    mesh_extra x;
    strategy_outcome o = {.extra = &x};
    int status = mesh_launch(cfg, data, a->shape, &opts, &o);
    if (root && status == 0) {
        strategy_outcome_compare(&o, baseline);
        run_result rows[2] = {baseline->result, o.result};
        char *extra = run_json(&x, world);
        rows[1].json_extra = extra;
        const run_tolerances bounds = mesh_run_tolerances(cfg, a->shape, NULL, baseline);
        const double worst = run_worst_fraction_of(&o.result, bounds);
        if (cfg->json) {
            report_json(cfg, "05-3d", world, launch_backend_name(&cfg->comm, world), rows, 2,
                        NULL);
        } else {
            report_table(cfg, rows, 2);
            print_comm_note(world);
            print_collectives(&x, world, cfg);
            print_memory(&x, world, cfg->precision, cfg->grad_precision);
            printf("\n%s: 3D against the baseline (%s tolerances: gradients of step 1 %.0e,"
                   " loss %.0e, parameters %.0e): %.0f%% of the tolerance at worst; the tied"
                   " embedding's two copies differ by %.1e\n", worst <= 1 ? "OK" : "FAILED",
                   precision_name(cfg->precision), bounds.grads, bounds.loss, bounds.params,
                   100 * worst, x.tied_drift);
        }
        if (worst > 1) status = 1;
        free(extra);
    }
    strategy_outcome_free(&o);
    mesh_extra_free(&x);
    baseline_free(baseline);
    dataset_free(data);
    return status;
}

/* What --mesh-only and --examples leave aside (with the shared cli_training_flags): they
 * lay out meshes and train nothing. */
static const char *const training_flags[] = {"schedule", "micro", "virtual", "zero", NULL};
static const char *const mesh_flags[] = {"mesh-only", "world", "tp", "pp", "dp", "json", NULL};

/* Whether --name is on the command line, before cli_parse: the arithmetic modes keep no
 * checkpoint, and --save must be refused before it creates its directory. */
static int in_argv(int argc, char **argv, const char *name) {
    for (int i = 1; i < argc; i++)
        if (strncmp(argv[i], "--", 2) == 0 && strcmp(argv[i] + 2, name) == 0) return 1;
    return 0;
}

static void refuse_ignored_flags(const chapter_args *a) {
    if (a->examples) {
        const char *why = "it checks the course's meshes by arithmetic and trains nothing";
        cli_refuse_in_mode("--examples", cli_training_flags, why);
        cli_refuse_in_mode("--examples", training_flags, why);
        cli_refuse_in_mode("--examples", mesh_flags, "its meshes are the course's; for one of"
                           " your own, with JSON: --mesh-only --world N --tp T --pp P --json");
    } else if (a->mesh_only) {
        const char *why = "it lays out the mesh and trains nothing";
        cli_refuse_in_mode("--mesh-only", cli_training_flags, why);
        cli_refuse_in_mode("--mesh-only", training_flags, why);
    }
}

int main(int argc, char **argv) {
    chapter_args a = {.cfg = run_config_default(), .schedule = PP_1F1B, .micro = 4,
                      .chunks = 2};
    const char *schedule_choices[PP_NSCHEDULES + 2];
    pp_schedule_choices(schedule_choices, NULL);
    const cli_option options[] = {
        {"tp", OPT_INT, &a.shape.tp, "tensor-parallel size (ranks of one TP group)", NULL, 1},
        {"pp", OPT_INT, &a.shape.pp, "pipeline stages", NULL, 1},
        {"dp", OPT_INT, &a.shape.dp, "data-parallel replicas", NULL, 1},
        {"schedule", OPT_CHOICE, &a.schedule, "pipeline schedule (chapter 4's)",
         schedule_choices, 0},
        {"micro", OPT_INT, &a.micro, "micro-batches per step and replica", NULL, 1},
        {"virtual", OPT_INT, &a.chunks, "model chunks per rank (interleaved)", NULL, 2},
        {"zero", OPT_INT, &a.zero, "ZeRO across the data-parallel group: 1 Adam sharded, 2"
         " gradients too, 3 parameters too (FSDP, gathered once per step)", NULL, 0},
        {"mesh-only", OPT_FLAG, &a.mesh_only, "lay out and check the mesh of --world ranks;"
         " no training", NULL, 0},
        {"world", OPT_INT, &a.world, "ranks for --mesh-only (up to 1048576)", NULL, 1},
        {"examples", OPT_FLAG, &a.examples, "the course text's meshes worked out", NULL, 0},
        {0},
    };
    if (in_argv(argc, argv, "examples") || in_argv(argc, argv, "mesh-only"))
        a.cfg.no_checkpoints = "--mesh-only and --examples train nothing, so there is nothing"
                               " to save or resume (leave them out to train)";
    cli_parse(argc, argv, &a.cfg, options, argv[0],
              "3D parallelism: TP x PP x DP on one device mesh, against single-device"
              " training; the course's meshes checked by arithmetic.");
    refuse_ignored_flags(&a);
    if (a.zero > 3) cli_fail("--zero %d: ZeRO has stages 0-3 (1 Adam, 2 + gradients, 3 +"
                             " parameters sharded over dp)", a.zero);
    if (a.examples) {
        if (process_hosts_rank0()) print_examples();
        return 0;
    }
    if (a.world && !a.mesh_only) cli_fail("--world %d belongs to --mesh-only", a.world);
    if (a.mesh_only) {
        if (!a.world) cli_fail("--mesh-only needs --world N (e.g. --world 1024 --tp 8 --pp 16)");
        if (a.world > 1 << 20) cli_fail("--world %d: at most 1048576 ranks", a.world);
        complete_mesh(&a, a.world);
        check_or_exit(&a, a.world);
        if (a.cfg.json && a.world > 4096)
            cli_fail("--json lists every rank: at most --world 4096 (without --json any size)");
        return process_hosts_rank0() ? mesh_only(a.shape, a.cfg.json) : 0;
    }
    const int mpi = launch_mpi_world_size();
    const int world = mpi > 0 ? mpi : a.cfg.comm.ranks;
    complete_mesh(&a, world);
    check_or_exit(&a, world);
    fits_check_or_exit(&a.cfg, 1.0 / (a.shape.tp * a.shape.pp));   /* a rank: its slice */
    return train(&a, world);
}
