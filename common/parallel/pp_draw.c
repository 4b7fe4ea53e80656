/* Drawing pipeline spans: text rows for the terminal and an SVG file. */
#include "pp_draw.h"

#include <ctype.h>
#include <math.h>
#include <string.h>

#include "alloc.h"

static void time_range(const pp_span *spans, int n, double *t0, double *t1) {
    *t0 = n ? spans[0].start : 0;
    *t1 = n ? spans[0].end : 1;
    for (int i = 1; i < n; i++) {
        if (spans[i].start < *t0) *t0 = spans[i].start;
        if (spans[i].end > *t1) *t1 = spans[i].end;
    }
    if (*t1 <= *t0) *t1 = *t0 + 1;
}

static char pass_letter(const pp_span *s) {
    char c = s->kind == PP_FORWARD ? 'F' : s->kind == PP_BACKWARD_WEIGHT ? 'W' : 'B';
    return s->chunk % 2 ? (char)tolower(c) : c;   /* odd chunks of interleaving */
}

/* Cells [c0, c1) of row: the label when it fits (padded with '-'), else the letter. */
static void draw_cells(char *row, int c0, int c1, const pp_span *s) {
    char label[16];
    int len = snprintf(label, sizeof label, "%c%d", pass_letter(s), s->micro);
    for (int c = c0; c < c1; c++)
        row[c] = len <= c1 - c0 ? (c - c0 < len ? label[c - c0] : '-') : label[0];
}

void pp_draw_text(FILE *out, const pp_span *spans, int nspans, int ranks, int width,
                  double ms_per_unit) {
    if (width < 10) width = 10;
    double t0, t1;
    time_range(spans, nspans, &t0, &t1);
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
            draw_cells(row, c0, c1, &spans[i]);
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
            " gradient, W weight gradient), lower case: chunk 1, 3, ...; blank: idle\n",
            (t1 - t0) * scale / width, ms_per_unit > 0 ? " ms" : " time units");
    mem_free(row);
}

/* ---- SVG ---------------------------------------------------------------------------- */
enum { SVG_LEFT = 80, SVG_TOP = 40, SVG_ROW = 26, SVG_WIDTH = 1000, SVG_AXIS = 40 };

static const char *pass_colour(pp_op_kind kind) {
    switch (kind) {
    case PP_FORWARD: return "#4e79a7";
    case PP_BACKWARD: return "#59a14f";
    case PP_BACKWARD_INPUT: return "#f28e2b";
    default: return "#b07aa1";
    }
}

/* 1, 2 or 5 times a power of ten, giving about ten ticks over range. */
static double tick_step(double range) {
    double raw = range / 10, mag = pow(10, floor(log10(raw)));
    return raw <= mag ? mag : raw <= 2 * mag ? 2 * mag : raw <= 5 * mag ? 5 * mag : 10 * mag;
}

static void svg_axis(FILE *f, double range, double scale, const char *unit, int y) {
    double step = tick_step(range * scale);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#333\"/>\n", SVG_LEFT, y,
            SVG_LEFT + SVG_WIDTH, y);
    for (double t = 0; t <= range * scale * (1 + 1e-9); t += step) {
        double x = SVG_LEFT + t / (range * scale) * SVG_WIDTH;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#333\"/>"
                "<text x=\"%.1f\" y=\"%d\" font-size=\"11\" text-anchor=\"middle\">%g</text>\n",
                x, y, x, y + 5, x, y + 18, t);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"12\" text-anchor=\"middle\">time (%s)</text>\n",
            SVG_LEFT + SVG_WIDTH / 2, y + 34, unit);
}

static void svg_span(FILE *f, const pp_span *s, double t0, double px_per_unit) {
    double x = SVG_LEFT + (s->start - t0) * px_per_unit, w = (s->end - s->start) * px_per_unit;
    int y = SVG_TOP + s->rank * SVG_ROW;
    fprintf(f, "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\" "
            "fill-opacity=\"%s\" stroke=\"white\" stroke-width=\"0.5\"><title>%s micro %d chunk"
            " %d</title></rect>\n", x, y + 2, w > 0.5 ? w : 0.5, SVG_ROW - 4,
            pass_colour(s->kind), s->chunk % 2 ? "0.6" : "1", pp_op_kind_name(s->kind),
            s->micro, s->chunk);
    if (w >= 14)
        fprintf(f, "<text x=\"%.2f\" y=\"%d\" font-size=\"11\" fill=\"white\" "
                "text-anchor=\"middle\">%d</text>\n", x + w / 2, y + SVG_ROW / 2 + 4, s->micro);
}

int pp_draw_svg(const char *path, const pp_span *spans, int nspans, int ranks,
                double ms_per_unit, const char *title) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "cannot write the SVG to %s\n", path);
        return -1;
    }
    double t0, t1;
    time_range(spans, nspans, &t0, &t1);
    int height = SVG_TOP + ranks * SVG_ROW + SVG_AXIS + 20;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "font-family=\"sans-serif\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
            "<text x=\"%d\" y=\"22\" font-size=\"14\">%s</text>\n", SVG_LEFT + SVG_WIDTH + 20,
            height, SVG_LEFT, title ? title : "pipeline schedule");
    for (int r = 0; r < ranks; r++)
        fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"12\" text-anchor=\"end\">rank %d</text>\n",
                SVG_LEFT - 8, SVG_TOP + r * SVG_ROW + SVG_ROW / 2 + 4, r);
    double px_per_unit = SVG_WIDTH / (t1 - t0);
    for (int i = 0; i < nspans; i++)
        if (pp_op_is_compute(spans[i].kind)) svg_span(f, &spans[i], t0, px_per_unit);
    svg_axis(f, t1 - t0, ms_per_unit > 0 ? ms_per_unit : 1, ms_per_unit > 0 ? "ms" : "units",
             SVG_TOP + ranks * SVG_ROW + 4);
    fprintf(f, "</svg>\n");
    if (fclose(f) != 0) {
        fprintf(stderr, "cannot write the SVG to %s\n", path);
        return -1;
    }
    return 0;
}
