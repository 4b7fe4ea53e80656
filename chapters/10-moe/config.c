/* The chapter's defaults and its mesh. */
#include "moe_chapter.h"

/* 2 layers of the default width: every part of the default run, on 2 cores, in under a
 * minute. */
void moe_chapter_defaults(run_config *cfg) {
    cfg->model.layers = 2;
    cfg->steps = 10;
}

int moe_chapter_mesh_ep(int ranks, int experts) {
    for (int ep = ranks / 2; ep > 1; ep--)
        if (ranks % ep == 0 && experts % ep == 0) return ep;
    return 1;
}
