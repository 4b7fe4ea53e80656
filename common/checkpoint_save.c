/* Saving: every rank writes the pieces it owns into its own safetensors file and a
 * fragment of the index; world rank 0 joins the fragments into index.json and makes
 * the checkpoint visible in one rename (checkpoint.h).
 *
 *   DIR/.tmp-step-NNNNNN/   created empty by rank 0; every rank writes and fsyncs
 *                           rank-R.safetensors and rank-R.json (its index fragment)
 *   barrier                 then rank 0: index.json (fsync), fragments removed,
 *                           the directory fsynced and renamed to DIR/step-NNNNNN,
 *                           DIR fsynced, DIR/latest written beside and renamed over
 *   barrier
 * A crash before the rename leaves only a .tmp- directory, which no one loads; a crash
 * after it leaves a complete checkpoint, whether or not `latest` names it yet. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc.h"
#include "checkpoint.h"
#include "ops.h"
#include "safetensors.h"

static const char *const kind_prefix[3] = {"", "optimizer.m.", "optimizer.v."};

static void fail_io(const char *what, const char *path) {
    fprintf(stderr, "checkpoint: cannot %s %s: %m\n", what, path);
    exit(1);
}

static void fsync_path(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0 || fsync(fd) != 0) fail_io("fsync", path);
    close(fd);
}

/* Removes a directory this code wrote (plain files inside, no subdirectories). */
static void remove_flat_dir(const char *path) {
    DIR *d = opendir(path);
    if (!d) return;
    char file[4096];
    for (struct dirent *e; (e = readdir(d));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        ckpt_fits(snprintf(file, sizeof file, "%s/%s", path, e->d_name), sizeof file);
        unlink(file);
    }
    closedir(d);
    rmdir(path);
}

/* ---- one rank's pieces --------------------------------------------------------------- */

typedef struct {
    st_tensor *tensors;       /* for the safetensors file */
    char (*names)[CKPT_NAME_LEN + 16];
    char *fragment;           /* the index lines of these pieces */
    size_t fragment_len, fragment_cap;
    int count, cap;
    float *host[CKPT_MAX_PARTS][3];   /* host copies of each part's three vectors */
} rank_pieces;

static void fragment_add(rank_pieces *rp, const char *line) {
    const size_t n = strlen(line);
    if (rp->fragment_len + n + 1 > rp->fragment_cap) {
        rp->fragment_cap = 2 * (rp->fragment_len + n + 1);
        rp->fragment = realloc(rp->fragment, rp->fragment_cap);
        if (!rp->fragment) abort();
    }
    memcpy(rp->fragment + rp->fragment_len, line, n + 1);
    rp->fragment_len += n;
}

/* One piece: elements [lo, hi) of the slab, inside tensor t, in all three vectors. */
static void add_piece(rank_pieces *rp, const ckpt_part *p, int part, int slab,
                      const ckpt_tensor *t, size_t lo, size_t hi, const char *file) {
    const size_t a = lo - t->local_offset, b = hi - t->local_offset;
    const int whole_box = a == 0 && b == ckpt_box_numel(t);
    for (int k = 0; k < 3; k++) {
        if (rp->count == rp->cap) {
            rp->cap = 2 * rp->cap + 16;
            rp->tensors = realloc(rp->tensors, (size_t)rp->cap * sizeof *rp->tensors);
            rp->names = realloc(rp->names, (size_t)rp->cap * sizeof *rp->names);
            if (!rp->tensors || !rp->names) abort();
        }
        const int sharded = k == 0 ? p->params_sharded : p->moments_sharded;
        char *name = rp->names[rp->count];
        ckpt_fits(snprintf(name, sizeof rp->names[0], "%s%s", kind_prefix[k], t->name), sizeof rp->names[0]);
        st_tensor *s = &rp->tensors[rp->count++];
        *s = (st_tensor){.data = rp->host[part][k] + ckpt_element_index(p, sharded, slab, lo)};
        if (whole_box && t->ndim == 2) {
            s->ndim = 2;
            s->dims[0] = t->box_len[0];
            s->dims[1] = t->box_len[1];
        } else {
            s->ndim = 1;
            s->dims[0] = b - a;
        }
        char line[512];
        if (t->ndim == 2)
            snprintf(line, sizeof line, "{\"tensor\": \"%s\", \"shape\": [%zu, %zu], \"file\": \"%s\","
                     " \"box_start\": [%zu, %zu], \"box_shape\": [%zu, %zu], \"flat\": [%zu, %zu]}\n",
                     name, t->global[0], t->global[1], file, t->box_start[0], t->box_start[1],
                     t->box_len[0], t->box_len[1], a, b);
        else
            snprintf(line, sizeof line, "{\"tensor\": \"%s\", \"shape\": [%zu], \"file\": \"%s\","
                     " \"box_start\": [%zu], \"box_shape\": [%zu], \"flat\": [%zu, %zu]}\n",
                     name, t->global[1], file, t->box_start[1], t->box_len[1], a, b);
        fragment_add(rp, line);
    }
}

/* What this rank owns of slab `slab`: [*lo, *hi) of its elements (empty: lo == hi). */
static void owned_range(const ckpt_part *p, int slab, size_t *lo, size_t *hi) {
    if (p->layout) {
        *lo = p->layout->piece_offset[slab];
        *hi = *lo + p->layout->piece_len[slab];
    } else {
        *lo = 0;
        *hi = p->writes ? gpt_slab_numel(&p->shape, slab) : 0;
    }
}

static void collect_part(rank_pieces *rp, const ckpt_part *p, int part, const char *file) {
    float *device[3] = {p->params, p->adam_m, p->adam_v};
    for (int k = 0; k < 3; k++) {
        const size_t n = ckpt_vector_len(p, k == 0 ? p->params_sharded : p->moments_sharded);
        rp->host[part][k] = mem_alloc(MEM_OTHER, n * sizeof(float));
        ops_download(rp->host[part][k], device[k], n * sizeof(float));
    }
    ckpt_tensor tensors[CKPT_MAX_TENSORS];
    for (int slab = 0; slab < gpt_num_slabs(&p->shape); slab++) {
        if (gpt_slab_kind_of(&p->shape, slab) == GPT_SLAB_HEAD) continue;   /* = wte */
        size_t lo, hi;
        owned_range(p, slab, &lo, &hi);
        const int n = ckpt_slab_tensors(&p->shape, slab, tensors);
        for (int i = 0; i < n; i++) {
            const ckpt_tensor *t = &tensors[i];
            if (t->replicated && p->shape.tp_rank != 0) continue;   /* TP rank 0's copy */
            const size_t t_lo = t->local_offset, t_hi = t->local_offset + ckpt_box_numel(t);
            const size_t a = lo > t_lo ? lo : t_lo, b = hi < t_hi ? hi : t_hi;
            if (a < b) add_piece(rp, p, part, slab, t, a, b, file);
        }
    }
}

static void rank_pieces_free(rank_pieces *rp, int parts) {
    for (int i = 0; i < parts; i++)
        for (int k = 0; k < 3; k++) mem_free(rp->host[i][k]);
    free(rp->tensors);
    free(rp->names);
    free(rp->fragment);
}

/* Writes this rank's file and fragment into tmp; returns the file's bytes. */
static size_t write_rank_files(const char *tmp, int rank,
                               const char *strategy, const ckpt_state *state, int step) {
    char file[64], path[4096], meta[512];
    ckpt_fits(snprintf(file, sizeof file, "rank-%05d.safetensors", rank), sizeof file);
    rank_pieces rp = {0};
    for (int i = 0; i < state->count; i++) collect_part(&rp, &state->parts[i], i, file);
    for (int i = 0; i < rp.count; i++) rp.tensors[i].name = rp.names[i];   /* names moved */
    ckpt_fits(snprintf(meta, sizeof meta, "\"format\": \"tiny-gpt2 sharded checkpoint 1\", \"strategy\": \"%s\","
             " \"step\": \"%d\", \"rank\": \"%d\"", strategy, step, rank), sizeof meta);
    ckpt_fits(snprintf(path, sizeof path, "%s/%s", tmp, file), sizeof path);
    FILE *f = fopen(path, "wb");
    if (!f) fail_io("create", path);
    uint32_t crc;
    const size_t bytes = safetensors_write(f, rp.tensors, rp.count, meta, &crc);
    if (!bytes || fflush(f) != 0 || fsync(fileno(f)) != 0 || fclose(f) != 0)
        fail_io("write", path);
    ckpt_fits(snprintf(path, sizeof path, "%s/rank-%05d.json", tmp, rank), sizeof path);
    f = fopen(path, "w");
    if (!f) fail_io("create", path);
    fprintf(f, "{\"file\": \"%s\", \"bytes\": %zu, \"crc32\": %u}\n%s", file, bytes, crc,
            rp.fragment ? rp.fragment : "");
    if (fflush(f) != 0 || fsync(fileno(f)) != 0 || fclose(f) != 0) fail_io("write", path);
    rank_pieces_free(&rp, state->count);
    return bytes;
}

/* ---- rank 0: the index and the renames ------------------------------------------------ */

/* Appends the file entry (first line) or the piece lines of a fragment, comma-joined. */
static void copy_fragment(FILE *out, const char *fragment_path, int want_first, int *written) {
    FILE *in = fopen(fragment_path, "r");
    if (!in) fail_io("read", fragment_path);
    char line[1024];
    for (int n = 0; fgets(line, sizeof line, in); n++) {
        if ((n == 0) != want_first) continue;
        line[strcspn(line, "\n")] = '\0';
        fprintf(out, "%s\n    %s", (*written)++ ? "," : "", line);
    }
    fclose(in);
}

static void write_index(const char *tmp, int ranks, const run_config *cfg, const char *strategy,
                        int step, int adam_step) {
    char path[4096], fragment[4096];
    ckpt_fits(snprintf(path, sizeof path, "%s/index.json", tmp), sizeof path);
    FILE *f = fopen(path, "w");
    if (!f) fail_io("create", path);
    const gpt_config *m = &cfg->model;
    fprintf(f, "{\n  \"format\": \"tiny-gpt2 sharded checkpoint 1\",\n  \"metadata\": {\"vocab\": %d,"
            " \"ctx\": %d, \"layers\": %d, \"heads\": %d, \"dim\": %d, \"seed\": \"%llu\","
            " \"batch\": %d, \"step\": %d, \"adam_step\": %d, \"strategy\": \"%s\", \"ranks\": %d},\n",
            m->vocab, m->ctx, m->layers, m->heads, m->dim, (unsigned long long)cfg->seed,
            cfg->batch, step, adam_step, strategy, ranks);
    for (int pass = 0; pass < 2; pass++) {
        fprintf(f, "  \"%s\": [", pass == 0 ? "files" : "pieces");
        int written = 0;
        for (int r = 0; r < ranks; r++) {
            ckpt_fits(snprintf(fragment, sizeof fragment, "%s/rank-%05d.json", tmp, r), sizeof fragment);
            copy_fragment(f, fragment, pass == 0, &written);
        }
        fprintf(f, "\n  ]%s\n", pass == 0 ? "," : "");
    }
    fprintf(f, "}\n");
    if (fflush(f) != 0 || fsync(fileno(f)) != 0 || fclose(f) != 0) fail_io("write", path);
    for (int r = 0; r < ranks; r++) {
        ckpt_fits(snprintf(fragment, sizeof fragment, "%s/rank-%05d.json", tmp, r), sizeof fragment);
        unlink(fragment);
    }
}

/* Renames tmp to the first free DIR/step-NNNNNN[-k] and points DIR/latest at it. */
static void publish(const char *dir, const char *tmp, int step, char *final, size_t final_len) {
    char name[64];
    struct stat st;
    for (int k = 0;; k++) {
        if (k == 0) ckpt_fits(snprintf(name, sizeof name, "step-%06d", step), sizeof name);
        else ckpt_fits(snprintf(name, sizeof name, "step-%06d-%d", step, k), sizeof name);
        snprintf(final, final_len, "%s/%s", dir, name);
        if (stat(final, &st) != 0) break;
    }
    fsync_path(tmp);
    if (rename(tmp, final) != 0) fail_io("rename into", final);
    fsync_path(dir);
    char latest[4096], latest_tmp[4096];
    ckpt_fits(snprintf(latest, sizeof latest, "%s/latest", dir), sizeof latest);
    ckpt_fits(snprintf(latest_tmp, sizeof latest_tmp, "%s/.latest.tmp", dir), sizeof latest_tmp);
    FILE *f = fopen(latest_tmp, "w");
    if (!f) fail_io("create", latest_tmp);
    fprintf(f, "%s\n", name);
    if (fflush(f) != 0 || fsync(fileno(f)) != 0 || fclose(f) != 0) fail_io("write", latest_tmp);
    if (rename(latest_tmp, latest) != 0) fail_io("rename into", latest);
    fsync_path(dir);
}

void checkpoint_save(comm *world, const run_config *cfg, const char *strategy,
                     const ckpt_state *state, int step) {
    const int rank = world ? comm_world_rank(world) : 0, ranks = world ? comm_size(world) : 1;
    const double start = comm_now();
    char tmp[4096];
    ckpt_fits(snprintf(tmp, sizeof tmp, "%s/.tmp-step-%06d", cfg->save_dir, step), sizeof tmp);
    if (rank == 0) {
        mkdir(cfg->save_dir, 0777);   /* may exist */
        remove_flat_dir(tmp);         /* a crashed save's leftovers */
        if (mkdir(tmp, 0777) != 0) fail_io("create", tmp);
    }
    if (world) comm_barrier(world);
    /* the test hook: half the ranks write, then the save dies before the index */
    const int writes = !cfg->save_test_crash || rank < (ranks + 1) / 2;
    float bytes = writes ? (float)write_rank_files(tmp, rank, strategy, state, step) : 0;
    if (world) comm_allreduce(world, &bytes, 1, COMM_F32, COMM_SUM);   /* approximate: f32 */
    if (world) comm_barrier(world);
    if (cfg->save_test_crash) {
        if (rank == 0) {
            fprintf(stderr, "checkpoint: test crash after %d of %d files of step %d\n",
                    (ranks + 1) / 2, ranks, step);
            _exit(3);
        }
        for (;;) pause();   /* the process ends with rank 0 */
    }
    if (rank == 0) {
        char final[4096];
        write_index(tmp, ranks, cfg, strategy, step, *state->adam_steps[0]);
        publish(cfg->save_dir, tmp, step, final, sizeof final);
        if (!cfg->quiet)
            fprintf(stderr, "checkpoint: step %d saved to %s: %.2f MB in %.3f s\n", step, final,
                    bytes / 1e6, comm_now() - start);
    }
    if (world) comm_barrier(world);
}
