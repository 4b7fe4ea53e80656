/* Short runs' results and their comparison (model_runs.h). */
#include "model_runs.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

void model_run_alloc(model_run *r, size_t n) {
    r->n = n;
    r->grads = calloc(n, sizeof(float));
    r->params = calloc(n, sizeof(float));
}

void model_run_free(model_run *r) {
    free(r->grads);
    free(r->params);
}

int model_run_launch(int ranks, rank_main_fn fn, void *args) {
    comm_options co = comm_options_default();
    co.ranks = ranks;
    co.timeout_seconds = 60;
    return launch_threads(&co, fn, args);
}

static double max_diff(const float *a, const float *b, size_t n) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)a[i] - (b ? b[i] : 0)));
    return worst;
}

double model_run_largest_grad(const model_run *r) { return max_diff(r->grads, NULL, r->n); }

double model_run_compare(const char *name, const model_run *base, const model_run *got,
                         const run_tolerances *t, size_t extra_at, const char *extra) {
    double dl = 0;
    for (int s = 0; s < MODEL_RUN_STEPS; s++) dl = fmax(dl, fabs(base->loss[s] - got->loss[s]));
    const double dg = max_diff(base->grads, got->grads, base->n);
    const double dp = max_diff(base->params, got->params, base->n);
    char part[64] = "";
    if (extra)
        snprintf(part, sizeof part, " (%s %.2e)", extra,
                 max_diff(base->grads + extra_at, got->grads + extra_at, base->n - extra_at));
    printf("%s: max diff loss %.2e (tol %.1e), step-1 grads %.2e%s (tol %.1e), params %.2e"
           " (tol %.1e)\n", name, dl, t->loss, dg, part, t->grads, dp, t->params);
    return fmax(dl / t->loss, fmax(dg / t->grads, dp / t->params));
}
