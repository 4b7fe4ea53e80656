/* The dynamic loss scale of fp16 training (loss_scale.h). */
#include "loss_scale.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "number_formats.h"
#include "ops.h"

loss_scale_config loss_scale_defaults(precision p) {
    return (loss_scale_config){.init_scale = 65536.0f, .growth_factor = 2.0f,
                               .backoff_factor = 0.5f, .growth_interval = 1000,
                               .min_scale = 1.0f, .enabled = p == PRECISION_FP16};
}

/* The first field of an enabled cfg that cannot run, written into why; 0 if none. */
static int first_problem(const loss_scale_config *c, char *why, size_t size) {
    if (!(c->min_scale > 0.0f) || !isfinite(c->min_scale))
        snprintf(why, size, "min_scale %g: must be finite and > 0", (double)c->min_scale);
    else if (!(c->init_scale >= c->min_scale) || !isfinite(c->init_scale))
        snprintf(why, size, "init_scale %g: must be finite and >= min_scale %g",
                 (double)c->init_scale, (double)c->min_scale);
    else if (!(c->growth_factor > 1.0f) || !isfinite(c->growth_factor))
        snprintf(why, size, "growth_factor %g: must be finite and > 1",
                 (double)c->growth_factor);
    else if (!(c->backoff_factor > 0.0f && c->backoff_factor < 1.0f))
        snprintf(why, size, "backoff_factor %g: must lie in (0, 1)",
                 (double)c->backoff_factor);
    else if (c->growth_interval < 1)
        snprintf(why, size, "growth_interval %d: must be >= 1", c->growth_interval);
    else
        return 0;
    return 1;
}

int loss_scale_config_check(const loss_scale_config *cfg, char *why, size_t why_size) {
    if (why_size) why[0] = '\0';
    return !cfg->enabled || !first_problem(cfg, why, why_size);
}

int loss_scale_init(loss_scale *s, const loss_scale_config *cfg) {
    char why[160];
    const int sound = loss_scale_config_check(cfg, why, sizeof why);
    *s = (loss_scale){.cfg = *cfg, .scale = cfg->enabled && sound ? cfg->init_scale : 1.0f};
    s->cfg.enabled = cfg->enabled && sound;
    return sound;
}

/* fp16 rounds every value from 65520 (65504, its largest, plus half its spacing there)
 * up to infinity. */
#define FP16_ROUNDS_TO_INF 65520.0

int loss_scale_start_check(double init_scale, double backoff_factor, double tokens, int steps,
                           char *why, size_t why_size) {
    if (why_size) why[0] = '\0';
    if (init_scale > FLT_MAX) {
        snprintf(why, why_size, "more than fp32's largest number, %g: the scale is an fp32"
                 " number", (double)FLT_MAX);
        return 0;
    }
    /* The loss is the mean over the step's tokens, so backward starts at S / tokens a
     * token (a strategy that averages over fewer tokens starts higher), and the target
     * logit's gradient is S (1 - p) / tokens, p the probability the model gives the
     * target: about 1/vocab at the start, so 1 - p >= 1/2. Cross-entropy rounds that
     * gradient into fp16: from 2 x 65520 x tokens on, it is inf and the step is
     * skipped, the scale backs off, and a skipped step changes no weight, so p stays.
     * Every step of the run is lost while S x backoff^(steps - 1) is still that large. */
    const double sure_overflow = 2 * FP16_ROUNDS_TO_INF * tokens;
    const double last_scale = init_scale * pow(backoff_factor, steps - 1);
    if (last_scale < sure_overflow) return 1;
    const int first_taken = 2 + (int)floor(log(init_scale / sure_overflow) / -log(backoff_factor));
    snprintf(why, why_size, "every one of the %d steps would overflow fp16 and be skipped: a"
             " token's target logit gets a gradient of S x (1 - p) / %.0f tokens, 1 - p near 1"
             " at the start, past fp16's 65504 from S = %.3g on; backing off by %g a skipped"
             " step, step %d would be the first taken; valid: below %.3g", steps, tokens,
             sure_overflow, backoff_factor, first_taken,
             fmin(sure_overflow / pow(backoff_factor, steps - 1), FLT_MAX));
    return 0;
}

int grads_finite(const float *grads, size_t n) { return isfinite(vec_sum(grads, n)); }

int loss_scale_all_finite(comm *group, int locally_finite) {
    if (!group) return locally_finite != 0;
    /* a flag, not the gradients' own values: a max over NaNs is not defined */
    float not_finite = locally_finite ? 0.0f : 1.0f;
    comm_allreduce(group, &not_finite, 1, COMM_F32, COMM_MAX);
    return not_finite == 0.0f;
}

static void back_off(loss_scale *s) {
    s->skipped_steps++;
    s->clean_steps = 0;
    s->scale = fmaxf(s->scale * s->cfg.backoff_factor, s->cfg.min_scale);
}

static void count_clean_step(loss_scale *s) {
    if (++s->clean_steps < s->cfg.growth_interval) return;
    s->clean_steps = 0;
    const float grown = s->scale * s->cfg.growth_factor;
    if (isfinite(grown)) s->scale = grown;   /* an infinite scale would make every step inf */
}

int loss_scale_update(loss_scale *s, int all_finite) {
    if (!s->cfg.enabled) return 1;
    if (!all_finite) {
        back_off(s);
        return 0;
    }
    count_clean_step(s);
    return 1;
}

void loss_scale_unscale(const loss_scale *s, float *grads, size_t n) {
    if (s->scale != 1.0f) vec_scale(grads, 1.0f / s->scale, n);
}

/* Finite non-zero elements of grads, and how many of them x scale round to zero
 * (flush) or to infinity (overflow) in fp16. */
typedef struct {
    size_t nonzero, flushed, overflowed;
} fp16_rounding;

static fp16_rounding fp16_round_counts(const float *grads, size_t n, float scale) {
    fp16_rounding r = {0, 0, 0};
    for (size_t i = 0; i < n; i++) {
        if (grads[i] == 0.0f || !isfinite(grads[i])) continue;
        const float rounded = number_from_f16(number_to_f16(grads[i] * scale));
        r.nonzero++;
        r.flushed += rounded == 0.0f;
        r.overflowed += isinf(rounded) ? 1 : 0;   /* glibc's isinf(-inf) is -1 */
    }
    return r;
}

double fp16_flush_share(const float *grads, size_t n, float scale) {
    const fp16_rounding r = fp16_round_counts(grads, n, scale);
    return r.nonzero ? (double)r.flushed / (double)r.nonzero : 0.0;
}

double fp16_overflow_share(const float *grads, size_t n, float scale) {
    const fp16_rounding r = fp16_round_counts(grads, n, scale);
    return r.nonzero ? (double)r.overflowed / (double)r.nonzero : 0.0;
}
