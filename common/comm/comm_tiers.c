/* Two tiers of links: which tier a transfer between two world ranks crosses, the link
 * each tier is, and how long a transfer takes on it (the alpha-beta model of
 * comm_link_spec's figures). The threads backend waits these times out, the accounting
 * counts bytes per tier, and the planners predict with the same functions. */
#include "comm_internal.h"

const char *comm_tier_name(comm_tier tier) {
    return tier == COMM_TIER_INTER ? "inter-node" : "intra-node";
}

comm_tier comm_tier_between(const comm_options *o, int world_a, int world_b) {
    const int k = o->ranks_per_node;
    if (k <= 0) return COMM_TIER_INTRA;
    return world_a / k == world_b / k ? COMM_TIER_INTRA : COMM_TIER_INTER;
}

comm_link comm_tier_link(const comm_options *o, comm_tier tier) {
    return tier == COMM_TIER_INTER && o->ranks_per_node > 0 ? o->link_inter : o->link;
}

double comm_tier_seconds(const comm_options *o, comm_tier tier, size_t bytes) {
    const comm_link_figures link = comm_link_spec(comm_tier_link(o, tier));
    if (link.bandwidth <= 0) return 0;
    const double scale = o->link_scale > 0 ? o->link_scale : 1.0;
    return scale * (link.latency + (double)bytes / link.bandwidth);
}

comm_tier comm_tier_to(const comm *c, int peer) {
    return comm_tier_between(&c->job->opts, c->rs->world_rank, c->world_ranks[peer]);
}

double comm_link_seconds(const comm_job *job, comm_tier tier, size_t bytes) {
    return comm_tier_seconds(&job->opts, tier, bytes);
}
