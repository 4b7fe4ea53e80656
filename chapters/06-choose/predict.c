#include "predict.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "plan_time.h"

/* tp 0: all the ranks (chapter 3's default --tp); pp -1: all the ranks */
const chapter_strategy PREDICT_STRATEGIES[] = {
    {1, "ddp", 1, 0, 0, 0}, {2, "zero1", 1, 1, 0, 0}, {2, "zero2", 1, 2, 0, 0},
    {2, "zero3", 1, 3, 0, 0}, {3, "tp", 0, 0, 0, 0}, {4, "pp-1f1b", 1, 0, -1, 8},
    {5, "3d", 2, 0, 2, 4},   /* tp 2 x pp 2 x dp 1: 4 ranks only */
};
const int PREDICT_NUM_STRATEGIES = sizeof PREDICT_STRATEGIES / sizeof PREDICT_STRATEGIES[0];
static const int rank_counts[] = {2, 4};
enum { CHAPTERS = 5 };

/* Whether a strategy runs on `ranks` ranks here. */
static int runs_on(const chapter_strategy *st, int ranks) {
    return !(st->pp > 0 && st->tp * st->pp != ranks);
}

/* ---- model states, as this project stores them ----------------------------------- */

typedef struct {
    double embed, block, final_ln;   /* elements of each slab */
} slab_sizes;

static slab_sizes slabs_of(const gpt_config *c) {
    const double h = c->dim;
    return (slab_sizes){.embed = (double)c->vocab * h + (double)c->ctx * h,
                        .block = 12 * h * h + 13 * h, .final_ln = 2 * h};
}

/* The largest rank's share of a slab: comm_shard gives the first numel % N ranks one
 * element more. */
static double piece(double numel, int ranks) { return ceil(numel / ranks); }

static double shard_elements(const gpt_config *c, int ranks) {
    slab_sizes s = slabs_of(c);
    return piece(s.embed, ranks) + c->layers * piece(s.block, ranks) + piece(s.final_ln, ranks);
}

/* Tensor parallel: q, k, v, the MLP's first layer and the vocabulary split t ways (one
 * vocabulary slice rounded up), the rest of every block whole. */
static double tp_elements(const gpt_config *c, int tp) {
    const double h = c->dim, t = tp;
    const double block = 12 * h * h / t + (3 * h + 4 * h) / t + 2 * h + 4 * h;
    const double embed = ceil((double)c->vocab / t) * h + (double)c->ctx * h;
    return c->layers * block + embed + 2 * h;
}

static void predict_states(const gpt_config *c, int ranks, int tp, int stage,
                           chapter_figures *f) {
    const slab_sizes s = slabs_of(c);
    const double whole = s.embed + c->layers * s.block + s.final_ln;
    const double mine = tp > 1 ? tp_elements(c, tp) : whole;
    const double shard = tp > 1 ? mine : shard_elements(c, ranks);
    f->params = 4 * mine;
    f->grads = 4 * mine;
    f->optimizer = 8 * (stage >= 1 ? shard : mine);
    /* backward holds one block's full gradient while the tied embedding's, written by
     * the head first, waits for the token embedding's share at the very end */
    if (stage >= 2) f->grads = 4 * (shard + s.block + s.embed);
    /* forward and backward gather one slab at a time */
    if (stage >= 3) f->params = 4 * (shard + fmax(s.block, s.embed));
}

/* A pipeline stage's elements: blocks [k L / p, (k+1) L / p) of the TP slice, the
 * embedding on the first, the final LayerNorm and the tied embedding's copy on the
 * last. */
static double stage_elements(const gpt_config *c, int tp, int pp, int k) {
    const double h = c->dim, t = tp, wte = ceil((double)c->vocab / t) * h;
    const double block = tp > 1 ? 12 * h * h / t + (3 * h + 4 * h) / t + 2 * h + 4 * h
                                : slabs_of(c).block;
    const int blocks = (int)((long)(k + 1) * c->layers / pp - (long)k * c->layers / pp);
    double n = blocks * block;
    if (k == 0) n += wte + (double)c->ctx * h;
    if (k == pp - 1) n += 2 * h + (k > 0 ? wte : 0);
    return n;
}

static void predict_pipeline_states(const gpt_config *c, int tp, int pp, chapter_figures *f) {
    double largest = 0;
    for (int k = 0; k < pp; k++) largest = fmax(largest, stage_elements(c, tp, pp, k));
    f->params = f->grads = 4 * largest;
    f->optimizer = 8 * largest;
}

/* ---- activations -------------------------------------------------------------------- */

static double predict_activations(const gpt_config *c, int B, int tp) {
    const double s = c->ctx, b = B, h = c->dim, a = c->heads, t = tp, L = c->layers;
    const double tokens = s * b, scores = a * s * s * b / t;
    const double layer = tokens * (4 * h + 12 * h / t + 4) + scores;
    const double head = tokens * (h + 2) + tokens * ceil(c->vocab / t) + tokens;
    const double last_output = tokens * h, token_ids = 2 * tokens;
    /* backward workspace: the residual gradient, its LayerNorm-side copy, and the
     * gradients of the split buffers and of the softmax, one layer at a time */
    const double workspace = tokens * (2 * h + 12 * h / t) + scores;
    const double vocab_rows = tp > 1 ? 3 * tokens : 0;   /* max, sum, target logit */
    return 4 * (L * layer + head + last_output + token_ids + workspace + vocab_rows);
}

/* 1F1B on stage k holds min(p - k, m) micro-batches of B/m sequences; each keeps its
 * blocks' activations, its input (and output) and tokens, the gradients it trades with
 * its neighbours and, on the last stage, the head; one backward workspace serves all.
 * The largest stage. */
static double predict_pipeline_activations(const gpt_config *c, int batch, int tp, int pp,
                                           int micro) {
    const double s = c->ctx, b = (double)batch / micro, h = c->dim, a = c->heads, t = tp;
    const double tokens = s * b, scores = a * s * s * b / t;
    const double layer = tokens * (4 * h + 12 * h / t + 4) + scores;
    const double head = tokens * (h + 2) + tokens * ceil(c->vocab / t) + tokens;
    const double workspace = tokens * (2 * h + 12 * h / t) + scores;
    double largest = 0;
    for (int k = 0; k < pp; k++) {
        const int blocks = (int)((long)(k + 1) * c->layers / pp - (long)k * c->layers / pp);
        double slot = blocks * layer + tokens * h + 2 * tokens;   /* + its output, tokens */
        if (k == pp - 1) slot += head;
        else slot += tokens * h;   /* the gradient received from the next stage */
        if (k > 0) slot += tokens * h;   /* the gradient for the previous one */
        const int held = pp - k < micro ? pp - k : micro;
        double bytes = held * slot + workspace + (k == pp - 1 && tp > 1 ? 3 * tokens : 0);
        largest = fmax(largest, 4 * bytes);
    }
    return largest;
}

/* ---- time ------------------------------------------------------------------------- */

static double predict_ms(const gpt_config *c, int batch, int ranks, int tp, int stage,
                         double gflops, int cores, comm_link link, double link_scale) {
    const int dp = ranks / tp;
    const double flops = gpt_flops_per_step(c, batch / dp, c->ctx) / tp;
    const double sharing = ranks > cores ? (double)ranks / cores : 1.0;
    double seconds = flops / (gflops * 1e9) * sharing;
    const plan_link wire = plan_link_of(link);
    const slab_sizes s = slabs_of(c);
    const double model_bytes = 4 * (s.embed + c->layers * s.block + s.final_ln);
    double comm = 0;
    if (tp > 1) {
        const double activation_bytes = 4.0 * (batch / dp) * c->ctx * c->dim;
        comm = 4.0 * c->layers * plan_allreduce_seconds(wire, tp, activation_bytes);
    } else if (stage < 3) {
        comm = plan_allreduce_seconds(wire, dp, model_bytes);
    } else {
        comm = 3 * plan_gather_seconds(wire, dp, model_bytes);
    }
    seconds += comm * link_scale;
    return 1e3 * seconds;
}

/* A pipeline's step: each stage's share of the FLOPs, stretched by 1F1B's
 * (m + p - 1) / m, plus its TP all-reduces on the link model. */
static double predict_pipeline_ms(const gpt_config *c, int batch, int ranks, int tp, int pp,
                                  int micro, double gflops, int cores, comm_link link,
                                  double link_scale) {
    const double flops = gpt_flops_per_step(c, batch, c->ctx) / (tp * pp);
    const double sharing = ranks > cores ? (double)ranks / cores : 1.0;
    double seconds = flops / (gflops * 1e9) * sharing * (micro + pp - 1) / micro;
    if (tp > 1) {
        const double activation_bytes = 4.0 * batch * c->ctx * c->dim;
        seconds += 4.0 * c->layers / pp *
                   plan_allreduce_seconds(plan_link_of(link), tp, activation_bytes) * link_scale;
    }
    return 1e3 * seconds;
}

chapter_figures predict_chapter_run(const gpt_config *cfg, int batch, int ranks,
                                    const chapter_strategy *st, double gflops, int cores,
                                    comm_link link, double link_scale) {
    chapter_figures f = {0};
    if (st->pp != 0) {
        const int pp = st->pp > 0 ? st->pp : ranks, tp = st->tp;
        predict_pipeline_states(cfg, tp, pp, &f);
        f.activations = predict_pipeline_activations(cfg, batch, tp, pp, st->micro);
        f.ms_per_step = predict_pipeline_ms(cfg, batch, ranks, tp, pp, st->micro, gflops, cores,
                                            link, link_scale);
        return f;
    }
    const int tp = st->tp ? st->tp : ranks;
    predict_states(cfg, ranks, tp, st->zero_stage, &f);
    f.activations = predict_activations(cfg, batch / (ranks / tp), tp);
    f.ms_per_step = predict_ms(cfg, batch, ranks, tp, st->zero_stage, gflops, cores, link,
                               link_scale);
    return f;
}

/* ---- measured: the chapters' --json ------------------------------------------------ */

static int number_after(const char *from, const char *end, const char *key, double *out) {
    const char *at = strstr(from, key);
    if (!at || (end && at > end)) return 0;
    *out = strtod(at + strlen(key), NULL);
    return 1;
}

int chapter_json_figures(const char *json, const char *strategy, chapter_figures *out) {
    char key[64];
    snprintf(key, sizeof key, "\"strategy\": \"%s\"", strategy);
    const char *run = strstr(json, key);
    if (!run) return 0;
    const char *end = strstr(run + 1, "\"strategy\": ");   /* the next run, if any */
    const char *memory = strstr(run, "\"memory_per_rank\": {");
    if (!memory || (end && memory > end)) return 0;
    return number_after(run, end, "\"ms_per_step\": ", &out->ms_per_step) &&
           number_after(memory, end, "\"params\": ", &out->params) &&
           number_after(memory, end, "\"grads\": ", &out->grads) &&
           number_after(memory, end, "\"optimizer\": ", &out->optimizer) &&
           number_after(memory, end, "\"activations\": ", &out->activations);
}

/* What each chapter's run is told beyond the common flags. */
static const char *chapter_flags(int chapter) {
    switch (chapter) {
    case 3: return " --part train";
    case 4: return " --schedule 1f1b --micro 8 --stage-ms 0";
    case 5: return " --tp 2 --pp 2 --dp 1 --micro 4";
    default: return "";
    }
}

static double seconds_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* ---- running a chapter, with a deadline ------------------------------------------- */

enum { RUN_STARTED_NOT = -2, RUN_TIMED_OUT = -1 };

/* sh -c command in a process group of its own, stdout into *fd: a timeout then stops
 * the shell and everything it started. */
static pid_t start_command(const char *command, int *fd) {
    int fds[2];
    if (pipe(fds) != 0) return -1;
    const pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        close(fds[1]);
        execl("/bin/sh", "sh", "-c", command, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    if (pid < 0) {
        close(fds[0]);
        return -1;
    }
    setpgid(pid, pid);   /* also here: the group exists whichever side runs first */
    *fd = fds[0];
    return pid;
}

/* Everything fd gives until its end or the deadline; NULL when out of memory.
 * *in_time: whether the end came first. */
static char *read_until(int fd, double deadline, int *in_time) {
    size_t length = 0, capacity = 1 << 16;
    char *text = malloc(capacity);
    *in_time = 0;
    while (text) {
        const double left = deadline - seconds_now();
        if (left <= 0) break;
        struct pollfd ready = {.fd = fd, .events = POLLIN};
        if (poll(&ready, 1, (int)(left * 1000) + 1) <= 0) continue;   /* EINTR, or time */
        const ssize_t got = read(fd, text + length, capacity - length - 1);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            *in_time = 1;
            break;
        }
        length += (size_t)got;
        if (capacity - length < 4096) {
            char *grown = realloc(text, capacity *= 2);
            if (!grown) free(text);
            text = grown;
        }
    }
    if (text) text[length] = 0;
    return text;
}

/* Its exit status, waiting until the deadline at most; RUN_TIMED_OUT after. */
static int wait_until(pid_t pid, double deadline) {
    int status;
    const struct timespec moment = {.tv_nsec = 10 * 1000 * 1000};
    while (waitpid(pid, &status, WNOHANG) != pid) {
        if (seconds_now() >= deadline) return RUN_TIMED_OUT;
        nanosleep(&moment, NULL);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The command's stdout (malloc'ed) and *status: its exit status, RUN_TIMED_OUT when it
 * ran past `seconds` (it is killed, with all it started) or RUN_STARTED_NOT. */
static char *run_with_deadline(const char *command, double seconds, int *status) {
    int fd;
    const pid_t pid = start_command(command, &fd);
    if (pid < 0) {
        *status = RUN_STARTED_NOT;
        return NULL;
    }
    const double deadline = seconds_now() + seconds;
    int in_time;
    char *text = read_until(fd, deadline, &in_time);
    close(fd);
    *status = in_time ? wait_until(pid, deadline) : RUN_TIMED_OUT;
    if (*status == RUN_TIMED_OUT) {
        kill(-pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    return text;
}

char *run_chapter_json(const char *programs_dir, int chapter, int ranks,
                       const predict_options *o) {
    static const char *const link_names[] = {"none", "nvlink", "ib", "ethernet"};
    char program[1024], command[2600];
    snprintf(program, sizeof program, "%s/chapter%d", programs_dir, chapter);
    if (access(program, X_OK) != 0) {
        fprintf(stderr, "predict: %s is not built (make chapter1 ... chapter5)\n", program);
        return NULL;
    }
    char data[1100] = "";
    if (o->data_path) {
        if (strchr(o->data_path, '\'')) {
            fprintf(stderr, "predict: --data %s: a path with a quote cannot be passed on\n",
                    o->data_path);
            return NULL;
        }
        snprintf(data, sizeof data, " --data '%s'", o->data_path);
    }
    snprintf(command, sizeof command,
             "'%s' --ranks %d --preset bench256 --steps %d --json --quiet --link %s"
             " --link-scale %g%s%s", program, ranks, o->steps, link_names[o->link],
             o->link_scale, chapter_flags(chapter), data);
    setenv("OPENBLAS_NUM_THREADS", "1", 1);   /* what ./run sets for every program */
    /* started by mpirun ourselves (MPI=1), the chapter must not take itself for one of
     * mpirun's processes: it runs its ranks as threads */
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("OMPI_COMM_WORLD_RANK");
    unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const double limit = o->timeout_seconds > 0 ? o->timeout_seconds : PREDICT_TIMEOUT_SECONDS;
    int status;
    char *text = run_with_deadline(command, limit, &status);
    if (!text && status == RUN_STARTED_NOT) {
        fprintf(stderr, "predict: cannot start %s\n", program);
        return NULL;
    }
    if (status == RUN_TIMED_OUT) {
        fprintf(stderr, "predict: %s did not finish in %g s and was stopped (command: %s)\n",
                program, limit, command);
        free(text);
        return NULL;
    }
    if (!text || status != 0) {
        fprintf(stderr, "predict: %s failed (exit status %d)\n", command, status);
        free(text);
        return NULL;
    }
    return text;
}

double measure_sgemm_gflops(int tokens, int dim) {
    const int M = tokens, N = 4 * dim, K = dim;   /* the MLP's first GEMM */
    float *a = mem_alloc(MEM_OTHER, sizeof(float) * M * K);
    float *b = mem_alloc(MEM_OTHER, sizeof(float) * K * N);
    float *c = mem_alloc(MEM_OTHER, sizeof(float) * M * N);
    openblas_set_num_threads(1);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1, a, K, b, N, 0, c, N);
    int calls = 0;
    const double t0 = seconds_now();
    double elapsed = 0;
    while (elapsed < 0.2) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1, a, K, b, N, 0, c, N);
        calls++;
        elapsed = seconds_now() - t0;
    }
    mem_free(a);
    mem_free(b);
    mem_free(c);
    return 2.0 * M * N * K * calls / elapsed / 1e9;
}

/* ---- the comparison --------------------------------------------------------------- */

typedef struct {
    int ranks;
    const chapter_strategy *strategy;
    chapter_figures predicted, measured;
    double gflops;
} comparison;

static double activation_error(const comparison *c) {
    return fabs(c->predicted.activations / c->measured.activations - 1);
}

static int states_match(const comparison *c) {
    return c->predicted.params == c->measured.params &&
           c->predicted.grads == c->measured.grads &&
           c->predicted.optimizer == c->measured.optimizer;
}

static void print_table(const comparison *rows, int n, double gflops_2, double gflops_4,
                        int cores) {
    printf("Predicted against measured: bench256 (layers 4, heads 4, dim 256, ctx 64, batch 8),"
           " fp32 Adam (16 bytes per parameter)\nsgemm measured on this machine, one thread:"
           " %.1f GFLOP/s at 256 tokens, %.1f at 128; %d cores\n\n", gflops_2, gflops_4, cores);
    printf("%-6s %5s  %-24s %-24s %-24s %-29s %s\n", "", "ranks", "params pred = measured",
           "grads pred = measured", "optimizer pred = measured", "activations pred / measured",
           "ms/step pred / measured");
    for (int i = 0; i < n; i++) {
        const comparison *c = &rows[i];
        const chapter_figures *p = &c->predicted, *m = &c->measured;
        printf("%-6s %5d  %10.0f %s %-10.0f %10.0f %s %-10.0f %10.0f %s %-10.0f"
               " %10.0f %10.0f %+5.1f%%  %7.1f %7.1f (x%.2f)\n", c->strategy->strategy,
               c->ranks, p->params, p->params == m->params ? "=" : "!", m->params, p->grads,
               p->grads == m->grads ? "=" : "!", m->grads, p->optimizer,
               p->optimizer == m->optimizer ? "=" : "!", m->optimizer, p->activations,
               m->activations, 100 * (p->activations / m->activations - 1), p->ms_per_step,
               m->ms_per_step, m->ms_per_step / p->ms_per_step);
    }
    printf("\nbytes: the largest rank, from the accounting allocator; model states must match"
           " exactly ('=' does), activations within 10%%.\nms/step: time is only reported."
           " Predicted = FLOPs / sgemm rate (+ the link model): it leaves out everything that"
           " is not a\nGEMM (LayerNorm, softmax, GELU, Adam, copies) and other programs on the"
           " same cores: a floor, so measured runs slower.\n");
    double load[1];
    if (getloadavg(load, 1) == 1)
        printf("load average of the last minute: %.1f on %d cores (these runs add up to 4"
               " of it; the rest is other programs)\n", load[0], cores);
}

static void print_json(const comparison *rows, int n, int ok) {
    printf("{\"chapter\": \"06-choose\", \"predict_chapters\": [\n");
    for (int i = 0; i < n; i++) {
        const comparison *c = &rows[i];
        const chapter_figures *f[2] = {&c->predicted, &c->measured};
        printf("  {\"chapter\": %d, \"strategy\": \"%s\", \"ranks\": %d", c->strategy->chapter,
               c->strategy->strategy, c->ranks);
        for (int k = 0; k < 2; k++)
            printf(", \"%s\": {\"params\": %.0f, \"grads\": %.0f, \"optimizer\": %.0f,"
                   " \"activations\": %.0f, \"ms_per_step\": %.4g}", k ? "measured" : "predicted",
                   f[k]->params, f[k]->grads, f[k]->optimizer, f[k]->activations,
                   f[k]->ms_per_step);
        printf("}%s\n", i == n - 1 ? "" : ",");
    }
    printf(" ], \"ok\": %s}\n", ok ? "true" : "false");
}

int predict_chapters_in(const char *programs_dir, const predict_options *o,
                        double *worst_activation, int *state_mismatches) {
    const gpt_config bench = {.vocab = 256, .ctx = 64, .layers = 4, .heads = 4, .dim = 256};
    const int batch = 8, cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    comparison rows[2 * 8];
    int n = 0;
    double gflops[2];
    *worst_activation = 0;
    *state_mismatches = 0;
    for (int r = 0; r < 2; r++) {
        const int ranks = rank_counts[r];
        gflops[r] = measure_sgemm_gflops(batch / ranks * bench.ctx, bench.dim);
        char *json[CHAPTERS + 1] = {0};
        for (int chapter = 1; chapter <= CHAPTERS; chapter++) {
            if (chapter == 5 && ranks != 4) continue;   /* its mesh is 2 x 2 */
            json[chapter] = run_chapter_json(programs_dir, chapter, ranks, o);
            if (!json[chapter]) return 2;
        }
        for (int s = 0; s < PREDICT_NUM_STRATEGIES; s++) {
            const chapter_strategy *st = &PREDICT_STRATEGIES[s];
            if (!runs_on(st, ranks)) continue;
            comparison *c = &rows[n++];
            *c = (comparison){.ranks = ranks, .strategy = st, .gflops = gflops[r]};
            c->predicted = predict_chapter_run(&bench, batch, ranks, st, gflops[r], cores,
                                               o->link, o->link_scale);
            if (!chapter_json_figures(json[st->chapter], st->strategy, &c->measured)) {
                fprintf(stderr, "predict: chapter %d printed no run '%s'\n", st->chapter,
                        st->strategy);
                return 2;
            }
            if (!states_match(c)) (*state_mismatches)++;
            if (activation_error(c) > *worst_activation) *worst_activation = activation_error(c);
        }
        for (int chapter = 1; chapter <= CHAPTERS; chapter++) free(json[chapter]);
    }
    const int ok = *state_mismatches == 0 && *worst_activation <= 0.10;
    if (o->json)
        print_json(rows, n, ok);
    else
        print_table(rows, n, gflops[0], gflops[1], cores);
    return ok ? 0 : 1;
}

int predict_chapters(const predict_options *o) {
    char exe[1024];
    const ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) {
        fprintf(stderr, "predict: cannot find this program's folder\n");
        return 2;
    }
    exe[len] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    double worst;
    int mismatches;
    const int status = predict_chapters_in(exe, o, &worst, &mismatches);
    if (status != 2 && !o->json)
        printf("%s: %d model-state figures differ, activations at most %.2f%% off\n",
               status == 0 ? "OK" : "FAILED", mismatches, 100 * worst);
    return status;
}
