/* Drawing pipeline spans as text rows for the terminal (the SVG: pp_draw_svg.c). */
#include "pp_draw.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"

void pp_draw_time_range(const pp_span *spans, int n, double *t0, double *t1) {
    *t0 = n ? spans[0].start : 0;
    *t1 = n ? spans[0].end : 1;
    for (int i = 1; i < n; i++) {
        if (spans[i].start < *t0) *t0 = spans[i].start;
        if (spans[i].end > *t1) *t1 = spans[i].end;
    }
    if (*t1 <= *t0) *t1 = *t0 + 1;
}

int pp_draw_chunks(const pp_span *spans, int n) {
    int most = 0;
    for (int i = 0; i < n; i++)
        if (pp_op_is_compute(spans[i].kind) && spans[i].chunk > most) most = spans[i].chunk;
    return most + 1;
}

static char pass_letter(const pp_span *s) {
    return s->kind == PP_FORWARD ? 'F' : s->kind == PP_BACKWARD_WEIGHT ? 'W' : 'B';
}

/* ---- one chunk per rank: a pass is a run of columns proportional to its time ---------- */

/* Cells [c0, c1) of row: the label when it fits (padded with '-'), else the letter. */
static void draw_columns(char *row, int c0, int c1, const pp_span *s) {
    char label[16];
    int len = snprintf(label, sizeof label, "%c%d", pass_letter(s), s->micro);
    for (int c = c0; c < c1; c++)
        row[c] = len <= c1 - c0 ? (c - c0 < len ? label[c - c0] : '-') : label[0];
}

static void draw_proportional(FILE *out, const pp_span *spans, int nspans, int ranks,
                              int width, double ms_per_unit) {
    double t0, t1;
    pp_draw_time_range(spans, nspans, &t0, &t1);
    double columns_per_unit = width / (t1 - t0);
    char *row = mem_alloc(MEM_OTHER, (size_t)width + 1);
    for (int r = 0; r < ranks; r++) {
        memset(row, ' ', (size_t)width);
        for (int i = 0; i < nspans; i++) {
            if (spans[i].rank != r || !pp_op_is_compute(spans[i].kind)) continue;
            int c0 = (int)lround((spans[i].start - t0) * columns_per_unit);
            int c1 = (int)lround((spans[i].end - t0) * columns_per_unit);
            if (c1 <= c0) c1 = c0 + 1;   /* every pass stays visible */
            if (c1 > width) c1 = width;
            if (c0 >= width) c0 = width - 1;
            draw_columns(row, c0, c1, &spans[i]);
        }
        row[width] = 0;
        fprintf(out, "  rank %-3d |%s|\n", r, row);
    }
    double scale = ms_per_unit > 0 ? ms_per_unit : 1;
    const char *unit = ms_per_unit > 0 ? " ms" : "";
    char end[32];
    snprintf(end, sizeof end, "%.4g%s", (t1 - t0) * scale, unit);
    fprintf(out, "           0%*s\n", width + 1 - 1, end);
    fprintf(out, "           one column = %.3g%s; F forward, B backward (zb-h1: B input"
            " gradient, W weight gradient); blank: idle\n",
            (t1 - t0) * scale / width, ms_per_unit > 0 ? " ms" : " time units");
    mem_free(row);
}

/* ---- several chunks per rank: fixed-width cells "F3.1" ------------------------------- */
/* A pass of a chunk is short (1/v of a stage's): drawn in proportion, the labels of
 * neighbouring passes ran together ("F0FF2Ff0f1"). Here time is cut into cells as long
 * as a chunk's forward, and each pass starts with a cell holding its letter, micro-batch
 * and chunk, each as wide as the widest, so that every label stands apart. */

typedef struct {
    int micro_digits, chunk_digits, width;   /* width: of one cell, in characters */
    double cell_time;                        /* in the spans' units */
} cell_format;

static int digits(int n) {
    int d = 1;
    while (n >= 10) n /= 10, d++;
    return d;
}

static int by_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A cell lasts the median forward: a chunk's forward, as modelled or as measured. */
static double median_forward(const pp_span *spans, int n, double range) {
    double *d = malloc(sizeof *d * (size_t)(n ? n : 1));
    int count = 0;
    for (int i = 0; i < n; i++)
        if (spans[i].kind == PP_FORWARD && spans[i].end > spans[i].start)
            d[count++] = spans[i].end - spans[i].start;
    qsort(d, (size_t)count, sizeof *d, by_double);
    double median = count ? d[count / 2] : range / 100;
    free(d);
    return median;
}

static cell_format cell_format_of(const pp_span *spans, int n, double range) {
    int micro = 0, chunk = 0;
    for (int i = 0; i < n; i++) {
        if (!pp_op_is_compute(spans[i].kind)) continue;
        if (spans[i].micro > micro) micro = spans[i].micro;
        if (spans[i].chunk > chunk) chunk = spans[i].chunk;
    }
    cell_format f = {.micro_digits = digits(micro), .chunk_digits = digits(chunk)};
    f.width = 1 + f.micro_digits + 1 + f.chunk_digits;
    f.cell_time = median_forward(spans, n, range);
    return f;
}

void pp_draw_cell_label(const pp_span *s, int micro_digits, int chunk_digits, char *out,
                        size_t size) {
    snprintf(out, size, "%c%0*d.%0*d", pass_letter(s), micro_digits, s->micro, chunk_digits,
             s->chunk);
}

static int by_rank_then_start(const void *a, const void *b) {
    const pp_span *x = *(const pp_span *const *)a, *y = *(const pp_span *const *)b;
    if (x->rank != y->rank) return x->rank - y->rank;
    return (x->start > y->start) - (x->start < y->start);
}

/* The passes in order of rank and start, each given cells [first, last): the nearest
 * to its time, moved right where a late neighbour still holds them, so that no pass is
 * hidden. Returns the passes; *ncells is the longest row. */
static const pp_span **place_passes(const pp_span *spans, int n, double t0, cell_format f,
                                    int *first, int *last, int *count, int *ncells) {
    const pp_span **passes = malloc(sizeof *passes * (size_t)(n ? n : 1));
    int k = 0;
    for (int i = 0; i < n; i++)
        if (pp_op_is_compute(spans[i].kind)) passes[k++] = &spans[i];
    qsort(passes, (size_t)k, sizeof *passes, by_rank_then_start);
    *ncells = 1;
    for (int i = 0, free_from = 0; i < k; i++) {
        if (i == 0 || passes[i]->rank != passes[i - 1]->rank) free_from = 0;
        int c0 = (int)lround((passes[i]->start - t0) / f.cell_time);
        int c1 = (int)lround((passes[i]->end - t0) / f.cell_time);
        if (c1 <= c0) c1 = c0 + 1;
        if (c0 < free_from) c1 += free_from - c0, c0 = free_from;
        first[i] = c0, last[i] = free_from = c1;
        if (c1 > *ncells) *ncells = c1;
    }
    *count = k;
    return passes;
}

static void print_band(FILE *out, char *const *rows, int ranks, int from, int to,
                       cell_format f, double scale, const char *unit) {
    for (int r = 0; r < ranks; r++)
        fprintf(out, "  rank %-3d |%.*s|\n", r, (to - from) * f.width, rows[r] + from * f.width);
    char start[32], end[32];
    snprintf(start, sizeof start, "%.4g", from * f.cell_time * scale);
    snprintf(end, sizeof end, "%.4g%s", to * f.cell_time * scale, unit);
    int room = (to - from) * f.width + 1 - (int)strlen(start);
    if (room <= (int)strlen(end)) room = (int)strlen(end) + 1;
    fprintf(out, "           %s%*s\n", start, room, end);
}

static void draw_cells(FILE *out, const pp_span *spans, int nspans, int ranks, int width,
                       double ms_per_unit) {
    double t0, t1;
    pp_draw_time_range(spans, nspans, &t0, &t1);
    const cell_format f = cell_format_of(spans, nspans, t1 - t0);
    int *first = malloc(sizeof(int) * (size_t)(nspans + 1));
    int *last = malloc(sizeof(int) * (size_t)(nspans + 1)), npasses, ncells;
    const pp_span **passes = place_passes(spans, nspans, t0, f, first, last, &npasses, &ncells);
    char **rows = malloc(sizeof *rows * (size_t)ranks);
    for (int r = 0; r < ranks; r++) {
        rows[r] = malloc((size_t)ncells * f.width);
        memset(rows[r], ' ', (size_t)ncells * f.width);
    }
    for (int i = 0; i < npasses; i++) {
        if (passes[i]->rank < 0 || passes[i]->rank >= ranks) continue;
        char *row = rows[passes[i]->rank], label[48];
        pp_draw_cell_label(passes[i], f.micro_digits, f.chunk_digits, label, sizeof label);
        memcpy(row + first[i] * f.width, label, (size_t)f.width);
        memset(row + (first[i] + 1) * f.width, '-', (size_t)(last[i] - first[i] - 1) * f.width);
    }
    const double scale = ms_per_unit > 0 ? ms_per_unit : 1;
    const char *unit = ms_per_unit > 0 ? " ms" : "";
    /* bands of equal length, none longer than width */
    const int most = width / f.width > 0 ? width / f.width : 1;
    const int bands = (ncells + most - 1) / most, per_band = (ncells + bands - 1) / bands;
    for (int from = 0; from < ncells; from += per_band) {
        if (from > 0) fprintf(out, "\n");
        const int to = from + per_band < ncells ? from + per_band : ncells;
        print_band(out, rows, ranks, from, to, f, scale, unit);
    }
    fprintf(out, "           one cell = %.3g%s; F3.1: forward of micro-batch 3, chunk 1 (virtual"
            " stage 1 x p + rank; in a V 2p-1-rank); B backward; ----: the pass goes on;"
            " blank: idle\n",
            f.cell_time * scale, ms_per_unit > 0 ? " ms" : " time units");
    for (int r = 0; r < ranks; r++) free(rows[r]);
    free(rows);
    free(passes);
    free(first);
    free(last);
}

void pp_draw_text(FILE *out, const pp_span *spans, int nspans, int ranks, int width,
                  double ms_per_unit) {
    if (width < 10) width = 10;
    if (pp_draw_chunks(spans, nspans) > 1)
        draw_cells(out, spans, nspans, ranks, width, ms_per_unit);
    else
        draw_proportional(out, spans, nspans, ranks, width, ms_per_unit);
}
