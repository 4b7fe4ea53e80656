/* Which checkpoint a strategy resumes from (resume_source.h).
 *
 * Each strategy that saves into DIR has its own newest checkpoint there,
 * DIR/latest-STRATEGY (checkpoint_latest.c). A strategy resumes from the first of:
 *   1. on a restart (./run's attempt 1 or later), its own newest in --save DIR, unless
 *      DIR held it as the job began (another job's: checkpoint_saved_before). A job
 *      stopped half-way through its second strategy thus continues that one where it
 *      was and finds the first one finished; a strategy with none there had not started,
 *      and begins as the job did (3 and 4), exactly as in a run never stopped.
 *   2. on a restart on fewer ranks (--elastic), the newest of any strategy in --save DIR
 *      as the attempt began, when it is before --steps: some names follow the layout
 *      (chapter 3's tp+dp is tp on 2 ranks), so a strategy may find none under its new
 *      name; the new layout goes on within rounding from any strategy's checkpoint.
 *   3. its own newest in --resume DIR;
 *   4. the checkpoint --resume named as the program started (DIR/latest then).
 * None of them: step 0. */
#include "resume_source.h"

#include <stdio.h>

#include "checkpoint.h"
#include "restart.h"

static int copy_path(const char *from, char *path, size_t path_len) {
    ckpt_fits(snprintf(path, path_len, "%s", from), path_len);
    return 1;
}

int resume_source(const run_config *cfg, const char *strategy, char *path, size_t path_len,
                  char *err, size_t err_len) {
    int found = restart_is_retry(cfg) ? checkpoint_own_latest(cfg->save_dir, strategy, path,
                                                              path_len, err, err_len)
                                      : 0;
    if (found == 1 && checkpoint_saved_before(cfg, path)) found = 0;   /* another job's */
    if (found != 0) return found;
    if (restart_world_changed(cfg) && cfg->restart.newest_saved)
        return copy_path(cfg->restart.newest_saved, path, path_len);
    if (cfg->resume_base)
        found = checkpoint_own_latest(cfg->resume_base, strategy, path, path_len, err, err_len);
    if (found != 0) return found;
    return cfg->resume_dir ? copy_path(cfg->resume_dir, path, path_len) : 0;
}
