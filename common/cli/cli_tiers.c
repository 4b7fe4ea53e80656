/* --link-intra, --link-inter and --ranks-per-node: the two-tier network (comm.h's
 * comm_tier). All three together or none, never with --link (one link for every
 * transfer), and nodes that the ranks fill. */
#include "cli_tiers.h"

#include "cli_error.h"
#include "cli_given.h"

static const char *const tier_flags[] = {"link-intra", "link-inter", "ranks-per-node"};

void cli_take_tiers(run_config *cfg, int intra, int inter, int ranks_per_node) {
    int given = 0;
    for (int i = 0; i < 3; i++) given += cli_given(tier_flags[i]) != 0;
    if (given == 0) return;
    for (int i = 0; i < 3; i++)
        if (!cli_given(tier_flags[i]))
            cli_fail("--%s missing: a two-tier network takes --link-intra, --link-inter and"
                     " --ranks-per-node together", tier_flags[i]);
    if (cli_given("link"))
        cli_fail("--link %s: one link for every transfer; with --link-intra and"
                 " --link-inter leave --link out", cli_given_text("link"));
    if (intra == LINK_NONE || inter == LINK_NONE)
        cli_fail("--link-%s none: a tier needs a link (valid: nvlink, ib, ethernet)",
                 intra == LINK_NONE ? "intra" : "inter");
    cfg->comm.link = (comm_link)intra;
    cfg->comm.link_inter = (comm_link)inter;
    cfg->comm.ranks_per_node = ranks_per_node;
}

void cli_check_tiers(const run_config *cfg) {
    const int k = cfg->comm.ranks_per_node, n = cfg->comm.ranks;
    if (k > 0 && n % k != 0)
        cli_fail("--ranks-per-node %d: %d ranks do not fill nodes of %d (valid: a divisor of"
                 " %d)", k, n, k, n);
}
