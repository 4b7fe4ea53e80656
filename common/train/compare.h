/* Comparing a strategy with the single-device baseline. Used by every chapter. */
#ifndef COMPARE_H
#define COMPARE_H

#include "baseline.h"
#include "floats.h"
#include "report.h"
#include "tolerances.h"

/* Fills r's diff_* fields from whole-model host vectors (any may be NULL: "-"). */
void compare_to_baseline(run_result *r, const baseline_run *b, const float *loss,
                         const float *first_grads, const float *final_params);

/* The largest of r's differences against its tolerance (1 = at the limit; a NaN is
 * infinitely far); a tolerance <= 0 leaves that difference unchecked. */
double run_worst_fraction_of_tolerance(const run_result *r, double tol_grads,
                                       double tol_loss, double tol_params);
/* The same against a run's tolerances (tolerances.h). */
double run_worst_fraction_of(const run_result *r, run_tolerances t);

#endif
