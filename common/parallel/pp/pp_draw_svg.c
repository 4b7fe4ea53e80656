/* Drawing pipeline spans as an SVG file: one row per rank, one box per pass, a time
 * axis and a legend. Every <rect> is the background or a pass (the legend's swatches
 * are paths), so a reader can count the passes. */
#include "pp_draw.h"

#include <math.h>
#include <string.h>

enum { SVG_LEFT = 80, SVG_TOP = 40, SVG_ROW = 26, SVG_WIDTH = 1000, SVG_MAX_WIDTH = 8000,
       SVG_AXIS = 40, SVG_LEGEND_ROW = 22, SVG_LEGEND_CHUNKS = 8 };
/* A label's width at font size 11: about 7 px per character, and a margin. */
static const double label_px_per_char = 7, label_margin_px = 4, label_font = 11;

typedef struct { int r, g, b; } rgb;

static rgb base_colour(pp_op_kind kind) {
    switch (kind) {
    case PP_FORWARD: return (rgb){0x4e, 0x79, 0xa7};          /* blue */
    case PP_BACKWARD: return (rgb){0x59, 0xa1, 0x4f};         /* green */
    case PP_BACKWARD_INPUT: return (rgb){0xf2, 0x8e, 0x2b};   /* orange */
    default: return (rgb){0xb0, 0x7a, 0xa1};                  /* purple: W */
    }
}

/* Chunk c of v: from a dark shade of the pass's colour (c = 0) to a light one (c = v-1),
 * evenly, so that every chunk has a shade of its own. */
static rgb pass_colour(pp_op_kind kind, int chunk, int chunks) {
    rgb c = base_colour(kind);
    if (chunks <= 1) return c;
    const double t = (double)chunk / (chunks - 1), dark = 0.55, light = 0.6;
    int *channel[3] = {&c.r, &c.g, &c.b};
    for (int i = 0; i < 3; i++) {
        const double lo = *channel[i] * dark, hi = *channel[i] + (255 - *channel[i]) * light;
        *channel[i] = (int)lround(lo + (hi - lo) * t);
    }
    return c;
}

/* White on dark shades, near-black on light ones. */
static const char *text_colour(rgb c) {
    return 0.299 * c.r + 0.587 * c.g + 0.114 * c.b > 150 ? "#222" : "white";
}

static const char *kind_meaning(pp_op_kind kind) {
    switch (kind) {
    case PP_FORWARD: return "F forward";
    case PP_BACKWARD: return "B backward";
    case PP_BACKWARD_INPUT: return "B input gradient";
    default: return "W weight gradient";
    }
}

typedef struct {
    double t0, range, px_per_unit;
    int chunks, width;     /* width: of the time axis, in px */
} layout;

/* 1, 2 or 5 times a power of ten, giving about ten ticks over range. */
static double tick_step(double range) {
    double raw = range / 10, mag = pow(10, floor(log10(raw)));
    return raw <= mag ? mag : raw <= 2 * mag ? 2 * mag : raw <= 5 * mag ? 5 * mag : 10 * mag;
}

static void svg_axis(FILE *f, const layout *l, double scale, const char *unit, int y) {
    const double range = l->range * scale, step = tick_step(range);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#333\"/>\n", SVG_LEFT, y,
            SVG_LEFT + l->width, y);
    for (double t = 0; t <= range * (1 + 1e-9); t += step) {
        double x = SVG_LEFT + t / range * l->width;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#333\"/>"
                "<text x=\"%.1f\" y=\"%d\" font-size=\"11\" text-anchor=\"middle\">%g</text>\n",
                x, y, x, y + 5, x, y + 18, t);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"12\" text-anchor=\"middle\">time (%s)</text>\n",
            SVG_LEFT + l->width / 2, y + 34, unit);
}

/* The label of a box: its micro-batch, and ".chunk" when there are several. */
static int box_label(const pp_span *s, int chunks, char *out, size_t size) {
    return chunks > 1 ? snprintf(out, size, "%d.%d", s->micro, s->chunk)
                      : snprintf(out, size, "%d", s->micro);
}

static void svg_span(FILE *f, const pp_span *s, const layout *l) {
    double x = SVG_LEFT + (s->start - l->t0) * l->px_per_unit;
    double w = (s->end - s->start) * l->px_per_unit;
    int y = SVG_TOP + s->rank * SVG_ROW;
    const rgb c = pass_colour(s->kind, s->chunk, l->chunks);
    fprintf(f, "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"#%02x%02x%02x\""
            " stroke=\"white\" stroke-width=\"0.5\"><title>%s micro %d chunk %d</title></rect>\n",
            x, y + 2, w > 0.5 ? w : 0.5, SVG_ROW - 4, c.r, c.g, c.b, pp_op_kind_name(s->kind),
            s->micro, s->chunk);
    /* every box is labelled: the font shrinks where a box is narrower than its label */
    char label[32];
    const int len = box_label(s, l->chunks, label, sizeof label);
    double font = (w - label_margin_px) / (len * label_px_per_char) * label_font;
    if (font > label_font) font = label_font;
    if (font < 3) font = 3;
    fprintf(f, "<text x=\"%.2f\" y=\"%d\" font-size=\"%.1f\" fill=\"%s\" "
            "text-anchor=\"middle\">%s</text>\n", x + w / 2, y + SVG_ROW / 2 + 4, font,
            text_colour(c), label);
}

static void swatch(FILE *f, int x, int y, rgb c) {
    fprintf(f, "<path d=\"M%d %dh14v14h-14z\" fill=\"#%02x%02x%02x\"/>", x, y, c.r, c.g, c.b);
}

/* The kinds of pass drawn, then (several chunks) each chunk's shades of F and B. */
static void svg_legend(FILE *f, const pp_span *spans, int nspans, const layout *l, int y) {
    int present[PP_NKINDS] = {0};
    for (int i = 0; i < nspans; i++)
        if (pp_op_is_compute(spans[i].kind)) present[spans[i].kind] = 1;
    fprintf(f, "<g id=\"legend\" font-size=\"12\">\n");
    int x = SVG_LEFT;
    for (int k = 0; k < PP_NKINDS; k++) {
        if (!present[k]) continue;
        swatch(f, x, y, pass_colour(k, 0, 1));
        fprintf(f, "<text x=\"%d\" y=\"%d\">%s</text>\n", x + 20, y + 12, kind_meaning(k));
        x += 150;
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\">blank: idle</text>\n", x, y + 12);
    const pp_op_kind backward = present[PP_BACKWARD] ? PP_BACKWARD : PP_BACKWARD_INPUT;
    y += SVG_LEGEND_ROW;
    for (int c = 0; l->chunks > 1 && c < l->chunks && c < SVG_LEGEND_CHUNKS; c++) {
        x = SVG_LEFT + c * 120;
        swatch(f, x, y, pass_colour(PP_FORWARD, c, l->chunks));
        swatch(f, x + 16, y, pass_colour(backward, c, l->chunks));
        fprintf(f, "<text x=\"%d\" y=\"%d\">chunk %d</text>\n", x + 36, y + 12, c);
    }
    if (l->chunks > SVG_LEGEND_CHUNKS)
        fprintf(f, "<text x=\"%d\" y=\"%d\">... chunk %d (lighter: later chunks)</text>\n",
                SVG_LEFT + SVG_LEGEND_CHUNKS * 120, y + 12, l->chunks - 1);
    fprintf(f, "</g>\n");
}

/* Wide enough that the shortest pass holds its label at full size, up to a limit. */
static layout layout_of(const pp_span *spans, int nspans) {
    layout l = {.chunks = pp_draw_chunks(spans, nspans), .width = SVG_WIDTH};
    double t1, shortest = 0;
    pp_draw_time_range(spans, nspans, &l.t0, &t1);
    l.range = t1 - l.t0;
    int longest_label = 1;
    for (int i = 0; i < nspans; i++) {
        if (!pp_op_is_compute(spans[i].kind)) continue;
        char label[32];
        const int len = box_label(&spans[i], l.chunks, label, sizeof label);
        const double d = spans[i].end - spans[i].start;
        if (len > longest_label) longest_label = len;
        if (d > 0 && (shortest == 0 || d < shortest)) shortest = d;
    }
    if (shortest > 0) {
        const double need = (longest_label * label_px_per_char + label_margin_px) / shortest;
        const double wanted = ceil(need * l.range);
        if (wanted > l.width) l.width = wanted < SVG_MAX_WIDTH ? (int)wanted : SVG_MAX_WIDTH;
    }
    l.px_per_unit = l.width / l.range;
    return l;
}

int pp_draw_svg(const char *path, const pp_span *spans, int nspans, int ranks,
                double ms_per_unit, const char *title) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "cannot write the SVG to %s\n", path);
        return -1;
    }
    const layout l = layout_of(spans, nspans);
    const int axis_y = SVG_TOP + ranks * SVG_ROW + 4, legend_y = axis_y + SVG_AXIS + 10;
    const int height = legend_y + 2 * SVG_LEGEND_ROW + 10;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "font-family=\"sans-serif\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
            "<text x=\"%d\" y=\"22\" font-size=\"14\">%s</text>\n", SVG_LEFT + l.width + 20,
            height, SVG_LEFT, title ? title : "pipeline schedule");
    for (int r = 0; r < ranks; r++)
        fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"12\" text-anchor=\"end\">rank %d</text>\n",
                SVG_LEFT - 8, SVG_TOP + r * SVG_ROW + SVG_ROW / 2 + 4, r);
    for (int i = 0; i < nspans; i++)
        if (pp_op_is_compute(spans[i].kind)) svg_span(f, &spans[i], &l);
    svg_axis(f, &l, ms_per_unit > 0 ? ms_per_unit : 1, ms_per_unit > 0 ? "ms" : "units", axis_y);
    svg_legend(f, spans, nspans, &l, legend_y);
    fprintf(f, "</svg>\n");
    if (fclose(f) != 0) {
        fprintf(stderr, "cannot write the SVG to %s\n", path);
        return -1;
    }
    return 0;
}
