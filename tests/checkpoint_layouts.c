/* Synthetic checkpoint layouts (checkpoint_layouts.h). */
#include "checkpoint_layouts.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "checkpoint.h"
#include "compare.h"
#include "baseline.h"
#include "replica.h"

const layout_spec checkpoint_layouts[] = {
    {"baseline", 1, 1, 1, 0, 0}, {"zero3 x4", 1, 1, 4, 1, 1}, {"zero1 x3", 1, 1, 3, 0, 1},
    {"tp2 x dp2", 2, 1, 2, 0, 0}, {"pp2", 1, 2, 1, 0, 0}, {"tp2 pp2 dp2 zero1", 2, 2, 2, 0, 1},
};
const int checkpoint_num_layouts = 6;

int layout_world(const layout_spec *l) { return l->tp * l->pp * l->dp; }

/* Seeds of the three vectors: parameters, m, v. */
uint64_t layout_vector_seed(uint64_t seed, int kind) { return seed + 1000 * (uint64_t)kind; }

typedef struct {
    const layout_spec *spec;
    const run_config *cfg;
    const char *dir;
    uint64_t seed;      /* the values saved / expected */
    int save;           /* 1: save step 5; 0: load and compare */
    int crash_at;       /* save with the test hook: stop before this step */
    float worst;        /* over the ranks: largest |loaded - expected| */
    float wrong_steps;  /* ranks whose AdamW step did not come back as 5 */
} layout_job;

typedef struct {
    gpt_shape shape;
    shard_layout layout;
    int has_layout;
    float *vec[3];
    ckpt_state state;
    int adam_step;
} rank_state;

/* The values of vector `kind` a rank holds (whole, or its pieces) into host. */
static void values_of(const gpt_shape *s, const shard_layout *layout, int kind, int sharded,
                      uint64_t seed, float *host) {
    if (!sharded) {
        gpt_init_params(s, layout_vector_seed(seed, kind), 0, gpt_num_params(s), host);
        return;
    }
    for (int slab = 0; slab < gpt_num_slabs(s); slab++) {
        const size_t begin = shard_piece_begin(layout, slab);
        gpt_init_params(s, layout_vector_seed(seed, kind), begin, begin + layout->piece_len[slab],
                        host + layout->shard_pos[slab]);
    }
}

static void expected_values(const rank_state *rs, int kind, int sharded, uint64_t seed,
                            float *host) {
    values_of(&rs->shape, &rs->layout, kind, sharded, seed, host);
}

void layout_upload_values(const gpt_shape *s, const shard_layout *layout, int kind,
                          int sharded, uint64_t seed, float *device) {
    const size_t n = sharded ? layout->shard_len : gpt_num_params(s);
    float *host = calloc(n, sizeof(float));
    values_of(s, layout, kind, sharded, seed, host);
    ops_upload(device, host, n * sizeof(float));
    free(host);
}

static void rank_state_init(rank_state *rs, const layout_job *job, int rank) {
    const layout_spec *l = job->spec;
    memset(rs, 0, sizeof *rs);
    const int tp_rank = rank % l->tp, stage = rank / l->tp % l->pp, dp_rank = rank / (l->tp * l->pp);
    rs->shape = gpt_shape_make(&job->cfg->model, l->tp, tp_rank);
    if (l->tp > 1) gpt_shape_split_vocab(&rs->shape);
    gpt_shape_split_stages(&rs->shape, l->pp, stage);
    rs->has_layout = l->params_sharded || l->moments_sharded;
    if (rs->has_layout) shard_layout_init(&rs->layout, &rs->shape, l->dp, dp_rank);
    ckpt_part *p = &rs->state.parts[0];
    *p = (ckpt_part){.shape = rs->shape, .layout = rs->has_layout ? &rs->layout : NULL,
                     .params_sharded = l->params_sharded, .moments_sharded = l->moments_sharded,
                     .writes = dp_rank == 0};
    for (int k = 0; k < 3; k++) {
        const int sharded = k == 0 ? l->params_sharded : l->moments_sharded;
        const size_t n = ckpt_vector_len(p, sharded);
        rs->vec[k] = mem_alloc_on(MEM_DEVICE, MEM_PARAMS, n * sizeof(float));
        float *host = calloc(n, sizeof(float));
        if (job->save) expected_values(rs, k, sharded, job->seed, host);
        ops_upload(rs->vec[k], host, n * sizeof(float));
        free(host);
    }
    p->params = rs->vec[0];
    p->adam_m = rs->vec[1];
    p->adam_v = rs->vec[2];
    rs->state.count = 1;
    rs->adam_step = job->save ? 5 : 0;
    rs->state.adam_steps[0] = &rs->adam_step;
}

static float compare_loaded(const rank_state *rs, const layout_job *job) {
    float worst = 0;
    const ckpt_part *p = &rs->state.parts[0];
    for (int k = 0; k < 3; k++) {
        const int sharded = k == 0 ? p->params_sharded : p->moments_sharded;
        const size_t n = ckpt_vector_len(p, sharded);
        float *want = calloc(n, sizeof(float)), *got = calloc(n, sizeof(float));
        expected_values(rs, k, sharded, job->seed, want);
        ops_download(got, rs->vec[k], n * sizeof(float));
        const float d = (float)max_abs_diff(want, got, n);
        if (d > worst) worst = d;
        free(want);
        free(got);
    }
    return worst;
}

static int layout_rank(comm *world, void *arg) {
    layout_job *job = arg;
    const int rank = comm_rank(world);
    rank_state rs;
    rank_state_init(&rs, job, rank);
    run_config cfg = *job->cfg;
    cfg.save_dir = job->dir;
    cfg.save_test_crash = job->crash_at;
    if (job->save) {
        checkpoint_save(world, &cfg, job->spec->name, &rs.state, 5);
    } else {
        checkpoint_load(job->dir, &rs.state);
        float worst = compare_loaded(&rs, job), wrong = rs.adam_step != 5;
        comm_allreduce(world, &worst, 1, COMM_F32, COMM_MAX);
        comm_allreduce(world, &wrong, 1, COMM_F32, COMM_SUM);
        if (rank == 0 || !process_hosts_rank0()) {   /* one writer per process */
            job->worst = worst;
            job->wrong_steps = wrong;
        }
    }
    for (int k = 0; k < 3; k++) mem_free(rs.vec[k]);
    if (rs.has_layout) shard_layout_free(&rs.layout);
    return 0;
}

static void run_layout(layout_job *job) {
    comm_options opts = job->cfg->comm;
    opts.ranks = layout_world(job->spec);
    ck_assert_int_eq(launch(&opts, layout_rank, job), 0);
}

void layout_save(const layout_spec *l, const run_config *cfg, const char *dir, uint64_t seed,
                 int crash_at) {
    layout_job job = {.spec = l, .cfg = cfg, .dir = dir, .seed = seed, .save = 1,
                      .crash_at = crash_at};
    run_layout(&job);
}

float layout_load(const layout_spec *l, const run_config *cfg, const char *dir, uint64_t seed) {
    layout_job job = {.spec = l, .cfg = cfg, .dir = dir, .seed = seed};
    run_layout(&job);
    ck_assert_float_eq(job.wrong_steps, 0);
    return job.worst;
}

run_config layout_tiny_config(void) {
    run_config cfg = run_config_default();
    cfg.model = (gpt_config){.vocab = 257, .ctx = 7, .layers = 2, .heads = 2, .dim = 26};
    cfg.batch = 4;
    cfg.steps = 10;
    cfg.quiet = 1;
    cfg.comm.timeout_seconds = 30;
    return cfg;
}

static const char *scratch_root;

int layout_scratch_open(char *root_template) {
    scratch_root = mkdtemp(root_template);
    return scratch_root != NULL;
}

static int remove_tree(const char *path) {
    char cmd[300];
    ckpt_fits(snprintf(cmd, sizeof cmd, "rm -rf %s", path), sizeof cmd);
    return system(cmd) == 0;
}

const char *layout_scratch_dir(const char *name) {
    static char path[4][256];
    static int next;
    char *p = path[next++ % 4];
    ckpt_fits(snprintf(p, sizeof path[0], "%s/%s", scratch_root, name), sizeof path[0]);
    ck_assert(remove_tree(p));
    return p;
}

int layout_scratch_close(int status) {
    return remove_tree(scratch_root) ? status : 1;
}
