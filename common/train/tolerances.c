/* The tolerances of a run in its precision (tolerances.h). */
#include "tolerances.h"

#include <math.h>

#include "matmul16.h"

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

/* Whether a rank's rows of a 16-bit product may sum differently from the whole batch's
 * (matmul16.h), so that a linear's output rounds one 16-bit unit apart and a flip
 * follows (tolerances.h): fp16 widened to fp32 (no oneDNN fp16 matmul on this CPU), in
 * calls of under 16 rows; or a 16-bit kernel that the probe finds summing a row by the
 * call it is in (AMX's bf16 brgemm sums a one-row call differently). bf16 widened in
 * 16-row calls held its rows in every strategy's runs. */
static int rows_may_flip(precision p) {
    if (p == PRECISION_FP32) return 0;
    if (matmul16_widens(p)) return p == PRECISION_FP16;
    return !matmul16_rows_invariant(p);
}

static void allow_row_flips(const run_config *cfg, double largest_grad, run_tolerances *t) {
    if (!rows_may_flip(cfg->precision)) return;
    const double u = ldexp(1.0, cfg->precision == PRECISION_BF16 ? -8 : -11);
    const double L = cfg->model.layers;
    t->grads = fmax(t->grads, (4 * L + 1) * u * largest_grad);
}

double mixed_loss_tolerance(const float *loss16, const float *loss32, int steps) {
    double spread = 0;
    for (int i = 0; i < steps; i++) {
        const double d = fabs((double)loss16[i] - loss32[i]);
        if (!(d <= spread)) spread = d;   /* NaN sticks */
    }
    return isnan(spread) ? MIXED_TOL_LOSS : fmax(MIXED_TOL_LOSS, MIXED_SPREAD_FACTOR * spread);
}

run_tolerances tolerances_for_tp(const run_config *cfg, int tp, double largest_grad) {
    run_tolerances t = tolerances_for(cfg);
    allow_row_flips(cfg, largest_grad, &t);
    if (cfg->precision == PRECISION_FP32 || tp < 2) return t;
    const double u = ldexp(1.0, cfg->precision == PRECISION_BF16 ? -8 : -11);
    const double L = cfg->model.layers, tokens = (double)cfg->batch * cfg->model.ctx;
    t.grads = fmax(t.grads, 4 * L * u * largest_grad);
    t.loss = fmax(t.loss, 4 * L * u * log((double)cfg->model.vocab) / sqrt(tokens));
    return t;
}

run_tolerances tolerances_with_grads16(run_tolerances t, const run_config *cfg, int parts,
                                       double largest_grad) {
    if (cfg->grad_precision == PRECISION_FP32) return t;
    const double u = ldexp(1.0, cfg->grad_precision == PRECISION_BF16 ? -8 : -11);
    t.grads = fmax(t.grads, (parts + 2) * u * largest_grad);
    return t;
}

run_tolerances tolerances_with_moe_rows(run_tolerances t, const run_config *cfg, int moe_blocks,
                                        double largest_grad) {
    if (cfg->precision == PRECISION_FP32 || moe_blocks <= 0) return t;
    if (!matmul16_widens(cfg->precision) && matmul16_rows_invariant(cfg->precision)) return t;
    const double u = ldexp(1.0, cfg->precision == PRECISION_BF16 ? -8 : -11);
    const double tokens = (double)cfg->batch * cfg->model.ctx;
    t.grads = fmax(t.grads, 4 * moe_blocks * u * largest_grad);
    t.loss = fmax(t.loss, 4 * moe_blocks * u * log((double)cfg->model.vocab) / sqrt(tokens));
    return t;
}

run_tolerances tolerances_with_moe_routing(run_tolerances t, const run_config *cfg,
                                           int moe_blocks) {
    if (cfg->precision != PRECISION_FP32 || moe_blocks <= 0 || cfg->steps <= TOL_STEPS) return t;
    t.loss = 0;
    t.params = fmax(t.params, adamw_drift_bound(&cfg->adamw, cfg->steps));
    return t;
}

run_tolerances tolerances_for_grads16(const run_config *cfg, int parts, double largest_grad) {
    run_tolerances t = tolerances_for(cfg);
    allow_row_flips(cfg, largest_grad, &t);
    return tolerances_with_grads16(t, cfg, parts, largest_grad);
}

double zeropp_loss_band_fraction(const float *loss, const float *fp32_loss, int steps) {
    double worst = 0, sum = 0, fp32_sum = 0;
    for (int i = 0; i < steps; i++) {
        const double f = fabs((double)loss[i] - fp32_loss[i]) /
                         (ZEROPP_LOSS_BAND * fabs((double)fp32_loss[i]));
        if (!(f <= worst)) worst = f;   /* a NaN loss: worst becomes NaN, and fails */
        sum += loss[i];
        fp32_sum += fp32_loss[i];
    }
    if (steps <= ZEROPP_BAND_STEPS) return worst;
    return fabs(sum - fp32_sum) / (ZEROPP_MEAN_BAND * fabs(fp32_sum));
}
