/* The chapter's defaults, and one run of a precision case. */
#include "mixed.h"

#include <unistd.h>

/* A small model (2 layers of the default width), so that the default run, every part,
 * takes under a minute on 2 cores; the curves learn from real text, this repository's
 * design notes as frozen in data/english.txt, when they are at hand (the built-in sentences otherwise). */
void mixed_chapter_defaults(run_config *cfg) {
    cfg->model.layers = 2;
    cfg->steps = 200;
    if (access("data/english.txt", R_OK) == 0) cfg->data_path = "data/english.txt";
}

run_config mixed_case_config(const run_config *cfg, const precision_case *c, int steps) {
    run_config r = *cfg;
    r.precision = c->p;
    r.grad_precision = c->grads;
    r.no_loss_scale = c->no_loss_scale;
    r.steps = steps;
    r.quiet = 1;
    r.loss_scale_trace = NULL;
    return r;
}
