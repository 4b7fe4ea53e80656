/* Command-line flags shared by every program, plus a chapter's own.
 *
 * Bad input never reaches a rank: cli_parse prints one line naming the flag, the
 * value and what would be valid, and exits with status 2. */
#ifndef CLI_H
#define CLI_H
#include <stdint.h>

#include "comm.h"
#include "model.h"
#include "ops.h"

typedef struct {
    gpt_config model;
    int batch;            /* global batch, in sequences of ctx tokens */
    int steps;
    uint64_t seed;
    adamw_config adamw;
    const char *data_path;   /* NULL: built-in corpus */
    int json;             /* --json: one JSON object on stdout, no table */
    int quiet;            /* --quiet: no per-step lines */
    int profile;          /* --profile: where each step's time goes, op by op */
    comm_options comm;    /* ranks, allreduce, link, link-scale, comm-timeout, trace,
                             device (--device, resolved: never auto after cli_parse)
                             and tf32 (--tf32) */
    /* checkpoints (checkpoint.h): NULL / 0 when not asked for */
    const char *save_dir;     /* --save DIR: at the end, and every save_every steps */
    int save_every;
    const char *resume_dir;   /* --resume DIR: checked before any rank starts */
    int save_test_crash;      /* test hook: a save stops before its Nth step (0: never) */
    const char *no_checkpoints;   /* set before cli_parse by a program that keeps none:
                                     why (then --save and --resume are refused) */
    /* Set before cli_parse by a program that does not train (a planner): the shared
     * flags it does not use (NULL-terminated) and why. They are left out of --help and
     * refused in one line when given. */
    const char *const *unused_flags;
    const char *unused_why;
} run_config;

typedef enum { OPT_INT, OPT_FLOAT, OPT_STRING, OPT_FLAG, OPT_CHOICE } cli_type;

/* A chapter's own flag. For OPT_CHOICE, target is an int receiving the index of the
 * value in choices (a NULL-terminated list). Integers must be >= min_value. */
typedef struct {
    const char *name;     /* without the dashes */
    cli_type type;
    void *target;
    const char *help;
    const char *const *choices;
    double min_value;
} cli_option;

/* Defaults: layers 4, heads 4, dim 128, ctx 64, batch 8, vocab 256, steps 10,
 * seed 1234, lr 1e-3 with 10 warm-up steps, betas 0.9/0.95, eps 1e-8, weight decay
 * 0.01. */
run_config run_config_default(void);

/* Parses argv into cfg and the extra options (extra may be NULL; ends with a zeroed
 * entry). --help prints usage and exits 0. Exits 2 on any bad input. */
void cli_parse(int argc, char **argv, run_config *cfg, const cli_option *extra,
               const char *program, const char *description);

/* Whether --name was on the command line (after cli_parse). */
int cli_given(const char *name);

/* A mode that ignores some flags refuses them: each of `flags` (NULL-terminated, names
 * without dashes) that was given is one line "--flag does nothing with <mode> (why)"
 * and exit 2. */
void cli_refuse_in_mode(const char *mode, const char *const *flags, const char *why);

/* --flag's value must be at most `most` (why: what the bound is), else cli_fail: for
 * values whose results would overflow or whose waits would never end. */
void cli_check_at_most(const char *flag, double value, double most, const char *why);

/* The file an output flag names (--trace, --svg) can be written: a clear line and exit
 * 2 now, not a lost result after training. Leaves no file behind that was not there. */
void check_writable(const char *flag, const char *path);

/* One error line "<program>: error: ..." and exit status 2. */
_Noreturn void cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
