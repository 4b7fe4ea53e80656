#include "zero_state.h"

#include <string.h>

void zero_rank_attach(zero_rank *z, dp_grads *dp, gpt_model *model, const zero_options *opts) {
    *z = (zero_rank){.dp = dp, .opts = *opts, .model = model};
    if (dp->zero == 3 && opts->zeropp)
        z->zpp = zeropp_create(dp, opts->zeropp, opts->ranks_per_node, opts->zeropp_fault);
}

void zero_rank_detach(zero_rank *z) {
    zeropp_free(z->zpp);
    memset(z, 0, sizeof *z);
}
