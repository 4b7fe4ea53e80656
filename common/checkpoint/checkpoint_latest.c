/* Each strategy's own newest checkpoint (checkpoint.h).
 *
 * A program may run several strategies that save into one DIR (chapter 2 runs ZeRO-0
 * before the stage asked for). Every save points DIR/latest-STRATEGY at its checkpoint,
 * and DIR/latest too (the newest of any strategy: for tools, and for another program
 * that resumes across layouts). Each strategy resumes from its own pointer: a run stopped
 * half-way through its second strategy then continues that strategy where it was, and
 * the first from its own last save, as if never stopped; from another strategy's
 * checkpoint it would go on within rounding only (resume_source.c chooses). */
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint.h"

enum { POINTER_PREFIX_LEN = 7 };   /* "latest-" */

void checkpoint_own_pointer(const char *strategy, char *name, size_t len) {
    ckpt_fits(snprintf(name, len, "latest-%s", strategy), len);
    for (char *c = name + POINTER_PREFIX_LEN; *c; c++) {   /* a file name, whatever the label */
        const int plain = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                          (*c >= '0' && *c <= '9') || strchr("._+-", *c);
        if (!plain) *c = '_';
    }
}

int checkpoint_own_latest(const char *dir, const char *strategy, char *path, size_t path_len,
                          char *err, size_t err_len) {
    char pointer[128], probe[4400];
    checkpoint_own_pointer(strategy, pointer, sizeof pointer);
    ckpt_fits(snprintf(probe, sizeof probe, "%s/%s", dir, pointer), sizeof probe);
    struct stat sb;
    if (lstat(probe, &sb) != 0) return 0;
    return checkpoint_read_pointer(dir, pointer, path, path_len, err, err_len) ? 1 : -1;
}

int checkpoint_saved_before(const run_config *cfg, const char *path) {
    const char *list = cfg->restart.saves_before;
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    const size_t n = strlen(name);
    if (!list || n == 0) return 0;
    for (const char *p = list; (p = strstr(p, name)) != NULL; p += n)   /* a whole word */
        if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0')) return 1;
    return 0;
}

int checkpoint_check_own_latests(const char *dir, const run_config *cfg, int last_step,
                                 const char *checked, int this_job_only, char *err,
                                 size_t err_len) {
    DIR *d = opendir(dir);
    if (!d) return 0;   /* no directory, no pointers */
    int status = 0;
    char path[4096];
    for (struct dirent *e; status == 0 && (e = readdir(d));) {
        if (strncmp(e->d_name, "latest-", POINTER_PREFIX_LEN) != 0) continue;
        if (!checkpoint_read_pointer(dir, e->d_name, path, sizeof path, err, err_len))
            status = -1;
        else if (this_job_only && checkpoint_saved_before(cfg, path))
            continue;   /* another job's: never resumed */
        else if (strcmp(path, checked) != 0 &&   /* each checkpoint read once */
                 checkpoint_check_until(path, cfg, last_step, err, err_len) < 0)
            status = -1;
    }
    closedir(d);
    return status;
}
