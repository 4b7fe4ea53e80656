/* The tolerances of a run in its precision (tolerances.h). */
#include "tolerances.h"

double adamw_drift_bound(const adamw_config *adamw, int steps) {
    double sum = 0;
    for (int step = 1; step <= steps; step++)   /* ops.c's warm-up schedule */
        sum += step < adamw->warmup_steps ? adamw->lr * (double)step / adamw->warmup_steps
                                          : adamw->lr;
    return 2 * sum;
}

run_tolerances tolerances_for(const run_config *cfg) {
    if (cfg->precision == PRECISION_FP32)
        return (run_tolerances){TOL_GRADS, TOL_LOSS, TOL_PARAMS};
    return (run_tolerances){TOL_GRADS, MIXED_TOL_LOSS,
                            adamw_drift_bound(&cfg->adamw, cfg->steps)};
}
