/* --svg FILE: efficiency against link bandwidth (log scale) for DDP, FSDP and TP, the
 * measured points on NVLink, InfiniBand and Ethernet, and the alpha-beta prediction
 * as a line. Between the three links the latency is interpolated on the log scale. */
#include "communication.h"

#include <math.h>
#include <stdio.h>

enum { WIDTH = 720, HEIGHT = 440, LEFT = 70, RIGHT = 150, TOP = 40, BOTTOM = 60 };
static const comm_link link_order[LINKS] = {LINK_NVLINK, LINK_IB, LINK_ETHERNET};
static const char *const colours[LINK_STRATEGIES] = {"#1f77b4", "#d62728", "#2ca02c"};

/* A wire of the given bandwidth, its latency interpolated between the course's links. */
static plan_link wire_at(double bandwidth, double scale) {
    plan_link eth = plan_link_scaled(plan_link_of(LINK_ETHERNET), scale);
    plan_link ib = plan_link_scaled(plan_link_of(LINK_IB), scale);
    plan_link nv = plan_link_scaled(plan_link_of(LINK_NVLINK), scale);
    plan_link lo = bandwidth < ib.bandwidth ? eth : ib, hi = bandwidth < ib.bandwidth ? ib : nv;
    double t = log(bandwidth / lo.bandwidth) / log(hi.bandwidth / lo.bandwidth);
    t = t < 0 ? 0 : t > 1 ? 1 : t;
    return (plan_link){bandwidth, exp(log(lo.latency) + t * log(hi.latency / lo.latency))};
}

typedef struct {
    double log_lo, log_hi;
} axis;

static double x_of(const axis *a, double bandwidth) {
    return LEFT + (log10(bandwidth) - a->log_lo) / (a->log_hi - a->log_lo) *
                      (WIDTH - LEFT - RIGHT);
}
/* Up to 100%: every efficiency is at most 1 by construction (on_links.c). */
#define TOP_EFFICIENCY 1.0
static double y_of(double efficiency) {
    if (efficiency > TOP_EFFICIENCY) efficiency = TOP_EFFICIENCY;
    if (efficiency < 0) efficiency = 0;
    return TOP + (1 - efficiency / TOP_EFFICIENCY) * (HEIGHT - TOP - BOTTOM);
}

static void draw_axes(FILE *f, const axis *a, double scale) {
    fprintf(f, "<line x1='%d' y1='%d' x2='%d' y2='%d' stroke='black'/>\n", LEFT,
            HEIGHT - BOTTOM, WIDTH - RIGHT, HEIGHT - BOTTOM);
    fprintf(f, "<line x1='%d' y1='%d' x2='%d' y2='%d' stroke='black'/>\n", LEFT, TOP, LEFT,
            HEIGHT - BOTTOM);
    for (int e = 0; e <= 10; e += 2) {
        double y = y_of(e / 10.0);
        fprintf(f, "<text x='%d' y='%.1f' text-anchor='end' font-size='11'>%d%%</text>\n",
                LEFT - 6, y + 4, 10 * e);
        fprintf(f, "<line x1='%d' y1='%.1f' x2='%d' y2='%.1f' stroke='#ddd'/>\n", LEFT, y,
                WIDTH - RIGHT, y);
    }
    for (int p = (int)ceil(a->log_lo); p <= (int)floor(a->log_hi); p++)
        fprintf(f, "<text x='%.1f' y='%d' text-anchor='middle' font-size='11'>1e%d</text>\n",
                x_of(a, pow(10, p)), HEIGHT - BOTTOM + 16, p);
    fprintf(f, "<text x='%d' y='%d' text-anchor='middle' font-size='12'>link bandwidth,"
            " bytes/s (the course's links slowed %.3gx)</text>\n",
            (LEFT + WIDTH - RIGHT) / 2, HEIGHT - 16, scale);
    fprintf(f, "<text x='%d' y='24' font-size='14'>Scaling efficiency against the wire:"
            " measured (dots), alpha-beta (lines)</text>\n", LEFT);
}

int plot_write_svg(const char *path, const link_strategy_row rows[LINK_STRATEGIES],
                   double link_scale) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", path);
        return -1;
    }
    const double lo = plan_link_of(LINK_ETHERNET).bandwidth / link_scale / 10;
    const double hi = plan_link_of(LINK_NVLINK).bandwidth / link_scale * 10;
    axis a = {floor(log10(lo)), ceil(log10(hi))};
    fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d'"
            " font-family='sans-serif'>\n<rect width='100%%' height='100%%' fill='white'/>\n",
            WIDTH, HEIGHT);
    draw_axes(f, &a, link_scale);
    for (int s = 0; s < LINK_STRATEGIES; s++) {
        fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='2' points='", colours[s]);
        for (int i = 0; i <= 60; i++) {
            double bw = pow(10, a.log_lo + (a.log_hi - a.log_lo) * i / 60.0);
            double e = on_links_predicted_efficiency(&rows[s], wire_at(bw, link_scale));
            fprintf(f, "%.1f,%.1f ", x_of(&a, bw), y_of(e));
        }
        fprintf(f, "'/>\n");
        for (int w = 0; w < LINKS; w++) {
            double bw = plan_link_of(link_order[w]).bandwidth / link_scale;
            fprintf(f, "<circle cx='%.1f' cy='%.1f' r='5' fill='%s'/>\n", x_of(&a, bw),
                    y_of(rows[s].efficiency[w + 1]), colours[s]);
        }
        fprintf(f, "<text x='%d' y='%d' font-size='13' fill='%s'>%s</text>\n",
                WIDTH - RIGHT + 12, TOP + 20 + 20 * s, colours[s], rows[s].strategy);
    }
    static const char *names[LINKS] = {"NVLink", "IB", "Ethernet"};
    for (int w = 0; w < LINKS; w++)
        fprintf(f, "<text x='%.1f' y='%d' text-anchor='middle' font-size='10' fill='#555'>%s"
                "</text>\n", x_of(&a, plan_link_of(link_order[w]).bandwidth / link_scale),
                HEIGHT - BOTTOM - 6, names[w]);
    fprintf(f, "</svg>\n");
    return fclose(f) == 0 ? 0 : -1;
}
