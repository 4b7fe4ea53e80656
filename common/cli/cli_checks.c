/* The checks every program runs on its flags before any rank starts, for the things
 * the flags name: the data file and the checkpoint directories. */
#include "cli_checks.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "cli_error.h"

dataset *dataset_from_config(const run_config *cfg) {
    if (!cfg->data_path) return dataset_builtin();
    char err[512];
    dataset *d = dataset_load(cfg->data_path, cfg->model.ctx, err, sizeof err);
    if (!d) cli_fail("%s", err);
    return d;
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

void checkpoint_cli_check(run_config *cfg) {
    if (cfg->no_checkpoints && (cfg->save_dir || cfg->resume_dir))
        cli_fail("--%s %s: %s", cfg->save_dir ? "save" : "resume",
                 cfg->save_dir ? cfg->save_dir : cfg->resume_dir, cfg->no_checkpoints);
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
    if (!cfg->resume_dir) return;
    char err[1024];
    if (checkpoint_check(cfg->resume_dir, cfg, err, sizeof err) < 0) cli_fail("%s", err);
    /* DIR/latest moves with every save: a program that runs several strategies, each
     * resuming from DIR and saving into it, must resume each from the same checkpoint */
    static char resolved[4096];
    if (!checkpoint_resolve(cfg->resume_dir, resolved, sizeof resolved, err, sizeof err))
        cli_fail("%s", err);
    cfg->resume_dir = resolved;
}
