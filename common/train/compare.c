#include "compare.h"

#include <math.h>

void compare_to_baseline(run_result *r, const baseline_run *b, const float *loss,
                         const float *first_grads, const float *final_params) {
    r->diff_loss = loss ? max_abs_diff(loss, b->loss, (size_t)r->steps) : -1;
    r->diff_grads = first_grads ? max_abs_diff(first_grads, b->first_grads, b->num_params) : -1;
    r->diff_params = final_params ? max_abs_diff(final_params, b->final_params, b->num_params) : -1;
}

double run_worst_fraction_of_tolerance(const run_result *r, double tol_grads,
                                       double tol_loss, double tol_params) {
    const double diffs[3] = {r->diff_grads, r->diff_loss, r->diff_params};
    const double tols[3] = {tol_grads, tol_loss, tol_params};
    double worst = 0;
    for (int i = 0; i < 3; i++) {
        if (tols[i] <= 0) continue;
        if (isnan(diffs[i])) return INFINITY;
        if (diffs[i] >= 0 && diffs[i] / tols[i] > worst) worst = diffs[i] / tols[i];
    }
    return worst;
}

double run_worst_fraction_of(const run_result *r, run_tolerances t) {
    return run_worst_fraction_of_tolerance(r, t.grads, t.loss, t.params);
}
