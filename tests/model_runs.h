/* What the model-level strategy suites (test_cp_mixed, test_moe_mixed) keep of a short
 * run and how they compare two: every step's global mean loss, step 1's gradients and
 * the last parameters, whole vectors on world rank 0. */
#ifndef MODEL_RUNS_H
#define MODEL_RUNS_H
#include <stddef.h>

#include "comm.h"
#include "tolerances.h"

enum { MODEL_RUN_STEPS = 3 };

typedef struct {
    double loss[MODEL_RUN_STEPS];
    float *grads, *params;   /* n each */
    size_t n;
} model_run;

void model_run_alloc(model_run *r, size_t n);
void model_run_free(model_run *r);
/* fn on `ranks` thread ranks (a 60 s timeout); launch's status */
int model_run_launch(int ranks, rank_main_fn fn, void *args);
/* The largest |step-1 gradient| of r: the G of tolerances.h's 16-bit bounds. */
double model_run_largest_grad(const model_run *r);
/* Prints got's largest differences from base next to t after `name`; returns the worst
 * as a fraction of its tolerance (1: at the limit). `extra`: a part of the gradient
 * [extra_at, n) printed on its own (0: none). */
double model_run_compare(const char *name, const model_run *base, const model_run *got,
                         const run_tolerances *t, size_t extra_at, const char *extra);

#endif
