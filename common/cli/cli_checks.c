/* The checks every program runs on its flags before any rank starts, for the things
 * the flags name: the data file and the checkpoint directories. */
#include "cli_checks.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "cli_error.h"
#include "cli_given.h"
#include "comm.h"
#include "ddp.h"
#include "restart.h"

dataset *dataset_from_config(const run_config *cfg) {
    if (!cfg->data_path) return dataset_builtin();
    char err[512];
    dataset *d = dataset_load(cfg->data_path, cfg->model.ctx, err, sizeof err);
    if (!d) cli_fail("%s", err);
    return d;
}

const char *device_cpu_only(run_config *cfg, const char *asked, const char *what,
                            char *why, size_t n) {
    if (cfg->comm.device != DEVICE_CUDA) return NULL;
    if (asked && strcmp(asked, "cuda") == 0) {
        snprintf(why, n, "--device cuda: %s host memory, so this runs on the CPU alone so"
                 " far: give --device cpu", what);
        return why;
    }
    cfg->comm.device = DEVICE_CPU;
    return NULL;
}

void cli_cpu_only(run_config *cfg, const char *what) {
    char why[256];
    if (device_cpu_only(cfg, cli_given_text("device"), what, why, sizeof why))
        cli_fail("%s", why);
}

void cli_check_batch(int batch, int ranks, int grad_accum) {
    char err[256];
    if (ddp_check_batch(batch, ranks, grad_accum, err, sizeof err)) return;
    cli_fail("%s", err);
}

/* Whether mkdir(dir) would succeed, without making it: its parent is there and may be
 * written (errno says why not). */
static int can_create(const char *dir) {
    if (errno != ENOENT) return 0;   /* stat's: a parent that is a file, a loop, ... */
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    while (slash && slash > parent && slash[1] == '\0') {   /* "a/b/" names a/b */
        *slash = '\0';
        slash = strrchr(parent, '/');
    }
    if (!slash) snprintf(parent, sizeof parent, ".");
    else if (slash == parent) parent[1] = '\0';   /* "/x": the root */
    else *slash = '\0';
    return access(parent, W_OK | X_OK) == 0;
}

/* A restart: each strategy's newest in --save DIR checked (one that had finished is at
 * --steps), and DIR/latest pinned as it is now when a strategy may still train from it
 * (resume_source.c: on fewer ranks, a strategy whose name follows its layout). */
static void check_restart_saves(run_config *cfg) {
    static char newest[4096];
    char err[1024], latest[4096];
    snprintf(latest, sizeof latest, "%s/latest", cfg->save_dir);
    int step = -1;
    if (access(latest, F_OK) != 0) {
        newest[0] = '\0';   /* nothing saved yet */
    } else if (!checkpoint_resolve(cfg->save_dir, newest, sizeof newest, err, sizeof err)) {
        cli_fail("%s", err);
    } else if (checkpoint_saved_before(cfg, newest)) {
        newest[0] = '\0';   /* another job's: nothing of this job's saved yet */
    } else {
        step = checkpoint_check_until(newest, cfg, cfg->steps, err, sizeof err);
        if (step < 0) cli_fail("%s", err);
    }
    if (checkpoint_check_own_latests(cfg->save_dir, cfg, cfg->steps, newest, 1, err,
                                     sizeof err) < 0)
        cli_fail("%s", err);
    if (step >= 0 && step < cfg->steps) cfg->restart.newest_saved = newest;
}

void checkpoint_cli_check(run_config *cfg) {
    if (cfg->no_checkpoints && (cfg->save_dir || cfg->resume_dir))
        cli_fail("--%s %s: %s", cfg->save_dir ? "save" : "resume",
                 cfg->save_dir ? cfg->save_dir : cfg->resume_dir, cfg->no_checkpoints);
    char why[160];
    if (cfg->save_dir && checkpoint_dir_check("save", cfg->save_dir, why, sizeof why))
        cli_fail("%s", why);
    if (cfg->resume_dir && checkpoint_dir_check("resume", cfg->resume_dir, why, sizeof why))
        cli_fail("%s", why);
    if (cfg->save_every && !cfg->save_dir)
        cli_fail("--save-every %d: needs --save DIR (where to write)", cfg->save_every);
    /* a directory that cannot be written is found now, not after the training; one
     * that is not there yet is made by the first save, so a refused run leaves none */
    struct stat st;
    const int exists = cfg->save_dir && stat(cfg->save_dir, &st) == 0;
    if (cfg->save_dir && !exists && !can_create(cfg->save_dir))
        cli_fail("--save %s: cannot create it (%s)", cfg->save_dir, strerror(errno));
    if (exists && access(cfg->save_dir, W_OK | X_OK) != 0)
        cli_fail("--save %s: cannot write there (%s)", cfg->save_dir, strerror(errno));
    if (exists) checkpoint_clear_stale(cfg->save_dir);   /* a killed save's leftovers */
    /* a restart may find a strategy that had finished: its checkpoint is at --steps */
    const int restart = restart_is_retry(cfg);
    const int last_step = cfg->steps - 1 + restart;
    if (restart) check_restart_saves(cfg);
    if (!cfg->resume_dir) return;
    char err[1024];
    if (checkpoint_check_until(cfg->resume_dir, cfg, last_step, err, sizeof err) < 0)
        cli_fail("%s", err);
    /* DIR/latest moves with every save: a strategy without a checkpoint of its own in DIR
     * resumes from the one DIR/latest names now, as does the baseline */
    static char resolved[4096];
    if (!checkpoint_resolve(cfg->resume_dir, resolved, sizeof resolved, err, sizeof err))
        cli_fail("%s", err);
    if (strcmp(resolved, cfg->resume_dir) != 0) {   /* DIR holds checkpoints: each its own */
        if (checkpoint_check_own_latests(cfg->resume_dir, cfg, last_step, resolved, 0, err,
                                         sizeof err) < 0)
            cli_fail("%s", err);
        cfg->resume_base = cfg->resume_dir;
    }
    cfg->resume_dir = resolved;
}
