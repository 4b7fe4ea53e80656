#include "cli.h"
#include "cli_tiers.h"
#include "fp8_linear.h"

#include "device.h"
#include "loss_scale.h"
#include "matmul_engine.h"
#include "op_profile.h"
#include "restart.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A flag given twice is refused: taking the last value silently would let a flag added
 * at the end of a long command line (or by a script) override one the user can no
 * longer see. */
static void note_given(const cli_option *o, const char *text) {
    const char *name = o->name;
    if (cli_given(name) && o->type == OPT_FLAG) cli_fail("--%s given twice: give it once", name);
    if (cli_given(name))
        cli_fail("--%s given twice (%s, then %s): give it once", name, cli_given_text(name),
                 text);
    cli_given_add(name, text);
}

void cli_refuse_in_mode(const char *mode, const char *const *flags, const char *why) {
    for (int i = 0; flags[i]; i++)
        if (cli_given(flags[i]))
            cli_fail("--%s does nothing with %s (%s)", flags[i], mode, why);
}

const char *const cli_training_flags[] = {
    "steps", "layers", "heads", "dim", "ctx", "batch", "vocab", "seed", "lr", "weight-decay",
    "warmup", "preset", "data", "quiet", "profile", "device", "tf32", "allreduce", "link",
    "link-scale", "send-mode", "comm-timeout", "trace", "save-every", "grad-dtype",
    "link-intra", "link-inter", "ranks-per-node", NULL};

static int in_list(const char *name, const char *const *list) {
    for (int i = 0; list && list[i]; i++)
        if (strcmp(list[i], name) == 0) return 1;
    return 0;
}

/* ---- the shared flags ------------------------------------------------------------ */

static const char *const allreduce_names[] = {"ring", "naive", "doubling", NULL};
/* --link's values, the names comm_link_spec gives (NULL-terminated, for OPT_CHOICE). */
static const char *const *link_names(void) {
    static const char *names[COMM_NLINKS + 1];
    for (int i = 0; i < COMM_NLINKS; i++) names[i] = comm_link_spec((comm_link)i).name;
    return names;
}

static const char *const device_names[] = {"auto", "cpu", "cuda", NULL};
static const char *const send_mode_names[] = {"buffered", "rendezvous", NULL};
/* --precision's values, in precision.h's order */
static const char *const precision_names[] = {"fp32", "bf16", "fp16", "fp8", NULL};
static const char *const grad_precision_names[] = {"fp32", "bf16", "fp16", NULL};
#define PRECISION_FP8_CHOICE PRECISION_COUNT   /* --precision fp8: bf16 + FP8 linears */
/* --fp8-recipe's values, in fp8_scaling.h's order */
/* --fp8-format's values, in fp8_linear.h's order */
static const char *const fp8_format_names[] = {"e4m3", "hybrid", NULL};
static const char *const fp8_recipe_names[] = {"delayed", "tensorwise", "rowwise",
                                               "blockwise", NULL};

/* The loss scale's flags do something in fp16 alone (bf16 and fp32 keep fp32's exponent
 * range: nothing to scale). */
static void check_loss_scale_flags(const run_config *cfg) {
    const char *given = cfg->no_loss_scale           ? "--no-loss-scale"
                        : cfg->loss_scale_init > 0   ? "--loss-scale"
                        : cfg->loss_scale_window > 0 ? "--loss-scale-window"
                        : cfg->test_overflow_step > 0 ? "--test-overflow-step"
                                                      : NULL;
    if (given && cfg->precision != PRECISION_FP16)
        cli_fail("%s: only --precision fp16 takes a loss scale (this run computes in %s;"
                 " fp32 and bf16 have fp32's exponent range, nothing to scale)", given,
                 precision_name(cfg->precision));
    if (cfg->no_loss_scale && (cfg->loss_scale_init > 0 || cfg->loss_scale_window > 0))
        cli_fail("--no-loss-scale: leave out --loss-scale and --loss-scale-window with it");
    char why[512];
    const double backoff = loss_scale_defaults(cfg->precision).backoff_factor;
    const char *typed = cli_given_text("loss-scale");
    if (cfg->loss_scale_init > 0 &&
        !loss_scale_start_check(cfg->loss_scale_init, backoff, (double)cfg->batch * cfg->model.ctx,
                                cfg->steps, why, sizeof why))
        cli_fail("--loss-scale %s: %s", typed ? typed : "S", why);
}

/* --grad-dtype: fp32, or 16 bits in the precision the run computes in (bf16 compute
 * with fp16 gradients, or the reverse, would round each gradient into a format its
 * values never had). */
static void check_grad_dtype(const run_config *cfg) {
    const precision g = cfg->grad_precision;
    if (g == PRECISION_FP32) return;
    if (cfg->fp32_grads_only)
        cli_fail("--grad-dtype %s: %s", precision_name(g), cfg->fp32_grads_only);
    if (g != cfg->precision)
        cli_fail("--grad-dtype %s: 16-bit gradients take the precision the run computes in"
                 " (this run: --precision %s); valid: fp32%s%s", precision_name(g),
                 precision_name(cfg->precision), cfg->precision == PRECISION_FP32 ? "" : " or ",
                 cfg->precision == PRECISION_FP32 ? "" : precision_name(cfg->precision));
}

typedef struct {
    int allreduce, link, device, send_mode, precision, grad_precision, fp8_recipe, fp8_format;
    int matmul;
    int link_intra, link_inter, ranks_per_node;
    double lr, weight_decay, link_scale, timeout;
    const char *seed_text;
} shared_values;

/* --precision fp8 is a bf16 run with FP8 linears (fp8_linear.h), in the programs that
 * train so; --fp8-recipe does something with it alone. */
static void take_precision(run_config *cfg, const shared_values *sv) {
    const char *recipe = cli_given_text("fp8-recipe");
    cfg->fp8 = sv->precision == PRECISION_FP8_CHOICE;
    if (cfg->fp8 && !cfg->fp32_only && !cfg->fp8_training)
        cli_fail("--precision fp8: %s does not train in FP8 yet (the baseline, chapter"
                 " 1's --strategy ddp and chapter 2 do); valid here: fp32, bf16, fp16", cli_program_name());
    if (recipe && !cfg->fp8)
        cli_fail("--fp8-recipe %s: only --precision fp8 takes a recipe (this run computes in"
                 " %s)", recipe, precision_names[sv->precision]);
    cfg->precision = cfg->fp8 ? PRECISION_BF16 : (precision)sv->precision;
    cfg->fp8_recipe = (fp8_recipe)sv->fp8_recipe;
    const char *format = cli_given_text("fp8-format");
    if (format && !cfg->fp8)
        cli_fail("--fp8-format %s: only --precision fp8 takes an FP8 format (this run computes"
                 " in %s)", format, precision_names[sv->precision]);
    cfg->fp8_format = sv->fp8_format;
    static const char *const delayed_flags[] = {"fp8-amax-history", "fp8-margin", NULL};
    for (int i = 0; delayed_flags[i]; i++)
        if (cli_given(delayed_flags[i]) && (!cfg->fp8 || cfg->fp8_recipe != FP8_DELAYED))
            cli_fail("--%s %s: only --fp8-recipe delayed keeps an amax history (this run: %s)",
                     delayed_flags[i], cli_given_text(delayed_flags[i]),
                     cfg->fp8 ? fp8_recipe_names[cfg->fp8_recipe] : precision_names[sv->precision]);
}

static int table_size(const cli_option *t) {
    int n = 0;
    while (t && t[n].name) n++;
    return n;
}

static const char *const checkpoint_flags[] = {"save", "save-every", "resume",
                                               "max-restarts", "elastic", NULL};
static const char *const precision_flags[] = {"precision", "grad-dtype", "loss-scale",
                                              "loss-scale-window", "no-loss-scale",
                                              "fp8-recipe", "fp8-format", "fp8-amax-history",
                                              "fp8-margin", NULL};

static const char *const fp8_flags[] = {"fp8-recipe", "fp8-format", "fp8-amax-history",
                                        "fp8-margin", NULL};

/* A shared flag this program refuses whatever its value: --help does not list it. */
static int refused_by_program(const run_config *cfg, const char *name) {
    return in_list(name, cfg->unused_flags) || in_list(name, cfg->refused_flags) ||
           (cfg->no_checkpoints && in_list(name, checkpoint_flags)) ||
           (cfg->fp32_only && in_list(name, precision_flags)) ||
           (!cfg->fp8_training && in_list(name, fp8_flags)) ||
           (cfg->fp32_grads_only && strcmp(name, "grad-dtype") == 0);
}

/* A flag without help text is a test hook: accepted, never listed. */
static void print_usage(const cli_option *tables[2], const run_config *cfg,
                        const char *description) {
    printf("usage: ./run N [flags]   (or %s [flags] --ranks N)\n%s\n\nflags:\n",
           cli_program_name(), description ? description : "");
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < table_size(tables[k]); i++) {
            const cli_option *o = &tables[k][i];
            if (!o->help || (k == 0 && refused_by_program(cfg, o->name))) continue;
            char left[64];
            snprintf(left, sizeof left, "--%s%s", o->name,
                     o->type == OPT_FLAG ? "" : o->type == OPT_CHOICE ? " CHOICE" : " X");
            printf("  %-24s %s", left, o->help);
            if (o->choices) {
                printf(" (");
                for (int c = 0; o->choices[c]; c++) printf("%s%s", c ? "|" : "", o->choices[c]);
                printf(")");
            }
            printf("\n");
        }
    }
}

static void parse_value(const cli_option *o, const char *text) {
    char *end = NULL;
    errno = 0;
    switch (o->type) {
    case OPT_INT: {
        long v = strtol(text, &end, 10);
        const long most = 1000000000L;
        if (end == text || *end)
            cli_fail("--%s %s: not an integer (%s)", o->name, text, o->help);
        if (errno || v < (long)o->min_value || v > most)   /* errno: overflowed */
            cli_fail("--%s %s: must be an integer from %.0f to %ld", o->name, text,
                     o->min_value, most);
        *(int *)o->target = (int)v;
        break;
    }
    case OPT_FLOAT: {
        double v = strtod(text, &end);
        if (errno || end == text || *end || !isfinite(v))
            cli_fail("--%s %s: not a number (%s)", o->name, text, o->help);
        if (v < o->min_value)
            cli_fail("--%s %s: must be at least %g", o->name, text, o->min_value);
        *(double *)o->target = v;
        break;
    }
    case OPT_STRING:
        if (!*text) cli_fail("--%s: needs a value (%s)", o->name, o->help);
        *(const char **)o->target = text;
        break;
    case OPT_CHOICE:
        for (int c = 0; o->choices[c]; c++) {
            if (strcmp(o->choices[c], text) == 0) {
                *(int *)o->target = c;
                return;
            }
        }
        {
            char valid[256] = "";
            for (int c = 0; o->choices[c]; c++)
                snprintf(valid + strlen(valid), sizeof valid - strlen(valid), "%s%s",
                         c ? ", " : "", o->choices[c]);
            cli_fail("--%s %s: unknown value (valid: %s)", o->name, text, valid);
        }
    case OPT_FLAG:
        *(int *)o->target = 1;
        break;
    }
}

static void apply_preset(const char *name, run_config *cfg) {
    if (strcmp(name, "bench128") == 0 || strcmp(name, "bench256") == 0) {
        cfg->model = (gpt_config){.vocab = 256, .ctx = 64, .layers = 4, .heads = 4,
                                  .dim = strcmp(name, "bench128") == 0 ? 128 : 256};
        cfg->batch = 8;
    } else {
        cli_fail("--preset %s: unknown preset (valid: bench128, bench256)", name);
    }
}

/* A program's own flag named like a shared one would never be read (the shared one is
 * found first): the program's bug, caught on its first run. */
static void check_not_shadowed(const cli_option *shared, const cli_option *extra) {
    for (const cli_option *e = extra; e && e->name; e++)
        for (const cli_option *o = shared; o->name; o++)
            if (strcmp(e->name, o->name) == 0) {
                fprintf(stderr, "cli_parse: the program's --%s is every program's --%s too;"
                        " rename it\n", e->name, o->name);
                abort();
            }
}

/* Every flag of argv into its target. */
static void parse_flags(int argc, char **argv, run_config *cfg, const cli_option *tables[2],
                        const char *description) {
    const cli_option *shared = tables[0];
    check_not_shadowed(shared, tables[1]);
    /* A preset sets the model first, so flags after (or before) it can refine it. */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--preset") == 0 && i + 1 < argc) apply_preset(argv[i + 1], cfg);
        else if (strncmp(argv[i], "--preset=", 9) == 0) apply_preset(argv[i] + 9, cfg);
    }
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            print_usage(tables, cfg, description);
            exit(0);
        }
        if (strncmp(arg, "--", 2) != 0)
            cli_fail("unexpected argument '%s' (flags start with --; see --help)", arg);
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t name_len = eq ? (size_t)(eq - name) : strlen(name);
        const cli_option *found = NULL;
        for (int k = 0; k < 2 && !found; k++)
            for (int j = 0; j < table_size(tables[k]); j++)
                if (strlen(tables[k][j].name) == name_len &&
                    strncmp(tables[k][j].name, name, name_len) == 0)
                    found = &tables[k][j];
        if (!found) cli_fail("unknown flag '%.*s' (see --help)", (int)(name_len + 2), arg);
        if (found >= shared && found < shared + table_size(shared) &&
            in_list(found->name, cfg->unused_flags))
            cli_fail("--%s does nothing in %s (%s)", found->name, cli_program_name(), cfg->unused_why);
        if (found->type == OPT_FLAG) {
            if (eq) cli_fail("--%s takes no value", found->name);
            note_given(found, "");
            parse_value(found, "");
            continue;
        }
        const char *value = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!value) cli_fail("--%s: missing value (%s)", found->name, found->help);
        note_given(found, value);
        parse_value(found, value);
    }
}

/* --matmul: the engine of the fp32 linears on the CPU, for the whole process (ranks
 * start after this). A run whose linears are not fp32 products on the CPU refuses it. */
static void take_matmul_engine(const run_config *cfg, const shared_values *sv) {
    const char *given = cli_given_text("matmul");
    if (given && cfg->precision != PRECISION_FP32)
        cli_fail("--matmul %s: chooses the engine of fp32 products; this run computes its"
                 " linears in %s (oneDNN's 16-bit matmul); drop --matmul or use --precision"
                 " fp32", given, cfg->fp8 ? "fp8" : precision_name(cfg->precision));
    if (given && cfg->comm.device == DEVICE_CUDA)
        cli_fail("--matmul %s: chooses a CPU library; this run computes on the GPU (cuBLAS);"
                 " add --device cpu", given);
    matmul_engine_set(given ? (matmul_engine)sv->matmul : matmul_engine_default());
    matmul_engine_set_chosen(given != NULL);
}

/* The shared values, checked, into cfg. */
static void apply_shared_values(run_config *cfg, const shared_values *sv) {
    if (sv->seed_text) {
        /* Digits only: strtoull would skip blanks and wrap " -1" round to 2^64 - 1. */
        char *end = NULL;
        errno = 0;
        unsigned long long seed = strtoull(sv->seed_text, &end, 10);
        if (errno || !isdigit((unsigned char)sv->seed_text[0]) || *end)
            cli_fail("--seed %s: must be an integer from 0 to %llu", sv->seed_text,
                     (unsigned long long)UINT64_MAX);
        cfg->seed = seed;
    }
    cli_check_at_most("ranks", cfg->comm.ranks, THREADS_MAX_RANKS,
                      "the threads backend's most; more ranks run under MPI=1");
    cli_check_at_most("comm-timeout", sv->timeout, COMM_TIMEOUT_MAX_SECONDS, "a week");
    cli_check_at_most("link-scale", sv->link_scale, LINK_SCALE_MAX,
                      "a message on ethernet then takes 0.3 s");
    cfg->adamw.lr = (float)sv->lr;
    cfg->adamw.weight_decay = (float)sv->weight_decay;
    cfg->comm.allreduce = (comm_allreduce_algo)sv->allreduce;
    cfg->comm.link = (comm_link)sv->link;
    cfg->comm.link_scale = sv->link_scale;
    cfg->comm.send_mode = (comm_send_mode)sv->send_mode;
    cfg->comm.timeout_seconds = sv->timeout;
    cli_take_tiers(cfg, sv->link_intra, sv->link_inter, sv->ranks_per_node);
    take_precision(cfg, sv);
    if (cfg->precision != PRECISION_FP32 && cfg->fp32_only)
        cli_fail("--precision %s: %s", precision_names[sv->precision], cfg->fp32_only);
    cfg->grad_precision = (precision)sv->grad_precision;
    check_grad_dtype(cfg);
    check_loss_scale_flags(cfg);
    /* The device is settled here, before any rank starts: auto becomes what this machine
     * has, and a GPU that is not there is one clear line. */
    const device_kind requested = sv->device == 1   ? DEVICE_CPU
                                  : sv->device == 2 ? DEVICE_CUDA
                                                   : DEVICE_AUTO;
    char why[256];
    if (device_check(requested, why, sizeof why)) cli_fail("%s", why);
    cfg->comm.device = device_resolve(requested);
    take_matmul_engine(cfg, sv);
    if (cfg->fp8 && cfg->comm.device == DEVICE_CUDA)
        cli_fail("--precision fp8: FP8 linears are emulated on the CPU only so far (bf16 and"
                 " fp16 run on the GPU); add --device cpu");
}

/* RUN_BLAS_PROBE=1: print the kernels OpenBLAS picked for this CPU and stop, before
 * anything else (tools/blas-kernel.sh asks it of the program it is about to run). */
static void answer_blas_probe(void) {
    if (!getenv("RUN_BLAS_PROBE")) return;
    printf("%s\n", op_profile_blas_kernel());
    exit(0);
}

/* Under Open MPI the ranks are mpirun's processes (its -np), whatever --ranks says. */
static void take_mpi_ranks(run_config *cfg) {
    const int mpi_ranks = launch_mpi_world_size();
    if (mpi_ranks <= 0) return;
    if (cli_given("ranks"))
        cli_fail("--ranks %s does nothing under Open MPI: the ranks are mpirun's %d processes "
                 "(./run N starts N; leave --ranks out)", cli_given_text("ranks"), mpi_ranks);
    cfg->comm.ranks = mpi_ranks;
}


/* --max-restarts and the flags ./run gives with it (restart.h): refused in one line, or
 * taken. */
static void check_restart_flags(run_config *cfg) {
    char why[512];
    if (restart_flags_check(cfg, cli_program_name(), why, sizeof why)) cli_fail("%s", why);
    restart_take_flags(cfg);
}

static void check_model_and_trace(const run_config *cfg) {
    char err[256];
    if (!gpt_config_check(&cfg->model, 1, err, sizeof err)) cli_fail("%s", err);
    if (cfg->comm.trace_path) check_writable("trace", cfg->comm.trace_path);
}

/* The recipe on this many ranks, once they are known; then the process's linears take
 * it, before any rank starts. */
static void check_fp8_recipe(const run_config *cfg) {
    if (!cfg->fp8) return;
    const char *why = fp8_linear_recipe_check(cfg->fp8_recipe, cfg->comm.ranks);
    if (why)
        cli_fail("--fp8-recipe %s: %s", fp8_recipe_names[cfg->fp8_recipe], why);
    if ((why = fp8_linear_delayed(cfg->fp8_amax_history, cfg->fp8_margin)))
        cli_fail("--fp8-amax-history %d --fp8-margin %d: %s", cfg->fp8_amax_history,
                 cfg->fp8_margin, why);
    fp8_linear_format((fp8_training_format)cfg->fp8_format);
    fp8_linear_use(&cfg->fp8_recipe);
}

/* The ranks (mpirun's under Open MPI), and what must fit them: the nodes of a two-tier
 * network, the FP8 recipe. */
static void take_restart(run_config *cfg) {
    cfg->restart.on = cli_given("max-restarts");
    cfg->restart.from_run = cli_given("restart-attempt");
    checkpoint_cli_check(cfg);   /* a restart's checks differ (restart_is_retry) */
    check_restart_flags(cfg);
}

static void take_ranks(run_config *cfg) {
    take_mpi_ranks(cfg);
    cli_check_tiers(cfg);
    check_fp8_recipe(cfg);
}

void cli_parse(int argc, char **argv, run_config *cfg, const cli_option *extra,
               const char *program, const char *description) {
    answer_blas_probe();
    cli_set_program_name(program);
    cli_given_reset();   /* a process may parse more than one command line (the tests) */
    shared_values sv = {.allreduce = cfg->comm.allreduce, .link = cfg->comm.link,
                        .send_mode = cfg->comm.send_mode, .precision = cfg->precision,
                        .grad_precision = cfg->grad_precision, .lr = cfg->adamw.lr,
                        .fp8_recipe = cfg->fp8_recipe, .fp8_format = cfg->fp8_format, .weight_decay = cfg->adamw.weight_decay,
                        .link_scale = cfg->comm.link_scale, .timeout = cfg->comm.timeout_seconds};
    const char *preset = NULL;   /* applied ahead of the other flags (parse_flags) */
    const cli_option shared[] = {
        {"ranks", OPT_INT, &cfg->comm.ranks, "number of ranks (./run N sets it)", NULL, 1},
        {"steps", OPT_INT, &cfg->steps, "training steps", NULL, 1},
        {"layers", OPT_INT, &cfg->model.layers, "transformer blocks", NULL, 1},
        {"heads", OPT_INT, &cfg->model.heads, "attention heads (must divide --dim)", NULL, 1},
        {"dim", OPT_INT, &cfg->model.dim, "model width", NULL, 1},
        {"ctx", OPT_INT, &cfg->model.ctx, "sequence length in tokens", NULL, 1},
        {"batch", OPT_INT, &cfg->batch, "global batch in sequences", NULL, 1},
        {"vocab", OPT_INT, &cfg->model.vocab, "vocabulary size (>= 256: byte tokens)", NULL, 256},
        {"seed", OPT_STRING, &sv.seed_text, "seed for initialisation and data", NULL, 0},
        {"lr", OPT_FLOAT, &sv.lr, "AdamW learning rate", NULL, 0},
        {"weight-decay", OPT_FLOAT, &sv.weight_decay, "AdamW decoupled weight decay", NULL, 0},
        {"warmup", OPT_INT, &cfg->adamw.warmup_steps, "steps of linear learning-rate warm-up", NULL, 0},
        {"preset", OPT_STRING, &preset, "bench128 or bench256: 4 layers, 4 heads, dim 128 or"
         " 256, ctx 64, batch 8 (docs/design.md)", NULL, 0},
        {"data", OPT_STRING, &cfg->data_path, "train on the bytes of this file", NULL, 0},
        {"json", OPT_FLAG, &cfg->json, "print one JSON object instead of tables", NULL, 0},
        {"quiet", OPT_FLAG, &cfg->quiet, "no per-step progress lines", NULL, 0},
        {"profile", OPT_FLAG, &cfg->profile, "time per op kind against the sgemm floor, after each run", NULL, 0},
        {"device", OPT_CHOICE, &sv.device, "where ranks compute", device_names, 0},
        {"tf32", OPT_FLAG, &cfg->comm.tf32, "let cuBLAS use TF32 (GPU)", NULL, 0},
        {"precision", OPT_CHOICE, &sv.precision, "compute in fp32, or in bf16 / fp16 with fp32"
         " master weights (mixed precision)", precision_names, 0},
        {"matmul", OPT_CHOICE, &sv.matmul, "the fp32 linears' products on the CPU: OpenBLAS or oneDNN with packed weights (default: the build's)", matmul_engine_names, 0},
        {"fp8-recipe", OPT_CHOICE, &sv.fp8_recipe, "fp8: how the linears' inputs are scaled to E4M3 (default blockwise)", fp8_recipe_names, 0},
        {"fp8-format", OPT_CHOICE, &sv.fp8_format, "fp8: e4m3 (forward products in FP8, backward bf16) or hybrid (backward too: gradients E5M2, W and X E4M3)", fp8_format_names, 0},
        {"fp8-amax-history", OPT_INT, &cfg->fp8_amax_history, "fp8 delayed: forwards of amax history per tensor (default 16)", NULL, 1},
        {"fp8-margin", OPT_INT, &cfg->fp8_margin, "fp8 delayed: scales 2^M smaller, headroom above the history (default 0)", NULL, 0},
        {"grad-dtype", OPT_CHOICE, &sv.grad_precision, "the gradients held and reduced: fp32, or 16 bits in --precision's type", grad_precision_names, 0},
        {"loss-scale", OPT_FLOAT, &cfg->loss_scale_init, "fp16: the dynamic loss scale's start"
         " (default 65536)", NULL, 1},
        {"loss-scale-window", OPT_INT, &cfg->loss_scale_window, "fp16: clean steps before the"
         " loss scale doubles (default 1000)", NULL, 1},
        {"no-loss-scale", OPT_FLAG, &cfg->no_loss_scale, "fp16 without a loss scale (to see"
         " small gradients flush to zero)", NULL, 0},
        {"test-overflow-step", OPT_INT, &cfg->test_overflow_step, NULL, NULL, 1},   /* test hook: rank 0's gradient overflows at step K */
        {"allreduce", OPT_CHOICE, &sv.allreduce, "all-reduce algorithm (threads)", allreduce_names, 0},
        {"link", OPT_CHOICE, &sv.link, "modelled wire between ranks (threads)", link_names(), 0},
        {"link-scale", OPT_FLOAT, &sv.link_scale, "slow every link down by this factor", NULL, 1e-9},
        {"link-intra", OPT_CHOICE, &sv.link_intra, "two tiers: the wire inside a node (threads)", link_names(), 0},
        {"link-inter", OPT_CHOICE, &sv.link_inter, "two tiers: the wire between nodes (threads)", link_names(), 0},
        {"ranks-per-node", OPT_INT, &sv.ranks_per_node, "two tiers: ranks of a node", NULL, 1},
        {"send-mode", OPT_CHOICE, &sv.send_mode, "comm_send: copy and go, or wait for the receiver as NCCL (threads)", send_mode_names, 0},
        {"comm-timeout", OPT_FLOAT, &sv.timeout, "seconds before a stuck collective is reported", NULL, 0.001},
        {"trace", OPT_STRING, &cfg->comm.trace_path, "write a Chrome/Perfetto trace here", NULL, 0},
        {"save", OPT_STRING, &cfg->save_dir, "save a checkpoint into this directory at the end", NULL, 0},
        {"save-every", OPT_INT, &cfg->save_every, "with --save: also every K steps", NULL, 1},
        {"resume", OPT_STRING, &cfg->resume_dir, "continue from this checkpoint (or its latest)", NULL, 0},
        {"save-test-crash", OPT_INT, &cfg->save_test_crash, NULL, NULL, 1},   /* test hook: a save dies before its Nth step */
        {"max-restarts", OPT_INT, &cfg->restart.max_restarts, "with --save: after a failure, start again from the latest checkpoint, up to K times (./run)", NULL, 0},
        {"elastic", OPT_FLAG, &cfg->restart.elastic, "with --max-restarts: a rank that does not come back leaves the job on fewer ranks", NULL, 0},
        {"restart-attempt", OPT_INT, &cfg->restart.attempt, NULL, NULL, 0},   /* ./run: restarts so far */
        {"restart-record", OPT_STRING, &cfg->restart.record, NULL, NULL, 0},   /* ./run: the earlier attempts' costs */
        {"restart-saves-before", OPT_STRING, &cfg->restart.saves_before, NULL, NULL, 0},   /* ./run: another job's */
        {"test-fail-step", OPT_INT, &cfg->restart.fail_step, NULL, NULL, 1},   /* test hook: a rank fails as step K starts */
        {"test-fail-rank", OPT_INT, &cfg->restart.fail_rank, NULL, NULL, 0},
        {"test-fail-how", OPT_CHOICE, &cfg->restart.fail_how, NULL, restart_fail_hows, 0},
        {"test-fail-attempts", OPT_INT, &cfg->restart.fail_attempts, NULL, NULL, 1},
        {"test-fail-gone", OPT_FLAG, &cfg->restart.fail_gone, NULL, NULL, 0},
        {"test-fail-strategy", OPT_STRING, &cfg->restart.fail_strategy, NULL, NULL, 0},
        {"test-resume-skew", OPT_INT, &cfg->restart.resume_skew, NULL, NULL, 1},   /* negative control */
        {0},
    };
    const cli_option *tables[2] = {shared, extra};
    parse_flags(argc, argv, cfg, tables, description);
    apply_shared_values(cfg, &sv);
    check_model_and_trace(cfg);
    take_restart(cfg);
    take_ranks(cfg);
}
