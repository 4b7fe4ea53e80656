/* The program's half of restarts after a failure (restart.h): the checks of the flags,
 * DIR/restart-progress, the failure hook and the cost of the failures.
 *
 * DIR/restart-progress is three fixed lines of RECORD_BYTES, each rewritten in place
 * (pwrite: no allocation, no rename in the step loop), read by ./run after a failure:
 *   line 0, world rank 0 after every step:  attempt A first_step T load S step K at T
 *                                           strategy NAME (the loop's, as in DIR/latest-NAME)
 *   line 1, the rank the hook fails:        failed rank R step K at T gone G
 *   line 2, world rank 0 at the end:        restarts N lost L detect S relaunch S load S
 * Times are wall-clock seconds (CLOCK_REALTIME), comparable with ./run's `date`. */
#include "restart.h"

#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"

const char *const restart_fail_hows[] = {"kill", "abort", "stop", NULL};

enum { RECORD_BYTES = 128, LINE_PROGRESS = 0, LINE_FAILURE = 1, LINE_TOTALS = 2 };

/* World rank 0's view of this attempt (one training loop at a time saves). */
static struct {
    int fd;                 /* DIR/restart-progress; -1: not keeping it */
    double first_step_at;   /* wall clock when this attempt's first step started */
    double load_seconds;    /* this attempt's checkpoint load */
    double previous_exit;   /* when the failed job before this attempt ended */
    int world_at_start;
    int counted;            /* this attempt's relaunch and load are in cost */
    char strategy[40];      /* the training loop's now: its steps are the ones counted */
    restart_cost cost;      /* the earlier attempts' (from ./run), then with this one's */
} self = {.fd = -1};

static double wall_clock(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int keeps_progress(const run_config *cfg, comm *world) {
    return cfg->save_dir && cfg->restart.on && (!world || comm_world_rank(world) == 0);
}

/* ---- the flags ------------------------------------------------------------------- */

/* --restart-record "restarts lost detect relaunch load previous_exit world_at_start":
 * whether it holds the 7 numbers, read into c and the rest. */
static int read_record(const char *record, restart_cost *c, double *previous_exit,
                       int *world_at_start) {
    return sscanf(record, "%d %d %lf %lf %lf %lf %d", &c->restarts, &c->lost_steps,
                  &c->detect_seconds, &c->relaunch_seconds, &c->load_seconds, previous_exit,
                  world_at_start) == 7;
}

/* Whether the program refuses --save (a planner that trains nothing). */
static int refuses_save(const run_config *cfg) {
    for (int i = 0; cfg->unused_flags && cfg->unused_flags[i]; i++)
        if (strcmp(cfg->unused_flags[i], "save") == 0) return 1;
    return 0;
}

/* One reason in why, returned (a macro: each case is a line of the list below). */
#define REFUSE(...) return snprintf(why, why_len, __VA_ARGS__), why

const char *restart_flags_check(const run_config *cfg, const char *program, char *why,
                                size_t why_len) {
    const int restarts = cfg->restart.on;
    const int K = cfg->restart.max_restarts;
    if (restarts && refuses_save(cfg))
        REFUSE("--max-restarts does nothing in %s (%s)", program, cfg->unused_why);
    if (restarts && cfg->no_checkpoints)   /* a restart resumes from a checkpoint */
        REFUSE("--max-restarts %d: %s", K, cfg->no_checkpoints);
    if (restarts && !cfg->save_dir)
        REFUSE("--max-restarts %d: needs --save DIR (a restart resumes from the latest"
               " checkpoint there; --save-every N makes one every N steps)", K);
    if (cfg->restart.elastic && !restarts)
        REFUSE("--elastic: needs --max-restarts K (the restarts that go on with fewer ranks)");
    if (restarts && !cfg->restart.from_run)
        REFUSE("--max-restarts %d: ./run makes the restarts (it starts the job again after"
               " a failure); run it as ./run N ... --max-restarts %d", K, K);
    if (!restarts && (cfg->restart.from_run || cfg->restart.record))
        REFUSE("--restart-attempt and --restart-record: ./run gives them with --max-restarts");
    restart_cost c;
    double previous_exit;
    int world;
    if (cfg->restart.record && !read_record(cfg->restart.record, &c, &previous_exit, &world))
        REFUSE("--restart-record '%s': ./run's record of the earlier attempts has 7 numbers",
               cfg->restart.record);
    if (cfg->restart.fail_how == 2 && cfg->restart.fail_step && launch_mpi_world_size() == 0)
        REFUSE("--test-fail-how stop: a stopped threads job stops every rank, and none is"
               " left to time out (valid under Open MPI; here: kill or abort)");
    return NULL;
}
#undef REFUSE

void restart_take_flags(run_config *cfg) {
    self.world_at_start = cfg->comm.ranks;
    if (cfg->restart.record)
        read_record(cfg->restart.record, &self.cost, &self.previous_exit, &self.world_at_start);
    if (cfg->restart.fail_attempts == 0) cfg->restart.fail_attempts = 1;
    if (cfg->restart.attempt >= cfg->restart.fail_attempts) {   /* the hooks have fired */
        cfg->restart.fail_step = 0;
        cfg->save_test_crash = 0;
    }
}

/* ---- DIR/restart-progress --------------------------------------------------------- */

static void write_line(int fd, int line, const char *fmt, ...) {
    char text[RECORD_BYTES];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    if (n < 0 || n > RECORD_BYTES - 1) n = RECORD_BYTES - 1;
    memset(text + n, ' ', (size_t)(RECORD_BYTES - 1 - n));   /* over what was there */
    text[RECORD_BYTES - 1] = '\n';
    if (pwrite(fd, text, sizeof text, (off_t)line * RECORD_BYTES) != (ssize_t)sizeof text)
        perror("restart: DIR/restart-progress");
}

/* DIR is made here, once the run is under way: a run refused before (exit 2) leaves
 * nothing behind it, and ./run makes nothing before the program accepts the job. */
static int open_progress(const char *dir) {
    char path[4096];
    mkdir(dir, 0777);   /* may exist */
    snprintf(path, sizeof path, "%s/restart-progress", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) perror(path);
    return fd;
}

static void write_progress(const run_config *cfg, int step, double at) {
    write_line(self.fd, LINE_PROGRESS,
               "attempt %d first_step %.6f load %.6f step %d at %.6f strategy %s",
               cfg->restart.attempt, self.first_step_at, self.load_seconds, step, at,
               self.strategy);
}

void restart_loop_start(const run_config *cfg, comm *world, const char *strategy, int done,
                        double load_seconds) {
    if (!keeps_progress(cfg, world)) return;
    snprintf(self.strategy, sizeof self.strategy, "%s", strategy);
    self.fd = open_progress(cfg->save_dir);
    self.first_step_at = wall_clock();
    self.load_seconds = load_seconds;
    if (self.fd >= 0) write_progress(cfg, done, self.first_step_at);
    if (cfg->restart.attempt == 0 || self.counted) return;
    /* this attempt's share, once (a chapter may run several strategies that save): ./run's
     * record ends where the failed job did */
    self.counted = 1;
    self.cost.relaunch_seconds += self.first_step_at - self.previous_exit - load_seconds;
    self.cost.load_seconds += load_seconds;
}

void restart_step_done(const run_config *cfg, comm *world, int step) {
    if (self.fd >= 0 && keeps_progress(cfg, world)) write_progress(cfg, step, wall_clock());
}

void restart_loop_end(const run_config *cfg, comm *world) {
    if (self.fd < 0 || !keeps_progress(cfg, world)) return;
    const restart_cost *c = &self.cost;
    write_line(self.fd, LINE_TOTALS, "restarts %d lost %d detect %.3f relaunch %.3f load %.3f",
               c->restarts, c->lost_steps, c->detect_seconds, c->relaunch_seconds,
               c->load_seconds);
    close(self.fd);
    self.fd = -1;
}

/* ---- the test hook ----------------------------------------------------------------- */

void restart_maybe_fail(const run_config *cfg, comm *world, const char *strategy, int step) {
    const int rank = world ? comm_world_rank(world) : 0;
    if (!cfg->save_dir || step != cfg->restart.fail_step || rank != cfg->restart.fail_rank)
        return;
    if (cfg->restart.fail_strategy && strcmp(cfg->restart.fail_strategy, strategy) != 0) return;
    int fd = open_progress(cfg->save_dir);   /* when it failed, and whether it comes back */
    if (fd >= 0) {
        write_line(fd, LINE_FAILURE, "failed rank %d step %d at %.6f gone %d", rank, step,
                   wall_clock(), cfg->restart.fail_gone);
        close(fd);
    }
    if (cfg->restart.fail_how == 0) {   /* as the OOM killer or a lost node would */
        fprintf(stderr, "test hook: rank %d kills its process (SIGKILL) at step %d\n", rank, step);
        raise(SIGKILL);
    }
    if (cfg->restart.fail_how == 2) {   /* stuck: the others' --comm-timeout must see it */
        fprintf(stderr, "test hook: rank %d stops its process (SIGSTOP) at step %d\n", rank, step);
        raise(SIGSTOP);
    }
    /* as a device or link that fails would: the rank is lost, a restart may cure it */
    if (!world) {
        fprintf(stderr, "rank 0 failed: test hook at step %d\n", step);
        exit(COMM_EXIT_RANK_LOST);
    }
    comm_abort_lost(world, "test hook at step %d", step);
}

int restart_is_retry(const run_config *cfg) {
    return cfg->save_dir && cfg->restart.on && cfg->restart.from_run && cfg->restart.attempt > 0;
}

int restart_world_changed(const run_config *cfg) {
    return restart_is_retry(cfg) && self.world_at_start != cfg->comm.ranks;
}

int restart_resumed_step(const run_config *cfg, int checkpoint_step) {
    return checkpoint_step + cfg->restart.resume_skew;
}

/* ---- what it cost ---------------------------------------------------------------- */

restart_cost restart_cost_so_far(void) { return self.cost; }

void restart_json_keys(const run_config *cfg) {
    if (!cfg->restart.on) return;
    const restart_cost *c = &self.cost;
    printf(",\n \"max_restarts\": %d, \"restarts\": %d, \"elastic\": %s, \"world_at_start\": %d,"
           " \"lost_steps\": %d,\n \"restart_seconds\": %.3f, \"detect_seconds\": %.3f,"
           " \"relaunch_seconds\": %.3f, \"load_seconds\": %.3f",
           cfg->restart.max_restarts, c->restarts, cfg->restart.elastic ? "true" : "false",
           self.world_at_start, c->lost_steps,
           c->detect_seconds + c->relaunch_seconds + c->load_seconds, c->detect_seconds,
           c->relaunch_seconds, c->load_seconds);
}
