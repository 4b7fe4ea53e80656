/* Part routing: where the tokens go. One-device runs (the routing is the same on any
 * mesh): the pairs per expert and their imbalance (max / mean) over training without
 * and with the auxiliary loss, and the pairs dropped at capacity factors 1.0, 1.25 and
 * 2.0. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe_chapter.h"

double routing_imbalance(const double *load, int experts) {
    double max = 0, sum = 0;
    for (int e = 0; e < experts; e++) {
        max = fmax(max, load[e]);
        sum += load[e];
    }
    return sum > 0 ? max * experts / sum : 0;
}

/* The step's worst MoE block. */
static double step_imbalance(const moe_routing_log *log, int blocks, int E, int step) {
    double worst = 0;
    for (int i = 0; i < blocks; i++)
        worst = fmax(worst, routing_imbalance(log->load + ((size_t)step * blocks + i) * E, E));
    return worst;
}

/* One device, `steps` steps, with moe's routing, quietly: the routing in x->moe_log
 * (the caller frees o and x). */
static void train_one_device(const run_config *cfg, const dataset *data, const moe_config *moe,
                             int steps, strategy_outcome *o, mesh_extra *x) {
    run_config c = *cfg;
    c.quiet = 1;
    if (moe_chapter_one_device(&c, data, moe, steps, o, x) != 0) abort();
}

static void run_free(strategy_outcome *o, mesh_extra *x) {
    strategy_outcome_free(o);
    mesh_extra_free(x);
}

/* Imbalance over training without and with the auxiliary loss, no dropping. */
static void curves(const run_config *cfg, const dataset *data, const moe_config *given,
                   routing_report *r) {
    const int E = r->experts, last = r->curve_steps - 1;
    const int blocks = moe_shape_make(given, &cfg->model, 1, 0).moe_layers;
    for (int c = 0; c < 2; c++) {
        moe_config moe = *given;
        moe.capacity_factor = 0;
        moe.aux_coef = c ? (float)r->aux_coef : 0;
        strategy_outcome o;
        mesh_extra x;
        train_one_device(cfg, data, &moe, r->curve_steps, &o, &x);
        r->imbalance[c] = calloc(r->curve_steps, sizeof(double));
        r->histogram[c] = calloc(E, sizeof(double));
        for (int s = 0; s < r->curve_steps; s++)
            r->imbalance[c][s] = step_imbalance(&x.moe_log, blocks, E, s);
        memcpy(r->histogram[c], x.moe_log.load + (size_t)last * blocks * E,
               E * sizeof(double));
        run_free(&o, &x);
    }
}

void routing_local(const run_config *cfg, const dataset *data, const moe_config *given,
                   int curve_steps, routing_report *r) {
    memset(r, 0, sizeof *r);
    r->experts = given->experts;
    r->curve_steps = curve_steps;
    r->aux_coef = given->aux_coef > 0 ? given->aux_coef : 0.01;
    curves(cfg, data, given, r);
    const int blocks = moe_shape_make(given, &cfg->model, 1, 0).moe_layers;
    const double factors[ROUTING_FACTORS] = {1.0, 1.25, 2.0};
    for (int f = 0; f < ROUTING_FACTORS; f++) {
        moe_config moe = *given;
        moe.capacity_factor = r->factors[f] = factors[f];
        strategy_outcome o;
        mesh_extra x;
        train_one_device(cfg, data, &moe, cfg->steps, &o, &x);
        const moe_routing_log *log = &x.moe_log;
        double dropped = 0, pairs = 0, imbalance = 0;
        for (int s = 0; s < cfg->steps; s++) {
            for (int i = 0; i < blocks; i++) dropped += log->dropped[(size_t)s * blocks + i];
            for (int e = 0; e < (int)((size_t)blocks * r->experts); e++)
                pairs += log->load[(size_t)s * blocks * r->experts + e];
            imbalance = fmax(imbalance, step_imbalance(log, blocks, r->experts, s));
        }
        r->dropped_share[f] = pairs > 0 ? dropped / pairs : 0;
        r->imbalance_at_factor[f] = imbalance;
        r->capacity[f] = ceil(factors[f] * cfg->batch * cfg->model.ctx * moe.top_k /
                              moe.experts);
        run_free(&o, &x);
    }
}

void routing_free(routing_report *r) {
    for (int c = 0; c < 2; c++) free(r->imbalance[c]), free(r->histogram[c]);
}

static void print_histogram(const routing_report *r, int c) {
    double max = 0;
    for (int e = 0; e < r->experts; e++) max = fmax(max, r->histogram[c][e]);
    for (int e = 0; e < r->experts; e++) {
        const int bar = max > 0 ? (int)lround(40 * r->histogram[c][e] / max) : 0;
        printf("    expert %2d %6.0f |%.*s\n", e, r->histogram[c][e], bar,
               "########################################");
    }
}

/* The mean imbalance over the curve's last quarter: where the loss has had its say. */
static double late_imbalance(const routing_report *r, int c) {
    const int from = r->curve_steps * 3 / 4;
    double sum = 0;
    for (int s = from; s < r->curve_steps; s++) sum += r->imbalance[c][s];
    return sum / (r->curve_steps - from);
}

void routing_print(const routing_report *r) {
    printf("\nWhere the tokens go (one device; the routing is the same on any mesh)\n");
    for (int c = 0; c < 2; c++) {
        printf("  pairs per expert, first MoE block, step %d, aux %g (imbalance max/mean"
               " %.2f):\n", r->curve_steps, c ? r->aux_coef : 0.0,
               routing_imbalance(r->histogram[c], r->experts));
        print_histogram(r, c);
    }
    printf("  imbalance (max/mean, worst block) over %d steps:   step 1   last quarter\n",
           r->curve_steps);
    for (int c = 0; c < 2; c++)
        printf("    aux %-6g %40.2f %14.2f\n", c ? r->aux_coef : 0.0, r->imbalance[c][0],
               late_imbalance(r, c));
    printf("  capacity factor   capacity/expert   pairs dropped   worst imbalance\n");
    for (int f = 0; f < ROUTING_FACTORS; f++)
        printf("    %-15g %15.0f %14.1f%% %17.2f\n", r->factors[f], r->capacity[f],
               100 * r->dropped_share[f], r->imbalance_at_factor[f]);
}

void routing_json(FILE *o, const routing_report *r) {
    fprintf(o, "\"routing\": {\"aux_coef\": %g, \"curve_steps\": %d", r->aux_coef,
            r->curve_steps);
    for (int c = 0; c < 2; c++) {
        fprintf(o, ", \"%s\": {\"imbalance\": [", c ? "with_aux" : "without_aux");
        for (int s = 0; s < r->curve_steps; s++)
            fprintf(o, "%s%.4f", s ? ", " : "", r->imbalance[c][s]);
        fprintf(o, "], \"tokens_per_expert\": [");
        for (int e = 0; e < r->experts; e++)
            fprintf(o, "%s%.0f", e ? ", " : "", r->histogram[c][e]);
        fprintf(o, "]}");
    }
    fprintf(o, ", \"capacity\": [");
    for (int f = 0; f < ROUTING_FACTORS; f++)
        fprintf(o, "%s{\"factor\": %g, \"per_expert\": %.0f, \"dropped_share\": %.5f,"
                " \"worst_imbalance\": %.4f}", f ? ", " : "", r->factors[f], r->capacity[f],
                r->dropped_share[f], r->imbalance_at_factor[f]);
    fprintf(o, "]}");
}

/* ---- --svg: the imbalance over training, without and with the auxiliary loss ---------- */

enum { WIDTH = 720, HEIGHT = 360, LEFT = 60, RIGHT = 140, TOP = 40, BOTTOM = 50 };

int routing_write_svg(const char *path, const routing_report *r) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", path);
        return -1;
    }
    double hi = 1;
    for (int c = 0; c < 2; c++)
        for (int s = 0; s < r->curve_steps; s++) hi = fmax(hi, r->imbalance[c][s]);
    hi = ceil(hi * 2) / 2;   /* the axis runs from 1 (perfect balance) */
    const double xs = (double)(WIDTH - LEFT - RIGHT) / (r->curve_steps > 1 ? r->curve_steps - 1 : 1);
    const double ys = (HEIGHT - TOP - BOTTOM) / (hi - 1 > 0 ? hi - 1 : 1);
    fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d'"
               " font-family='sans-serif'>\n<rect width='100%%' height='100%%' fill='white'/>\n"
               "<text x='%d' y='24' font-size='14'>Load imbalance (max / mean pairs per expert,"
               " worst block) per step</text>\n"
               "<line x1='%d' y1='%d' x2='%d' y2='%d' stroke='black'/>\n"
               "<line x1='%d' y1='%d' x2='%d' y2='%d' stroke='black'/>\n",
            WIDTH, HEIGHT, LEFT, LEFT, HEIGHT - BOTTOM, WIDTH - RIGHT, HEIGHT - BOTTOM, LEFT,
            TOP, LEFT, HEIGHT - BOTTOM);
    for (double v = 1; v <= hi + 1e-9; v += 0.5)
        fprintf(f, "<text x='%d' y='%.1f' text-anchor='end' font-size='11'>%.1f</text>\n",
                LEFT - 6, HEIGHT - BOTTOM - (v - 1) * ys + 4, v);
    fprintf(f, "<text x='%d' y='%d' text-anchor='middle' font-size='12'>step</text>\n",
            (LEFT + WIDTH - RIGHT) / 2, HEIGHT - 16);
    for (int s = 0; s < r->curve_steps; s += r->curve_steps > 10 ? r->curve_steps / 5 : 1)
        fprintf(f, "<text x='%.1f' y='%d' text-anchor='middle' font-size='11'>%d</text>\n",
                LEFT + s * xs, HEIGHT - BOTTOM + 16, s + 1);
    const char *colours[2] = {"#d62728", "#1f77b4"};
    for (int c = 0; c < 2; c++) {
        fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='1.5' points='", colours[c]);
        for (int s = 0; s < r->curve_steps; s++)
            fprintf(f, "%.1f,%.1f ", LEFT + s * xs,
                    HEIGHT - BOTTOM - (r->imbalance[c][s] - 1) * ys);
        fprintf(f, "'/>\n<text x='%d' y='%d' font-size='13' fill='%s'>aux %g</text>\n",
                WIDTH - RIGHT + 12, TOP + 20 + 20 * c, colours[c], c ? r->aux_coef : 0.0);
    }
    fprintf(f, "</svg>\n");
    return fclose(f) == 0 ? 0 : -1;
}
