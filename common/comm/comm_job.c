/* Jobs, ranks and groups: what a backend creates and frees, the accessors of comm.h,
 * shard arithmetic and the modelled link. */
#include "comm_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

comm_options comm_options_default(void) {
    return (comm_options){.ranks = 1, .allreduce = ALLREDUCE_RING, .link = LINK_NONE,
                          .link_scale = 1.0, .timeout_seconds = 60.0, .trace_path = NULL};
}

size_t comm_shard(size_t count, int size, int rank, size_t *offset) {
    size_t base = count / (size_t)size, extra = count % (size_t)size, r = (size_t)rank;
    if (offset) *offset = r * base + (r < extra ? r : extra);
    return base + (r < extra ? 1 : 0);
}

comm_job *comm_job_create(const comm_options *opts, int nranks, int first_world_rank) {
    comm_job *job = calloc(1, sizeof *job);
    comm_rank_state *ranks = calloc((size_t)nranks, sizeof *ranks);
    if (!job || !ranks) { fprintf(stderr, "comm: out of memory\n"); exit(1); }
    job->opts = *opts;
    if (!(job->opts.timeout_seconds > 0)) job->opts.timeout_seconds = 60.0;
    if (!(job->opts.link_scale > 0)) job->opts.link_scale = 1.0;
    job->nranks = nranks;
    job->ranks = ranks;
    job->t0 = comm_now();
    for (int r = 0; r < nranks; r++) {
        ranks[r].world_rank = first_world_rank + r;
        pthread_mutex_init(&ranks[r].lock, NULL);
    }
    return job;
}

static void comm_destroy(comm *c) {
    comm **link = &c->rs->groups;
    while (*link && *link != c) link = &(*link)->next_of_rank;
    if (*link) *link = c->next_of_rank;
    c->backend->free(c);
    while (c->unwaited) {   /* their buffers went with the rank's memory (alloc.h) */
        comm_request *req = c->unwaited;
        c->unwaited = req->next_unwaited;
        free(req);
    }
    free(c->world_ranks);
    free(c);
}

void comm_job_free(comm_job *job) {
    for (int r = 0; r < job->nranks; r++)
        while (job->ranks[r].groups) comm_destroy(job->ranks[r].groups);
    for (int r = 0; r < job->nranks; r++) {
        /* a rank stopped by a failure left its model and buffers behind */
        if (atomic_load(&job->ranks[r].finished) && atomic_load(&job->ranks[r].status) < 0)
            mem_free_all_charged_to(&job->ranks[r].mem);
        pthread_mutex_destroy(&job->ranks[r].lock);
        free(job->ranks[r].events);
    }
    free(job->ranks);
    free(job);
}

comm *comm_create(comm_job *job, comm_rank_state *rs, const comm_backend *backend,
                  int rank, int size, const int *world_ranks, const char *name) {
    comm *c = calloc(1, sizeof *c);
    int *map = malloc((size_t)size * sizeof *map);
    if (!c || !map) { fprintf(stderr, "comm: out of memory\n"); exit(1); }
    memcpy(map, world_ranks, (size_t)size * sizeof *map);
    *c = (comm){.backend = backend, .job = job, .rs = rs, .rank = rank, .size = size,
                .world_ranks = map, .next_of_rank = rs->groups};
    snprintf(c->name, sizeof c->name, "%s", name ? name : "group");
    rs->groups = c;
    return c;
}

int comm_rank(const comm *c) { return c->rank; }
int comm_size(const comm *c) { return c->size; }
int comm_world_rank(const comm *c) { return c->rs->world_rank; }
const char *comm_backend_name(const comm *c) { return c->backend->name; }
const char *comm_name(const comm *c) { return c->name; }
int comm_bytes_are_modelled(const comm *c) { return c->backend->bytes_modelled; }
mem_stats *comm_mem_stats(comm *c) { return &c->rs->mem; }

/* H100 NVLink 4.0, 400 Gb/s InfiniBand, 25 Gb/s Ethernet (GB = 1e9 bytes). */
comm_link_figures comm_link_spec(comm_link link) {
    static const comm_link_figures links[] = {
        {"none", "no link model", 0, 0},
        {"nvlink", "NVLink 900 GB/s", 900e9, 2e-6},
        {"ib", "IB 400 Gb/s", 50e9, 5e-6},
        {"ethernet", "Ethernet 25 Gb/s", 3.125e9, 30e-6},
    };
    return (link > LINK_NONE && link <= LINK_ETHERNET) ? links[link] : links[LINK_NONE];
}

void comm_free(comm *c) {
    if (c) comm_destroy(c);
}
