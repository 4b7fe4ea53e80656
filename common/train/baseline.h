/* The single-device baseline that every strategy is compared with. */
#ifndef BASELINE_H
#define BASELINE_H
#include <stddef.h>

#include "data.h"
#include "report.h"
#include "run_config.h"

/* The single-device baseline: whole batch, one rank, plain AdamW. */
typedef struct {
    run_result result;     /* strategy "baseline"; differences are 0 */
    float *loss;           /* per step */
    float *first_grads;    /* gradients of step 1, before the update (host copy) */
    float *final_params;   /* after the last step (host copy) */
    size_t num_params;
} baseline_run;

baseline_run *baseline_train(const run_config *cfg, const dataset *data);
/* The baseline a strategy is compared with: it resumes from the checkpoint --resume named
 * as the program started, but never saves (the strategy's checkpoint is the run's); a
 * strategy that resumed elsewhere is compared on the steps both ran (compare.c). */
baseline_run *baseline_reference(const run_config *cfg, const dataset *data);
void baseline_free(baseline_run *b);
/* The largest |g| of its step-1 gradient: the scale of 16-bit rounding bounds
 * (tolerances.h). */
double baseline_largest_grad(const baseline_run *b);

#endif
