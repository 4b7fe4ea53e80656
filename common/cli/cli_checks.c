/* The checks every program runs on its flags before any rank starts, for the things
 * the flags name: the data file and the checkpoint directories. */
#include "cli_checks.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "cli_error.h"
#include "restart.h"

dataset *dataset_from_config(const run_config *cfg) {
    if (!cfg->data_path) return dataset_builtin();
    char err[512];
    dataset *d = dataset_load(cfg->data_path, cfg->model.ctx, err, sizeof err);
    if (!d) cli_fail("%s", err);
    return d;
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
    } else {
        if (checkpoint_resolve(cfg->save_dir, newest, sizeof newest, err, sizeof err))
            step = checkpoint_check_until(newest, cfg, cfg->steps, err, sizeof err);
        if (step < 0) cli_fail("%s", err);
    }
    if (checkpoint_check_own_latests(cfg->save_dir, cfg, cfg->steps, newest, err, sizeof err) < 0)
        cli_fail("%s", err);
    if (step >= 0 && step < cfg->steps) cfg->restart.newest_saved = newest;
}

void checkpoint_cli_check(run_config *cfg) {
    if (cfg->no_checkpoints && (cfg->save_dir || cfg->resume_dir))
        cli_fail("--%s %s: %s", cfg->save_dir ? "save" : "resume",
                 cfg->save_dir ? cfg->save_dir : cfg->resume_dir, cfg->no_checkpoints);
    if (cfg->save_every && !cfg->save_dir)
        cli_fail("--save-every %d: needs --save DIR (where to write)", cfg->save_every);
    /* a directory that cannot be written is found now, not after the training */
    if (cfg->save_dir && mkdir(cfg->save_dir, 0777) != 0 && errno != EEXIST)
        cli_fail("--save %s: cannot create it (%s)", cfg->save_dir, strerror(errno));
    if (cfg->save_dir && access(cfg->save_dir, W_OK | X_OK) != 0)
        cli_fail("--save %s: cannot write there (%s)", cfg->save_dir, strerror(errno));
    if (cfg->save_dir) checkpoint_clear_stale(cfg->save_dir);   /* a killed save's leftovers */
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
        if (checkpoint_check_own_latests(cfg->resume_dir, cfg, last_step, resolved, err,
                                         sizeof err) < 0)
            cli_fail("%s", err);
        cfg->resume_base = cfg->resume_dir;
    }
    cfg->resume_dir = resolved;
}
