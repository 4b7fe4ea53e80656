/* The chapter's defaults, its mesh and its device. */
#include "moe_chapter.h"

#include "cli_checks.h"

/* 2 layers of the default width: every part of the default run, on 2 cores, in under a
 * minute. */
void moe_chapter_defaults(run_config *cfg) {
    cfg->model.layers = 2;
    cfg->steps = 10;
}

pipeline_options moe_chapter_pipeline(const moe_config *moe, const char *name) {
    return (pipeline_options){.schedule = PP_1F1B, .micro = 1, .chunks = 1, .moe = *moe,
                              .name = name};
}

int moe_chapter_one_device(const run_config *cfg, const dataset *data, const moe_config *moe,
                           int steps, strategy_outcome *o, mesh_extra *x) {
    run_config c = *cfg;
    c.steps = steps;
    c.comm.ranks = 1;
    c.comm.trace_path = NULL;
    const pipeline_options opts = moe_chapter_pipeline(moe, "moe");
    *o = (strategy_outcome){.extra = x};
    return mesh_train_one_device(&c, data, &opts, o);
}

int moe_chapter_mesh_ep(int ranks, int experts) {
    for (int ep = ranks / 2; ep > 1; ep--)
        if (ranks % ep == 0 && experts % ep == 0) return ep;
    return 1;
}

const char *moe_chapter_device(run_config *cfg, const char *asked) {
    static char why[256];   /* main's, before any rank starts */
    return device_cpu_only(cfg, asked, "the MoE layer's routing reads the activations in",
                           why, sizeof why);
}
