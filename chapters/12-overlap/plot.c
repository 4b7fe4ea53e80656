/* --svg FILE: predicted time per step against the inter-node bandwidth for FSDP across
 * both nodes, HSDP and ZeRO++ (all three pieces): the table's compute (FSDP's step with
 * no link model, measured: the three do the same arithmetic) plus zeropp_step_predict's
 * wire, the intra-node link and the inter-node latency as the table's, the inter-node
 * bandwidth swept on a log scale; the measured steps of the table's two links as dots,
 * and the bandwidths where two lines cross (found by bisection on the prediction). */
#include "overlap.h"

#include <math.h>
#include <stdio.h>

#include "zeropp.h"

enum { WIDTH = 760, HEIGHT = 460, LEFT = 80, RIGHT = 170, TOP = 40, BOTTOM = 60, SAMPLES = 200 };
enum { CURVES = 3 };
static const int curve_rows[CURVES] = {ROW_FSDP, ROW_HSDP, ROW_ZEROPP};
static const int curve_pieces[CURVES] = {0, 0, ZEROPP_ALL}, curve_hsdp[CURVES] = {0, 1, 0};
static const char *const colours[CURVES] = {"#d62728", "#1f77b4", "#2ca02c"};
static const double log_lo = 6, log_hi = 11;   /* bytes/s, after the link scale */

/* Predicted ms per step of curve k at inter-node bandwidth beta (bytes/s). */
double plot_step_ms(const run_config *cfg, double compute_ms, int k, double beta) {
    const gpt_shape s = gpt_shape_make(&cfg->model, 1, 0);
    zeropp_links links = zeropp_links_of(&cfg->comm);
    links.beta[COMM_TIER_INTER] = beta;
    double bytes[2];
    return compute_ms + 1e3 * zeropp_step_predict(&s, curve_pieces[k], curve_hsdp[k],
                                                  cfg->comm.ranks, cfg->comm.ranks_per_node,
                                                  &links, bytes);
}

int plot_crossing(const run_config *cfg, double compute_ms, int a, int b, double *beta) {
    double lo = log_lo, hi = log_hi;
    const double d_lo = plot_step_ms(cfg, compute_ms, a, pow(10, lo)) -
                        plot_step_ms(cfg, compute_ms, b, pow(10, lo));
    const double d_hi = plot_step_ms(cfg, compute_ms, a, pow(10, hi)) -
                        plot_step_ms(cfg, compute_ms, b, pow(10, hi));
    if ((d_lo > 0) == (d_hi > 0)) return 0;   /* one below the other all along */
    for (int i = 0; i < 60; i++) {
        const double mid = 0.5 * (lo + hi);
        const double d = plot_step_ms(cfg, compute_ms, a, pow(10, mid)) -
                         plot_step_ms(cfg, compute_ms, b, pow(10, mid));
        if ((d > 0) == (d_lo > 0)) lo = mid;
        else hi = mid;
    }
    *beta = pow(10, 0.5 * (lo + hi));
    return 1;
}

static double x_of(double beta) {
    return LEFT + (log10(beta) - log_lo) / (log_hi - log_lo) * (WIDTH - LEFT - RIGHT);
}

static double y_of(double ms, double top_ms) {
    return TOP + (1 - fmin(ms, top_ms) / top_ms) * (HEIGHT - TOP - BOTTOM);
}

static void draw_axes(FILE *f, double top_ms, double scale) {
    fprintf(f, "<path d='M%d %d V%d H%d' fill='none' stroke='black'/>\n", LEFT, TOP,
            HEIGHT - BOTTOM, WIDTH - RIGHT);
    for (int i = 0; i <= 4; i++) {
        const double ms = top_ms * i / 4, y = y_of(ms, top_ms);
        fprintf(f, "<text x='%d' y='%.1f' text-anchor='end' font-size='11'>%.0f</text>\n",
                LEFT - 6, y + 4, ms);
        fprintf(f, "<line x1='%d' y1='%.1f' x2='%d' y2='%.1f' stroke='#ddd'/>\n", LEFT, y,
                WIDTH - RIGHT, y);
    }
    for (int p = (int)log_lo; p <= (int)log_hi; p++)
        fprintf(f, "<text x='%.1f' y='%d' text-anchor='middle' font-size='11'>1e%d</text>\n",
                x_of(pow(10, p)), HEIGHT - BOTTOM + 16, p);
    fprintf(f, "<text x='%d' y='%d' text-anchor='middle' font-size='12'>inter-node bandwidth,"
            " bytes/s (links slowed %gx)</text>\n", (LEFT + WIDTH - RIGHT) / 2, HEIGHT - 16,
            scale);
    fprintf(f, "<text x='16' y='%d' font-size='12' transform='rotate(-90 16 %d)'>ms per"
            " step</text>\n", HEIGHT / 2, HEIGHT / 2);
    fprintf(f, "<text x='%d' y='24' font-size='14'>Time per step against the inter-node"
            " link: alpha-beta (lines), measured (dots), crossings (x)</text>\n", LEFT);
}

static void draw_curve(FILE *f, const run_config *cfg, double compute_ms, int k, double top_ms) {
    fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='2' points='", colours[k]);
    for (int i = 0; i <= SAMPLES; i++) {
        const double beta = pow(10, log_lo + (log_hi - log_lo) * i / SAMPLES);
        fprintf(f, "%.1f,%.1f ", x_of(beta), y_of(plot_step_ms(cfg, compute_ms, k, beta), top_ms));
    }
    fprintf(f, "'/>\n<text x='%d' y='%d' font-size='12' fill='%s'>%s</text>\n",
            WIDTH - RIGHT + 10, TOP + 20 + 18 * k, colours[k],
            k == 2 ? "ZeRO++ all" : k == 1 ? "HSDP" : "FSDP 2 nodes");
}

int plot_write_svg(const char *path, const run_config *cfg, const tier_table *tables, int count) {
    FILE *f = fopen(path, "w");
    if (!f) return 1;
    const double compute_ms = tables[0].rows[ROW_FSDP].reference_ms;
    const double top_ms = 1.1 * plot_step_ms(cfg, compute_ms, 0, pow(10, log_lo));
    fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d'"
               " font-family='sans-serif'>\n<rect width='100%%' height='100%%' fill='white'/>\n",
            WIDTH, HEIGHT);
    draw_axes(f, top_ms, cfg->comm.link_scale);
    for (int k = 0; k < CURVES; k++) draw_curve(f, cfg, compute_ms, k, top_ms);
    for (int t = 0; t < count; t++)   /* the measured steps */
        for (int k = 0; k < CURVES; k++) {
            const tier_row *r = &tables[t].rows[curve_rows[k]];
            const double beta = comm_link_spec(tables[t].inter).bandwidth / cfg->comm.link_scale;
            const double ms = r->tokens_per_s > 0 ? 1e3 * cfg->batch * cfg->model.ctx / r->tokens_per_s : 0;
            fprintf(f, "<circle cx='%.1f' cy='%.1f' r='4' fill='%s'/>\n", x_of(beta),
                    y_of(ms, top_ms), colours[k]);
        }
    for (int a = 0; a < CURVES; a++)
        for (int b = a + 1; b < CURVES; b++) {
            double beta;
            if (!plot_crossing(cfg, compute_ms, a, b, &beta)) continue;
            fprintf(f, "<text x='%.1f' y='%.1f' text-anchor='middle' font-size='14'>x</text>\n",
                    x_of(beta), y_of(plot_step_ms(cfg, compute_ms, a, beta), top_ms) + 5);
        }
    fprintf(f, "</svg>\n");
    return fclose(f) != 0;
}

void plot_print_crossings(const run_config *cfg, const tier_table *table) {
    static const char *const names[CURVES] = {"FSDP 2 nodes", "HSDP", "ZeRO++ all"};
    const double compute_ms = table->rows[ROW_FSDP].reference_ms;
    printf("  predicted crossings of time per step against the inter-node bandwidth (1e%.0f to"
           " 1e%.0f B/s, compute %.1f ms):", log_lo, log_hi, compute_ms);
    int any = 0;
    for (int a = 0; a < CURVES; a++)
        for (int b = a + 1; b < CURVES; b++) {
            double beta;
            if (!plot_crossing(cfg, compute_ms, a, b, &beta)) continue;
            printf("%s %s = %s at %.3g B/s", any ? ";" : "", names[a], names[b], beta);
            any = 1;
        }
    if (!any) printf(" none");
    printf("\n    (at 1e%.0f B/s: FSDP %.0f ms, HSDP %.0f, ZeRO++ %.0f; at 1e%.0f: %.1f, %.1f, %.1f)\n",
           log_lo, plot_step_ms(cfg, compute_ms, 0, pow(10, log_lo)),
           plot_step_ms(cfg, compute_ms, 1, pow(10, log_lo)),
           plot_step_ms(cfg, compute_ms, 2, pow(10, log_lo)), log_hi,
           plot_step_ms(cfg, compute_ms, 0, pow(10, log_hi)),
           plot_step_ms(cfg, compute_ms, 1, pow(10, log_hi)),
           plot_step_ms(cfg, compute_ms, 2, pow(10, log_hi)));
}
