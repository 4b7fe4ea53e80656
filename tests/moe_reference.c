/* The MoE layer's double-precision reference (moe_reference.h). */
#include "moe_reference.h"

#include <math.h>
#include <stdlib.h>

static double gelu(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

/* y [C] = expert e (weights at w: fc_w [H, C], fc_b [H], fc2_w [C, H], fc2_b [C]) of x [C] */
static void expert(const moe_shape *s, const double *w, const double *x, double *y) {
    const int C = s->dim, H = s->hidden;
    const double *fc_w = w, *fc_b = w + H * C, *fc2_w = fc_b + H, *fc2_b = fc2_w + C * H;
    double *h = malloc(H * sizeof *h);
    for (int j = 0; j < H; j++) {
        double sum = fc_b[j];
        for (int c = 0; c < C; c++) sum += fc_w[j * C + c] * x[c];
        h[j] = gelu(sum);
    }
    for (int c = 0; c < C; c++) {
        double sum = fc2_b[c];
        for (int j = 0; j < H; j++) sum += fc2_w[c * H + j] * h[j];
        y[c] = sum;
    }
    free(h);
}

/* softmax of x's router logits into p [E]; its k choices (ties to the lower index) */
static void route(const moe_shape *s, const double *router, const double *x, double *p,
                  int *chosen) {
    const int E = s->cfg.experts, C = s->dim;
    double max = -INFINITY, sum = 0;
    for (int e = 0; e < E; e++) {
        p[e] = 0;
        for (int c = 0; c < C; c++) p[e] += router[e * C + c] * x[c];
        max = fmax(max, p[e]);
    }
    for (int e = 0; e < E; e++) sum += (p[e] = exp(p[e] - max));
    for (int e = 0; e < E; e++) p[e] /= sum;
    for (int j = 0; j < s->cfg.top_k; j++) {
        chosen[j] = -1;
        for (int e = 0; e < E; e++)
            if ((j == 0 || e != chosen[0]) && (chosen[j] < 0 || p[e] > p[chosen[j]]))
                chosen[j] = e;
    }
}

double moe_reference_objective(const moe_shape *s, int N, const double *x,
                               const double *router, const double *experts,
                               const double *G) {
    const int E = s->cfg.experts, C = s->dim, k = s->cfg.top_k;
    const size_t per_expert = moe_expert_numel(s);
    const double capacity = s->cfg.capacity_factor > 0
                                ? ceil(s->cfg.capacity_factor * N * k / E) : INFINITY;
    double *p = malloc(E * sizeof *p), *y = malloc(C * sizeof *y);
    double *first = calloc(E, sizeof *first), *prob_sum = calloc(E, sizeof *prob_sum);
    double *queue = calloc(E, sizeof *queue), J = 0;
    for (int n = 0; n < N; n++) {
        int chosen[2];
        route(s, router, x + n * C, p, chosen);
        first[chosen[0]] += 1;
        for (int e = 0; e < E; e++) prob_sum[e] += p[e];
        const double norm = k == 1 ? 1.0 : p[chosen[0]] + p[chosen[1]];
        for (int j = 0; j < k; j++) {
            const int e = chosen[j];
            if (queue[e]++ >= capacity) continue;   /* dropped */
            expert(s, experts + e * per_expert, x + n * C, y);
            for (int c = 0; c < C; c++) J += G[n * C + c] * (p[e] / norm) * y[c];
        }
    }
    double balance = 0;
    for (int e = 0; e < E; e++) balance += (first[e] / N) * (prob_sum[e] / N);
    J += s->cfg.aux_coef * E * balance;
    free(p), free(y), free(first), free(prob_sum), free(queue);
    return J;
}
