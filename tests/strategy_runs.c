#include "strategy_runs.h"

#include <check.h>
#include <stdlib.h>

strategy_outcome launch_zero(const run_config *cfg, const dataset *d, zero_options opts) {
    strategy_outcome o = {.extra = calloc(1, sizeof(zero_extra))};
    ck_assert_int_eq(zero_launch(cfg, d, &opts, &o), 0);
    ck_assert_ptr_nonnull(o.first_grads);
    return o;
}

void zero_outcome_free(strategy_outcome *o) {
    free(o->extra);
    o->extra = NULL;
    strategy_outcome_free(o);
}

ddp_result *launch_ddp(const run_config *cfg, const dataset *d, ddp_options opts,
                       const baseline_run *b) {
    ddp_result *o = calloc(1, sizeof *o);
    o->run.extra = &o->x;
    ck_assert_int_eq(ddp_launch(cfg, d, &opts, &o->run), 0);
    if (b) strategy_outcome_compare(&o->run, b);
    return o;
}

void ddp_result_free(ddp_result *o) {
    if (!o) return;
    strategy_outcome_free(&o->run);
    ddp_extra_free(&o->x);
    free(o);
}

pp_result *launch_pp(const run_config *cfg, const dataset *d, int stages,
                     pipeline_options opts, const baseline_run *b) {
    pp_result *o = calloc(1, sizeof *o);
    o->run.extra = &o->x;
    ck_assert_int_eq(pp_launch(cfg, d, stages, &opts, &o->run), 0);
    if (b) strategy_outcome_compare(&o->run, b);
    return o;
}

void pp_result_free(pp_result *o) {
    strategy_outcome_free(&o->run);
    pp_extra_free(&o->x);
    free(o);
}

mesh_result *launch_mesh(const run_config *cfg, const dataset *d, mesh_shape shape,
                         pipeline_options opts, const baseline_run *b) {
    mesh_result *o = calloc(1, sizeof *o);
    o->run.extra = &o->x;
    ck_assert_int_eq(mesh_launch(cfg, d, shape, &opts, &o->run), 0);
    if (b) strategy_outcome_compare(&o->run, b);
    return o;
}

void mesh_result_free(mesh_result *o) {
    strategy_outcome_free(&o->run);
    mesh_extra_free(&o->x);
    free(o);
}

void check_mesh_formulas(const mesh_result *o, mesh_shape shape, double bytes_error) {
    ck_assert_msg(o->x.worst_bytes_error <= bytes_error, "bytes off their formula by %g",
                  o->x.worst_bytes_error);
    ck_assert_msg(o->x.tied_drift == 0.0, "tied copies drifted by %g", o->x.tied_drift);
    for (int w = 0; w < mesh_world(&shape); w++)
        for (int i = 0; i < 3; i++)
            ck_assert_msg(o->x.ranks[w].state[i] == o->x.ranks[w].state_formula[i],
                          "rank %d state %d: %.0f bytes held, formula %.0f", w, i,
                          o->x.ranks[w].state[i], o->x.ranks[w].state_formula[i]);
}
