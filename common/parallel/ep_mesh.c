/* The EP x DP mesh (ep_mesh.h). */
#include "ep_mesh.h"

#include <stdio.h>

ep_mesh_coord ep_mesh_coord_of(const ep_mesh_shape *m, int rank) {
    return (ep_mesh_coord){.ep = rank % m->ep, .dp = rank / m->ep};
}

int ep_mesh_rank_of(const ep_mesh_shape *m, ep_mesh_coord c) { return c.ep + m->ep * c.dp; }

int ep_mesh_check(const ep_mesh_shape *m, int world, int experts, char *err, size_t err_len) {
    if (m->ep < 1 || m->dp < 1 || m->ep * m->dp != world) {
        snprintf(err, err_len, "EP %d x DP %d needs %d ranks, not %d (DP is ranks / EP:"
                 " an EP size that divides %d)", m->ep, m->dp, m->ep * m->dp, world, world);
        return 0;
    }
    if (experts % m->ep != 0) {
        snprintf(err, err_len, "EP %d does not divide --experts %d (each EP rank holds"
                 " experts / EP of them)", m->ep, experts);
        return 0;
    }
    return 1;
}

ep_mesh ep_mesh_create(comm *world, ep_mesh_shape shape) {
    ep_mesh m = {.shape = shape, .world = world};
    m.me = ep_mesh_coord_of(&shape, comm_rank(world));
    m.ep = comm_split(world, m.me.dp, m.me.ep, "ep");                /* same dp index */
    m.expert_dp = comm_split(world, m.me.ep, m.me.dp, "expert_dp");  /* same experts */
    return m;
}

void ep_mesh_free(ep_mesh *m) {
    comm_free(m->ep);
    comm_free(m->expert_dp);
    m->ep = m->expert_dp = NULL;
}
