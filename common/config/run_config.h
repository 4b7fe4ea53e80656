/* What one training run is: the model, the batch and steps, the optimizer, the data,
 * what to print, the ranks and their wire, and its checkpoints. Filled by the command
 * line (cli.h) or by a test, and read by training, checkpoints and reports alike. */
#ifndef RUN_CONFIG_H
#define RUN_CONFIG_H
#include <stdint.h>

#include "comm.h"
#include "fp8_scaling.h"
#include "model.h"
#include "ops.h"

typedef struct {
    gpt_config model;
    int batch;            /* global batch, in sequences of ctx tokens */
    int steps;
    uint64_t seed;
    uint64_t init_seed;   /* the baseline's initial weights from this seed instead (0: seed's);
                             the batches stay seed's: chapter 8's run-to-run spread */
    adamw_config adamw;
    const char *data_path;   /* NULL: built-in corpus */
    int json;             /* --json: one JSON object on stdout, no table */
    int quiet;            /* --quiet: no per-step lines */
    int profile;          /* --profile: where each step's time goes, op by op */
    precision precision;  /* --precision: what forward and backward compute in (fp32;
                             bf16 / fp16 with fp32 master weights: ops_mixed.h) */
    const char *fp32_only;   /* set before cli_parse by a program (or mode) that trains
                                in fp32 alone: why (then --precision bf16|fp16 is
                                refused with it) */
    /* --precision fp8 (fp8_linear.h): precision is then bf16 and fp8 is 1, the linears'
     * forward products FP8 under fp8_recipe (--fp8-recipe, default blockwise) */
    int fp8;
    fp8_recipe fp8_recipe;
    int fp8_format;   /* fp8_linear.h's fp8_training_format: e4m3 (0) or hybrid (--fp8-format) */
    int fp8_amax_history, fp8_margin;   /* delayed: --fp8-amax-history (16), --fp8-margin (0) */
    int fp8_training;   /* set before cli_parse by a program that trains in FP8 (else
                           --precision fp8 is refused) */
    precision grad_precision;   /* --grad-dtype: the parameter gradients held and reduced
                                   (fp32, the default; or the run's 16-bit precision) */
    const char *fp32_grads_only;   /* set before cli_parse by a program that keeps fp32
                                      gradients alone: why (then --grad-dtype bf16|fp16
                                      is refused with it) */
    /* fp16's dynamic loss scale (loss_scale.h): on with --precision fp16 unless
     * --no-loss-scale; its start (--loss-scale) and the clean steps before it doubles
     * (--loss-scale-window); 0: the defaults */
    int no_loss_scale;
    double loss_scale_init;
    int loss_scale_window;
    float *loss_scale_trace;   /* when set ([steps], the caller's): world rank 0's loop
                                  writes the loss scale each step's backward used */
    int test_overflow_step;   /* test hook: world rank 0's gradient overflows at step K */
    int test_16bit_masters;   /* negative control (baseline): master weights rounded to
                                 the compute precision after every update */
    comm_options comm;    /* ranks, allreduce, link, link-scale, comm-timeout, trace,
                             device (--device, resolved: never auto after cli_parse)
                             and tf32 (--tf32) */
    /* checkpoints (checkpoint.h): NULL / 0 when not asked for */
    const char *save_dir;     /* --save DIR: at the end, and every save_every steps */
    int save_every;
    const char *resume_dir;   /* --resume DIR: checked before any rank starts, then the
                                 checkpoint it named at the start */
    const char *resume_base;  /* --resume DIR when DIR holds checkpoints (not one itself):
                                 where each strategy finds its own (checkpoint.h) */
    int save_test_crash;      /* test hook: a save stops before its Nth step (0: never) */
    const char *no_checkpoints;   /* set before cli_parse by a program that keeps none:
                                     why (then --save and --resume are refused) */
    /* Set before cli_parse by a program that does not train (a planner): the shared
     * flags it does not use (NULL-terminated) and why. They are left out of --help and
     * refused in one line when given. */
    const char *const *unused_flags;
    const char *unused_why;
    /* shared flags a program refuses in a line of its own (NULL-terminated): --help
     * leaves them out too */
    const char *const *refused_flags;
    /* Restarts after a failure (restart.h): ./run starts the job again from --save's
     * latest checkpoint, up to max_restarts times; the rest is what ./run tells each
     * attempt and the test hooks that make a failure. */
    struct {
        int max_restarts;      /* --max-restarts K (0 and not given: no restarts) */
        int on;                /* --max-restarts was given (even as 0) */
        int from_run;          /* --restart-attempt was given: ./run started this attempt */
        int elastic;           /* --elastic: go on with the surviving ranks */
        int attempt;           /* --restart-attempt: restarts before this attempt (./run) */
        const char *record;    /* --restart-record: the earlier attempts' costs (./run) */
        int fail_step;         /* test hook: a rank fails as step K starts (0: never) */
        int fail_rank;         /* ... that world rank */
        const char *fail_strategy;   /* ... in this strategy's loop (NULL: the first) */
        int fail_how;          /* SIGKILL of its process, comm_abort, SIGSTOP */
        int fail_attempts;     /* ... on attempts 0 .. N-1 (default 1: the first) */
        int fail_gone;         /* ... and it does not come back (--elastic's test) */
        int resume_skew;       /* negative control: a resume starts K steps late */
        const char *newest_saved;   /* a restart: the checkpoint --save DIR/latest named
                                       as it began, if not at --steps (NULL: none) */
        const char *saves_before;   /* --restart-saves-before: the checkpoints --save DIR
                                       held as the job began, another job's (./run) */
    } restart;
} run_config;

/* Defaults: layers 4, heads 4, dim 128, ctx 64, batch 8, vocab 256, steps 10,
 * seed 1234, lr 1e-3 with 10 warm-up steps, betas 0.9/0.95, eps 1e-8, weight decay
 * 0.01. */
run_config run_config_default(void);

#endif
