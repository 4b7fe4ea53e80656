/* --predict-chapters: every strategy predicted, run and compared (predict.h). The
 * formulas are in predict_formulas.c, the runs in predict_runner.c, their --json read
 * in predict_measured.c, the sgemm rate in predict_floor.c, the output in
 * predict_report.c. */
#include "predict.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "predict_report.h"

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

static double activation_error(const predict_comparison *c) {
    return fabs(c->predicted.activations / c->measured.activations - 1);
}

static int states_match(const predict_comparison *c) {
    return c->predicted.params == c->measured.params &&
           c->predicted.grads == c->measured.grads &&
           c->predicted.optimizer == c->measured.optimizer;
}

/* bench256, the model every comparison runs: layers 4, heads 4, dim 256, ctx 64, vocab
 * 256, batch 8. */
static const gpt_config bench = {.vocab = 256, .ctx = 64, .layers = 4, .heads = 4, .dim = 256};
enum { BENCH_BATCH = 8 };

typedef struct {
    predict_comparison rows[2 * 8];
    int n;
    double worst_activation;
    int state_mismatches;
} comparisons;

/* Every strategy that runs on `ranks` ranks, predicted and taken from the chapters'
 * --json (json[chapter]); 0 when a run is missing from its chapter's report. */
static int compare_strategies(char *const json[], int ranks, double gflops, int cores,
                              const predict_options *o, comparisons *out) {
    for (int s = 0; s < PREDICT_NUM_STRATEGIES; s++) {
        const chapter_strategy *st = &PREDICT_STRATEGIES[s];
        if (!runs_on(st, ranks)) continue;
        predict_comparison *c = &out->rows[out->n++];
        *c = (predict_comparison){.ranks = ranks, .strategy = st, .gflops = gflops};
        c->predicted = predict_chapter_run(&bench, BENCH_BATCH, ranks, st, gflops, cores,
                                           o->link, o->link_scale, o->dtype);
        if (!chapter_json_figures(json[st->chapter], st->strategy, &c->measured)) {
            fprintf(stderr, "predict: chapter %d printed no run '%s'\n", st->chapter,
                    st->strategy);
            return 0;
        }
        if (!states_match(c)) out->state_mismatches++;
        if (activation_error(c) > out->worst_activation)
            out->worst_activation = activation_error(c);
    }
    return 1;
}

/* Runs chapters 1-5 on `ranks` ranks and compares; 0 when one fails or lacks a run. */
static int compare_on(const char *programs_dir, const predict_options *o, int ranks,
                      double gflops, int cores, comparisons *out) {
    char *json[CHAPTERS + 1] = {0};
    int ok = 1;
    for (int chapter = 1; chapter <= CHAPTERS && ok; chapter++) {
        if (chapter == 5 && ranks != 4) continue;   /* its mesh is 2 x 2 */
        json[chapter] = run_chapter_json(programs_dir, chapter, ranks, o);
        ok = json[chapter] != NULL;
    }
    ok = ok && compare_strategies(json, ranks, gflops, cores, o, out);
    for (int chapter = 1; chapter <= CHAPTERS; chapter++) free(json[chapter]);
    return ok;
}

int predict_chapters_in(const char *programs_dir, const predict_options *o,
                        double *worst_activation, int *state_mismatches) {
    const int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    comparisons all = {.n = 0};
    double gflops[2];
    *worst_activation = 0;
    *state_mismatches = 0;
    for (int r = 0; r < 2; r++) {
        const int ranks = rank_counts[r];
        gflops[r] = measure_sgemm_gflops(BENCH_BATCH / ranks * bench.ctx, bench.dim);
        if (!compare_on(programs_dir, o, ranks, gflops[r], cores, &all)) return 2;
    }
    *worst_activation = all.worst_activation;
    *state_mismatches = all.state_mismatches;
    if (o->json)
        predict_print_json(all.rows, all.n, o->dtype);
    else
        predict_print_table(all.rows, all.n, gflops[0], gflops[1], cores, o->dtype);
    /* chapter 9's rows: predict_sequence's formulas are fp32's */
    if (o->dtype == PRECISION_FP32 &&
        !predict_sequence_in(programs_dir, o, state_mismatches, worst_activation))
        return 2;
    if (o->dtype != PRECISION_FP32 && !o->json)
        printf("\n(chapter 9's rows are predicted in fp32 only: predict_sequence's formulas are fp32's)\n");
    double mesh_activations;
    if (!predict_mesh_in(programs_dir, o, state_mismatches, &mesh_activations)) return 2;
    const int ok = *state_mismatches == 0 && *worst_activation <= 0.10 &&
                   mesh_activations <= PREDICT_MESH_ACTIVATION_TOLERANCE;
    if (o->json) printf(",\n \"ok\": %s}\n", ok ? "true" : "false");
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
        printf("%s: %d model-state and sent-byte figures differ, activations at most %.2f%%"
               " off\n",
               status == 0 ? "OK" : "FAILED", mismatches, 100 * worst);
    return status;
}
