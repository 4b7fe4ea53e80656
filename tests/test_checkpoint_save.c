/* The save protocol of checkpoint_save.c under faults, through its test seam
 * (checkpoint.h): a save stopped before each of its steps in turn leaves a loadable
 * checkpoint, every file and directory is fsynced before `latest` moves, and a save that
 * fails (its files over RLIMIT_FSIZE, as on a full disk) or is killed leaves no
 * temporary directory behind for the next one. */
#include <check.h>
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_run.h"
#include "checkpoint.h"
#include "checkpoint_layouts.h"
#include "cli.h"
#include "resume_source.h"



static void shell(const char *fmt, const char *a, const char *b) {
    char cmd[1200];
    ckpt_fits(snprintf(cmd, sizeof cmd, fmt, a, b), sizeof cmd);
    ck_assert_int_eq(system(cmd), 0);
}


/* The names in dir that start with ".tmp" or ".latest" (a save's leftovers), or "". */
static const char *leftover_in(const char *dir) {
    static char found[256];
    found[0] = '\0';
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    for (struct dirent *e; (e = readdir(d));)
        if (strncmp(e->d_name, ".tmp", 4) == 0 || strncmp(e->d_name, ".latest", 7) == 0)
            snprintf(found, sizeof found, "%s", e->d_name);
    closedir(d);
    return found;
}

/* ---- the steps of a save, as the seam reports them ------------------------------------ */

enum { MAX_STEPS = 256 };
static pthread_mutex_t steps_lock = PTHREAD_MUTEX_INITIALIZER;
static char steps[MAX_STEPS][320];
static int num_steps;

static void record_step(const char *action, const char *path) {
    pthread_mutex_lock(&steps_lock);
    if (num_steps < MAX_STEPS)
        ckpt_fits(snprintf(steps[num_steps++], sizeof steps[0], "%s %s", action, path),
                  sizeof steps[0]);
    pthread_mutex_unlock(&steps_lock);
}

/* Records every step of one save of layout l into dir; returns how many there were. */
static int record_save(const layout_spec *l, const run_config *cfg, const char *dir,
                       uint64_t seed) {
    num_steps = 0;
    checkpoint_observe_saves(record_step);
    layout_save(l, cfg, dir, seed, 0);
    checkpoint_observe_saves(NULL);
    ck_assert_int_lt(num_steps, MAX_STEPS);
    return num_steps;
}

/* The index of the first recorded step "action path" at or after `from`, or -1. */
static int step_index(const char *action, const char *path, int from) {
    char want[sizeof steps[0]];
    ckpt_fits(snprintf(want, sizeof want, "%s %s", action, path), sizeof want);
    for (int i = from; i < num_steps; i++)
        if (strcmp(steps[i], want) == 0) return i;
    return -1;
}

/* ---- tests ------------------------------------------------------------------------------- */

START_TEST(a_save_stopped_before_any_of_its_steps_leaves_a_loadable_checkpoint) {
    const run_config cfg = layout_tiny_config();
    const layout_spec *zero3 = &checkpoint_layouts[1];
    const char *pristine = layout_scratch_dir("pristine"), *dir = layout_scratch_dir("stopped");
    layout_save(zero3, &cfg, pristine, 77, 0);   /* the previous checkpoint: seed 77 */
    const int total = record_save(zero3, &cfg, layout_scratch_dir("counted"), 55);
    int moves = -1;   /* the step that renames `latest` (1-based) */
    for (int i = 0; i < total; i++)
        if (strstr(steps[i], "rename ") == steps[i] && strstr(steps[i], "/latest")) moves = i + 1;
    ck_assert_int_gt(moves, 0);
    int stops = 0;
    for (int at = 1; at <= total; at++) {
        shell("rm -rf %s%s", dir, "");
        shell("cp -r %s %s", pristine, dir);
        fflush(stdout);
        const pid_t child = fork();
        if (child == 0) {
            layout_save(zero3, &cfg, dir, 55, at);
            _exit(0);   /* not reached: the hook ends the process as a lost rank (comm.h) */
        }
        int status = 0;
        ck_assert_int_eq(waitpid(child, &status, 0), child);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == COMM_EXIT_RANK_LOST, "step %d: status %d", at,
                      status);
        char err[1024] = "";
        const int step = checkpoint_check(dir, &cfg, err, sizeof err);
        ck_assert_msg(step == 5, "stopped before step %d (%s): %s", at, steps[at - 1], err);
        /* the new checkpoint once `latest` has moved to it, the previous one before */
        const uint64_t seed = at > moves ? 55 : 77;
        const float d = layout_load(&checkpoint_layouts[0], &cfg, dir, seed);
        ck_assert_msg(d == 0, "stopped before step %d (%s): seed %llu's values differ by %g", at,
                      steps[at - 1], (unsigned long long)seed, d);
        stops++;
    }
    printf("a zero3 x4 save stopped before each of its %d steps in turn: `latest` loads every"
           " time, the previous checkpoint when stopped up to step %d (%s), the new one after\n",
           stops, moves, steps[moves - 1]);
    /* and the next save clears what the stopped one left */
    layout_save(zero3, &cfg, dir, 56, 0);
    ck_assert_str_eq(leftover_in(dir), "");
    ck_assert_float_eq(layout_load(&checkpoint_layouts[0], &cfg, dir, 56), 0);
}
END_TEST

START_TEST(every_file_and_directory_is_fsynced_before_latest_moves) {
    const run_config cfg = layout_tiny_config();
    const char *dir = layout_scratch_dir("fsync");
    record_save(&checkpoint_layouts[1], &cfg, dir, 77);
    char latest[300], tmp[300], final[300], path[600];
    snprintf(latest, sizeof latest, "%s/latest", dir);
    snprintf(tmp, sizeof tmp, "%s/.tmp-step-000005", dir);
    snprintf(final, sizeof final, "%s/step-000005", dir);
    const int moves = step_index("rename", latest, 0), renamed = step_index("rename", final, 0);
    ck_assert_int_ge(moves, 0);
    ck_assert_int_ge(renamed, 0);
    int missing = 0, files = 0;
    DIR *d = opendir(final);
    ck_assert_ptr_nonnull(d);
    for (struct dirent *e; (e = readdir(d));) {   /* every file the checkpoint holds */
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", tmp, e->d_name);
        const int synced = step_index("fsync", path, 0);
        files++;
        if (synced < 0 || synced > renamed) {
            printf("  %s: not fsynced before its directory was renamed\n", e->d_name);
            missing++;
        }
    }
    closedir(d);
    /* the directory before its rename, DIR after it, `latest` before its own rename */
    const int tmp_synced = step_index("fsync", tmp, 0), dir_synced = step_index("fsync", dir, renamed);
    snprintf(path, sizeof path, "%s/.latest.tmp", dir);
    const int latest_synced = step_index("fsync", path, 0);
    missing += (tmp_synced < 0 || tmp_synced > renamed) + (dir_synced < 0 || dir_synced > moves) +
               (latest_synced < 0 || latest_synced > moves) + (step_index("fsync", dir, moves) < 0);
    printf("fsyncs in %d steps of a zero3 x4 save: %d files of %d and the directories"
           " checked, %d missing before `latest` moved\n", num_steps, files - missing, files,
           missing);
    ck_assert_int_eq(files, 5);   /* index.json and four rank files */
    ck_assert_int_eq(missing, 0);
}
END_TEST

START_TEST(a_failed_save_removes_its_files_and_the_next_one_succeeds) {
    const run_config cfg = layout_tiny_config();
    const char *dir = layout_scratch_dir("full");
    layout_save(&checkpoint_layouts[1], &cfg, dir, 77, 0);
    fflush(stdout);
    const pid_t child = fork();
    if (child == 0) {   /* a disk that takes 8 KiB per file: the rank files fail */
        const struct rlimit small = {8192, 8192};
        signal(SIGXFSZ, SIG_IGN);   /* a write past the limit fails with EFBIG instead */
        setrlimit(RLIMIT_FSIZE, &small);
        layout_save(&checkpoint_layouts[1], &cfg, dir, 55, 0);
        _exit(0);
    }
    int status = 0;
    ck_assert_int_eq(waitpid(child, &status, 0), child);
    const char *left = leftover_in(dir);
    printf("a save whose files could not be written: status %d, left behind: '%s'\n",
           WIFEXITED(status) ? WEXITSTATUS(status) : -1, left);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 1);
    ck_assert_str_eq(left, "");
    ck_assert_float_eq(layout_load(&checkpoint_layouts[0], &cfg, dir, 77), 0);
    layout_save(&checkpoint_layouts[1], &cfg, dir, 56, 0);
    ck_assert_str_eq(leftover_in(dir), "");
    ck_assert_float_eq(layout_load(&checkpoint_layouts[0], &cfg, dir, 56), 0);
}
END_TEST

START_TEST(a_killed_saves_leftovers_are_removed_when_the_next_run_starts) {
    run_config cfg = layout_tiny_config();
    const char *dir = layout_scratch_dir("stale");
    shell("mkdir -p %s/.tmp-step-000003 && echo x > %s/.tmp-step-000003/rank-00000.safetensors",
          dir, dir);
    shell("echo step-000003 > %s/.latest.tmp%s", dir, "");
    cfg.save_dir = dir;
    checkpoint_cli_check(&cfg);   /* what every program runs before any rank starts */
    const char *left = leftover_in(dir);
    printf("after a killed save, the next start leaves: '%s'\n", left);
    ck_assert_str_eq(left, "");
}
END_TEST

/* The values the checkpoint strategy `name` resumes from hold: the seed they were saved
 * from, or 0 when it starts afresh. */
static uint64_t resumes_from(const run_config *cfg, const char *name) {
    char path[4096], err[1024] = "";
    const int found = resume_source(cfg, name, path, sizeof path, err, sizeof err);
    ck_assert_msg(found >= 0, "%s: %s", name, err);
    if (!found) return 0;
    const uint64_t seeds[3] = {77, 55, 33};
    for (int i = 0; i < 3; i++)
        if (layout_load(&checkpoint_layouts[0], cfg, path, seeds[i]) == 0) return seeds[i];
    return 1;   /* none of them */
}

START_TEST(each_strategy_resumes_from_its_own_newest_checkpoint) {
    run_config cfg = layout_tiny_config();
    const layout_spec *zero3 = &checkpoint_layouts[1], *tp = &checkpoint_layouts[3],
                      *pp = &checkpoint_layouts[4];
    const char *dir = layout_scratch_dir("two-strategies"), *again = layout_scratch_dir("again");
    layout_save(zero3, &cfg, dir, 77, 0);   /* step 5 of two strategies in one DIR */
    layout_save(tp, &cfg, dir, 55, 0);      /* DIR/latest now names this one */
    cfg.resume_dir = dir;
    checkpoint_cli_check(&cfg);
    layout_save(&checkpoint_layouts[5], &cfg, dir, 33, 0);   /* this run's save moves latest */
    const uint64_t z = resumes_from(&cfg, zero3->name), t = resumes_from(&cfg, tp->name),
                   p = resumes_from(&cfg, pp->name);
    printf("--resume DIR: zero3 x4 from seed %llu, tp2 x dp2 from %llu, pp2 (none of its own)"
           " from %llu\n", (unsigned long long)z, (unsigned long long)t, (unsigned long long)p);
    ck_assert(z == 77 && t == 55 && p == 55);
    /* a restart: its own in --save DIR first, then in --resume DIR, then --resume's */
    layout_save(pp, &cfg, again, 77, 0);
    cfg.save_dir = again;
    cfg.restart.on = cfg.restart.from_run = cfg.restart.attempt = 1;   /* as ./run gives it */
    ck_assert(resumes_from(&cfg, pp->name) == 77 && resumes_from(&cfg, tp->name) == 55);
    cfg.restart.attempt = 0;   /* not a restart: --save DIR is not read */
    ck_assert(resumes_from(&cfg, pp->name) == 55);
    cfg.resume_dir = cfg.resume_base = NULL;
    ck_assert(resumes_from(&cfg, pp->name) == 0);
}
END_TEST

int main(void) {
    Suite *suite = suite_create("checkpoint_save");
    TCase *tc = tcase_create("checkpoint_save");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, a_save_stopped_before_any_of_its_steps_leaves_a_loadable_checkpoint);
    tcase_add_test(tc, every_file_and_directory_is_fsynced_before_latest_moves);
    tcase_add_test(tc, a_failed_save_removes_its_files_and_the_next_one_succeeds);
    tcase_add_test(tc, a_killed_saves_leftovers_are_removed_when_the_next_run_starts);
    tcase_add_test(tc, each_strategy_resumes_from_its_own_newest_checkpoint);
    suite_add_tcase(suite, tc);
    static char root[] = "/tmp/test_checkpoint_save.XXXXXX";
    if (!layout_scratch_open(root)) return 1;
    return layout_scratch_close(check_run(suite, 0));
}
