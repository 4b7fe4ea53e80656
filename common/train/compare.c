#include "compare.h"

#include <math.h>

/* Every run ends at --steps, but a restart continues each strategy from its own newest
 * checkpoint and the baseline from where the job started: the losses compared are those
 * of the steps both ran, and the first step's gradients only when both started together.
 * A baseline without its count of steps ran the strategy's. */
void compare_to_baseline(run_result *r, const baseline_run *b, const float *loss,
                         const float *first_grads, const float *final_params) {
    const int b_steps = b->result.steps > 0 ? b->result.steps : r->steps;
    const int both = r->steps < b_steps ? r->steps : b_steps;
    r->diff_loss = loss && both > 0 ? max_abs_diff(loss + (r->steps - both),
                                                   b->loss + (b_steps - both), (size_t)both)
                                    : -1;
    r->diff_grads = first_grads && r->steps == b_steps
                        ? max_abs_diff(first_grads, b->first_grads, b->num_params) : -1;
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
