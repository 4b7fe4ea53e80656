/* --predict-chapters' chapter 9 rows (predict.h): the bytes a rank sends per step under
 * Megatron sequence parallelism and under context parallelism, predicted from the
 * library's own formulas and compared to the byte with chapter 9's measured
 * bytes_sent_per_rank_per_step; TP + SP's activations within 10%. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cp_attention.h"
#include "json.h"
#include "predict.h"
#include "tp_train.h"

/* bench256 as --predict-chapters runs it (predict.c) */
static const gpt_config bench = {.vocab = 256, .ctx = 64, .layers = 4, .heads = 4, .dim = 256};
enum { BENCH_BATCH = 8, FLOAT_BYTES = 4 };

typedef struct {
    const char *part, *key, *value;   /* the run: part, and its runs' entry key = value */
    int cp_kind;                      /* -1: TP + SP; else a cp_attention_kind */
} sequence_run;

static const sequence_run sequence_runs[] = {
    {"sp", "strategy", "tp+sp", -1},
    {"context", "attention", "ring", CP_RING},   /* balanced: --cp-split balanced */
    {"context", "attention", "ulysses", CP_ULYSSES},
};
enum { SEQUENCE_RUNS = 3 };

/* Elements of the whole model, as every CP rank holds it. */
static double whole_elements(const gpt_config *c) {
    const double h = c->dim;
    return ((double)c->vocab + c->ctx) * h + c->layers * (12 * h * h + 13 * h) + 2 * h;
}

/* TP + SP on every rank (chapter 9's default --tp; dp 1): TP's all-reduces, SP's
 * gathers again, its LayerNorm gradients; context: every layer's attention traffic and
 * the gradient all-reduce over the cp ranks (chapter 9's default --cp: every rank). */
double predict_sequence_bytes(int cp_kind, int ranks) {
    const gpt_config *c = &bench;
    if (cp_kind < 0)
        return tp_sequence_bytes_formula(c, PRECISION_FP32, BENCH_BATCH, c->ctx, ranks, 1,
                                         (size_t)predict_tp_elements(c, ranks, PRECISION_FP32));
    const double attention = c->layers * cp_attention_bytes_formula(
                                             (cp_attention_kind)cp_kind, ranks, BENCH_BATCH,
                                             c->ctx, c->dim, PRECISION_FP32);
    return attention + 2.0 * (ranks - 1) / ranks * whole_elements(c) * FLOAT_BYTES;
}

/* TP's activations (chapter 3's prediction) less what SP splits t ways: the 4 h per
 * token TP keeps whole and the 4 LayerNorm statistics, in every layer; plus SP's one
 * [B, T, C] scratch for a row-parallel output's partial sums (tp_sequence.h). */
static double predicted_sp_activations(int tp) {
    const chapter_strategy as_tp = {3, "tp", tp, 0, 0, 0};
    const double tp_only = predict_chapter_run(&bench, BENCH_BATCH, tp, &as_tp, 1, 1, LINK_NONE,
                                               1, PRECISION_FP32).activations;
    const double tokens = (double)BENCH_BATCH * bench.ctx, split = 1 - 1.0 / tp;
    const double saved = bench.layers * tokens * (4.0 * bench.dim + 4) * split * FLOAT_BYTES;
    return tp_only - saved + tokens * bench.dim * FLOAT_BYTES;
}

typedef struct {
    int ranks;
    const sequence_run *run;
    double bytes[2], activations[2];   /* predicted, measured; activations 0: none */
} sequence_row;

/* The run's measured figures from its chapter 9 --json; 0 when missing. */
static int measured(const char *json, sequence_row *row) {
    char err[256];
    json_doc *doc = json_parse(json, strlen(json), err, sizeof err);
    if (!doc) return 0;
    const json_value *part = json_get(json_root(doc), row->run->part);
    const json_value *entry = json_find(json_get(part, "runs"), row->run->key, row->run->value);
    int ok = entry && json_double(json_get(entry, "bytes_sent_per_rank_per_step"),
                                  &row->bytes[1]);
    if (ok && row->run->cp_kind < 0)
        ok = json_double(json_get(entry, "activations_peak"), &row->activations[1]);
    json_free(doc);
    return ok;
}

static void print_rows(const sequence_row *rows, int n, const predict_options *o) {
    if (o->json) {
        printf(",\n \"sequence\": [");
        for (int i = 0; i < n; i++)
            printf("%s\n  {\"chapter\": 9, \"strategy\": \"%s\", \"ranks\": %d, \"predicted\":"
                   " {\"bytes_sent_per_rank_per_step\": %.0f, \"activations\": %.0f},"
                   " \"measured\": {\"bytes_sent_per_rank_per_step\": %.0f, \"activations\":"
                   " %.0f}}", i ? "," : "", rows[i].run->value, rows[i].ranks, rows[i].bytes[0],
                   rows[i].activations[0], rows[i].bytes[1], rows[i].activations[1]);
        printf("]");
        return;
    }
    printf("\nchapter 9 (fp32): bytes sent per rank per step (the largest rank) and TP + SP's"
           " activations\n%-14s %5s %28s %30s\n", "", "ranks", "sent pred = measured",
           "activations pred / measured");
    for (int i = 0; i < n; i++) {
        const sequence_row *r = &rows[i];
        printf("%-14s %5d %13.0f %s %.0f", r->run->cp_kind < 0 ? "tp+sp"
                                           : r->run->cp_kind == CP_RING ? "ring balanced"
                                                                        : "ulysses",
               r->ranks, r->bytes[0], r->bytes[0] == r->bytes[1] ? "=" : "!", r->bytes[1]);
        if (r->activations[1] > 0)
            printf("%*s %10.0f %10.0f %+6.1f%%", 13 - (int)log10(r->bytes[1]) - 1, "",
                   r->activations[0], r->activations[1],
                   100 * (r->activations[0] / r->activations[1] - 1));
        printf("\n");
    }
}

int predict_sequence_in(const char *programs_dir, const predict_options *o, int *mismatches,
                        double *worst) {
    static const char *const flags[] = {" --part sp", " --part context --cp-split balanced"};
    sequence_row rows[2 * SEQUENCE_RUNS];
    int n = 0;
    for (int ranks = 2; ranks <= 4; ranks *= 2) {
        char *json[2];
        for (int k = 0; k < 2; k++) json[k] = run_chapter_json_with(programs_dir, 9, ranks, o,
                                                                     flags[k]);
        int ok = json[0] && json[1];
        for (int i = 0; i < SEQUENCE_RUNS && ok; i++) {
            sequence_row *row = &rows[n++];
            *row = (sequence_row){.ranks = ranks, .run = &sequence_runs[i]};
            row->bytes[0] = predict_sequence_bytes(row->run->cp_kind, ranks);
            if (row->run->cp_kind < 0) row->activations[0] = predicted_sp_activations(ranks);
            ok = measured(json[row->run->cp_kind < 0 ? 0 : 1], row);
            if (!ok) fprintf(stderr, "predict: chapter 9 printed no run '%s'\n", row->run->value);
        }
        free(json[0]);
        free(json[1]);
        if (!ok) return 0;
    }
    for (int i = 0; i < n; i++) {
        if (o->sequence_sent && i < PREDICT_SEQUENCE_ROWS) o->sequence_sent[i] = rows[i].bytes[1];
        if (rows[i].bytes[0] != rows[i].bytes[1]) (*mismatches)++;
        if (rows[i].activations[1] > 0)
            *worst = fmax(*worst, fabs(rows[i].activations[0] / rows[i].activations[1] - 1));
    }
    print_rows(rows, n, o);
    return 1;
}
