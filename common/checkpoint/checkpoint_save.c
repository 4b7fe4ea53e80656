/* Saving: every rank writes the pieces it owns into its own safetensors file and a
 * fragment of the index; world rank 0 joins the fragments into index.json and makes
 * the checkpoint visible in one rename (checkpoint.h).
 *
 *   DIR/.tmp-step-NNNNNN/   created empty by rank 0; every rank writes and fsyncs
 *                           rank-R.safetensors and rank-R.json (its index fragment)
 *   barrier                 then rank 0: index.json (fsync), fragments removed,
 *                           the directory fsynced and renamed to DIR/step-NNNNNN,
 *                           DIR fsynced, DIR/latest-STRATEGY and then DIR/latest
 *                           each written beside and renamed over
 *   barrier
 * A crash before the rename leaves only a .tmp- directory, which no one loads (and the
 * next save removes); a crash after it leaves a complete checkpoint, whether or not
 * `latest` names it yet. A save that fails (a full disk) removes its .tmp- directory
 * before it exits, so that the next one has the space. Every step of this protocol goes
 * through save_step, the test seam of checkpoint.h. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc.h"
#include "checkpoint.h"
#include "crc32.h"
#include "fp8_linear.h"
#include "ops.h"
#include "safetensors.h"

static const char *const kind_prefix[3] = {"", "optimizer.m.", "optimizer.v."};

/* One save as every rank sees it. */
typedef struct {
    const char *dir, *tmp;   /* --save DIR and DIR/.tmp-step-NNNNNN */
    const char *strategy;    /* whose checkpoint: DIR/latest-STRATEGY names it */
    int crash_at;            /* the test hook: stop before this step (0: never) */
} save_ctx;

static atomic_int steps_started;   /* in this process, this save */
static ckpt_save_observer save_observer;

void checkpoint_observe_saves(ckpt_save_observer observer) { save_observer = observer; }

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

/* A failed step: the save's temporary directory goes (a full disk gets its space back),
 * then the process. The first rank of the process to fail does it (the others wait for
 * the exit); it renames the directory first, so that no other rank adds a file to it
 * while it is emptied (the new name is still a .tmp-step- one, for a later
 * checkpoint_clear_stale if this process is killed meanwhile). */
static _Noreturn void fail_io(const save_ctx *sc, const char *what, const char *path) {
    static pthread_mutex_t first_failure = PTHREAD_MUTEX_INITIALIZER;
    const int error = errno;
    pthread_mutex_lock(&first_failure);   /* never unlocked: this process is ending */
    fprintf(stderr, "checkpoint: cannot %s %s: %s\n", what, path, strerror(error));
    char doomed[4200];
    ckpt_fits(snprintf(doomed, sizeof doomed, "%s.failed", sc->tmp), sizeof doomed);
    remove_flat_dir(rename(sc->tmp, doomed) == 0 ? doomed : sc->tmp);
    exit(1);
}

/* Every step of the protocol starts here: counted, stopped by the test hook, observed. */
static void save_step(const save_ctx *sc, const char *action, const char *path) {
    const int n = atomic_fetch_add(&steps_started, 1) + 1;
    if (sc->crash_at && n == sc->crash_at) {
        fprintf(stderr, "checkpoint: test crash before step %d (%s %s)\n", n, action, path);
        _exit(COMM_EXIT_RANK_LOST);   /* a crash, which a restart may cure (comm.h) */
    }
    if (sc->crash_at && n > sc->crash_at) for (;;) pause();   /* the process is ending */
    if (save_observer) save_observer(action, path);
}

static void save_fsync(const save_ctx *sc, int fd, const char *path) {
    save_step(sc, "fsync", path);
    if (fsync(fd) != 0) fail_io(sc, "fsync", path);
}

static void fsync_path(const save_ctx *sc, const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) fail_io(sc, "open", path);
    save_fsync(sc, fd, path);
    close(fd);
}

static FILE *create_file(const save_ctx *sc, const char *path) {
    save_step(sc, "write", path);
    FILE *f = fopen(path, "wb");
    if (!f) fail_io(sc, "create", path);
    return f;
}

/* Flushes, fsyncs and closes a file this save wrote. */
static void finish_file(const save_ctx *sc, FILE *f, const char *path) {
    if (fflush(f) != 0) fail_io(sc, "write", path);
    save_fsync(sc, fileno(f), path);
    if (fclose(f) != 0) fail_io(sc, "write", path);
}

static void rename_step(const save_ctx *sc, const char *from, const char *to) {
    save_step(sc, "rename", to);
    if (rename(from, to) != 0) fail_io(sc, "rename into", to);
}

void checkpoint_clear_stale(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    char path[4096];
    for (struct dirent *e; (e = readdir(d));) {
        const int tmp_dir = strncmp(e->d_name, ".tmp-step-", 10) == 0;
        const size_t len = strlen(e->d_name);   /* .latest.tmp, .latest-STRATEGY.tmp */
        const int tmp_pointer = strncmp(e->d_name, ".latest", 7) == 0 && len >= 11 &&
                                strcmp(e->d_name + len - 4, ".tmp") == 0;
        if (!tmp_dir && !tmp_pointer) continue;
        ckpt_fits(snprintf(path, sizeof path, "%s/%s", dir, e->d_name), sizeof path);
        if (tmp_dir) remove_flat_dir(path);
        else unlink(path);
    }
    closedir(d);
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

/* Writes this rank's file and fragment into the temporary directory; returns the file's
 * bytes. */
static size_t write_rank_files(const save_ctx *sc, int rank, const char *strategy,
                             const ckpt_state *state, int step) {
    char file[64], path[4096], meta[512];
    ckpt_fits(snprintf(file, sizeof file, "rank-%05d.safetensors", rank), sizeof file);
    rank_pieces rp = {0};
    for (int i = 0; i < state->count; i++) collect_part(&rp, &state->parts[i], i, file);
    for (int i = 0; i < rp.count; i++) rp.tensors[i].name = rp.names[i];   /* names moved */
    ckpt_fits(snprintf(meta, sizeof meta, "\"format\": \"tiny-gpt2 sharded checkpoint 1\", \"strategy\": \"%s\","
             " \"step\": \"%d\", \"rank\": \"%d\"", strategy, step, rank), sizeof meta);
    ckpt_fits(snprintf(path, sizeof path, "%s/%s", sc->tmp, file), sizeof path);
    FILE *f = create_file(sc, path);
    uint32_t crc;
    const size_t bytes = safetensors_write(f, rp.tensors, rp.count, meta, &crc);
    if (!bytes) fail_io(sc, "write", path);
    finish_file(sc, f, path);
    ckpt_fits(snprintf(path, sizeof path, "%s/rank-%05d.json", sc->tmp, rank), sizeof path);
    f = create_file(sc, path);
    fprintf(f, "{\"file\": \"%s\", \"bytes\": %zu, \"crc32\": %u}\n%s", file, bytes, crc,
            rp.fragment ? rp.fragment : "");
    finish_file(sc, f, path);
    rank_pieces_free(&rp, state->count);
    return bytes;
}

/* ---- rank 0: the index and the renames ------------------------------------------------ */

/* Appends the file entry (first line) or the piece lines of a fragment, comma-joined. */
static void copy_fragment(const save_ctx *sc, FILE *out, const char *fragment_path,
                          int want_first, int *written) {
    FILE *in = fopen(fragment_path, "r");
    if (!in) fail_io(sc, "read", fragment_path);
    char line[1024];
    for (int n = 0; fgets(line, sizeof line, in); n++) {
        if ((n == 0) != want_first) continue;
        line[strcspn(line, "\n")] = '\0';
        fprintf(out, "%s\n    %s", (*written)++ ? "," : "", line);
    }
    fclose(in);
}

/* The metadata's members after "ranks": the precision and, with a dynamic loss scale,
 * its state (%.9g gives a float back exactly). */
static void write_run_state(FILE *f, const ckpt_run_state *run) {
    const ckpt_run_state fp32 = {.precision = PRECISION_FP32};
    if (!run) run = &fp32;
    fprintf(f, ", \"precision\": \"%s\"", precision_name(run->precision));
    if (run->fp8)   /* a bf16 run with FP8 linears */
        fprintf(f, ", \"fp8_recipe\": \"%s\", \"fp8_format\": \"%s\"",
                fp8_recipe_name((fp8_recipe)run->fp8_recipe),
                fp8_training_format_name((fp8_training_format)run->fp8_format));
    if (run->has_loss_scale)
        fprintf(f, ", \"loss_scale\": %.9g, \"loss_scale_clean_steps\": %d, \"skipped_steps\": %d",
                (double)run->loss_scale, run->clean_steps, run->skipped_steps);
}

/* The index's text up to its checksum line, in memory (so that its CRC-32 is known). */
static char *index_text(const save_ctx *sc, int ranks, const run_config *cfg,
                        const char *strategy, int step, const ckpt_state *state, size_t *len) {
    char *text = NULL, fragment[4096];
    FILE *f = open_memstream(&text, len);
    if (!f) abort();
    const gpt_config *m = &cfg->model;
    fprintf(f, "{\n  \"format\": \"tiny-gpt2 sharded checkpoint 1\",\n  \"metadata\": {\"vocab\": %d,"
            " \"ctx\": %d, \"layers\": %d, \"heads\": %d, \"dim\": %d, \"seed\": \"%llu\","
            " \"batch\": %d, \"step\": %d, \"adam_step\": %d, \"strategy\": \"%s\", \"ranks\": %d",
            m->vocab, m->ctx, m->layers, m->heads, m->dim, (unsigned long long)cfg->seed,
            cfg->batch, step, *state->adam_steps[0], strategy, ranks);
    write_run_state(f, state->run);
    fprintf(f, "},\n");
    for (int pass = 0; pass < 2; pass++) {
        fprintf(f, "  \"%s\": [", pass == 0 ? "files" : "pieces");
        int written = 0;
        for (int r = 0; r < ranks; r++) {
            ckpt_fits(snprintf(fragment, sizeof fragment, "%s/rank-%05d.json", sc->tmp, r), sizeof fragment);
            copy_fragment(sc, f, fragment, pass == 0, &written);
        }
        fprintf(f, "\n  ],");
    }
    if (fclose(f) != 0) abort();
    return text;
}

static void write_index(const save_ctx *sc, int ranks, const run_config *cfg,
                        const char *strategy, int step, const ckpt_state *state) {
    char path[4096], fragment[4096];
    size_t len;
    char *text = index_text(sc, ranks, cfg, strategy, step, state, &len);
    text[len] = '\n';   /* open_memstream's terminating NUL, now the newline */
    const uint32_t crc = crc32_update(0, text, len + 1);   /* every byte before the line */
    ckpt_fits(snprintf(path, sizeof path, "%s/index.json", sc->tmp), sizeof path);
    FILE *f = create_file(sc, path);
    if (fwrite(text, 1, len + 1, f) != len + 1) fail_io(sc, "write", path);
    fprintf(f, "%s%u\n}\n", CKPT_INDEX_CRC_LINE + 1, crc);
    free(text);
    finish_file(sc, f, path);
    for (int r = 0; r < ranks; r++) {
        ckpt_fits(snprintf(fragment, sizeof fragment, "%s/rank-%05d.json", sc->tmp, r), sizeof fragment);
        save_step(sc, "remove", fragment);
        unlink(fragment);
    }
}

/* Points DIR/pointer at checkpoint `name`: written beside, fsynced, renamed over. */
static void point_at(const save_ctx *sc, const char *pointer, const char *name) {
    char path[4096], tmp[4096];
    ckpt_fits(snprintf(path, sizeof path, "%s/%s", sc->dir, pointer), sizeof path);
    ckpt_fits(snprintf(tmp, sizeof tmp, "%s/.%s.tmp", sc->dir, pointer), sizeof tmp);
    FILE *f = create_file(sc, tmp);
    fprintf(f, "%s\n", name);
    finish_file(sc, f, tmp);
    rename_step(sc, tmp, path);
}

/* Renames tmp to the first free DIR/step-NNNNNN[-k] and points DIR/latest-STRATEGY, then
 * DIR/latest, at it. */
static void publish(const save_ctx *sc, int step, char *final, size_t final_len) {
    char name[64];
    struct stat st;
    for (int k = 0;; k++) {
        if (k == 0) ckpt_fits(snprintf(name, sizeof name, "step-%06d", step), sizeof name);
        else ckpt_fits(snprintf(name, sizeof name, "step-%06d-%d", step, k), sizeof name);
        snprintf(final, final_len, "%s/%s", sc->dir, name);
        if (stat(final, &st) != 0) break;
    }
    fsync_path(sc, sc->tmp);
    rename_step(sc, sc->tmp, final);
    fsync_path(sc, sc->dir);
    char own[128];
    checkpoint_own_pointer(sc->strategy, own, sizeof own);
    point_at(sc, own, name);
    point_at(sc, "latest", name);
    fsync_path(sc, sc->dir);
}

void checkpoint_save(comm *world, const run_config *cfg, const char *strategy,
                     const ckpt_state *state, int step) {
    const int rank = world ? comm_world_rank(world) : 0, ranks = world ? comm_size(world) : 1;
    const double start = comm_now();
    char tmp[4096];
    ckpt_fits(snprintf(tmp, sizeof tmp, "%s/.tmp-step-%06d", cfg->save_dir, step), sizeof tmp);
    const save_ctx sc = {.dir = cfg->save_dir, .tmp = tmp, .strategy = strategy,
                         .crash_at = cfg->save_test_crash};
    if (rank == 0 || !process_hosts_rank0()) atomic_store(&steps_started, 0);   /* per process */
    if (world) comm_barrier(world);
    if (rank == 0) {
        mkdir(cfg->save_dir, 0777);   /* may exist */
        checkpoint_clear_stale(cfg->save_dir);   /* a killed save's leftovers */
        save_step(&sc, "mkdir", tmp);
        if (mkdir(tmp, 0777) != 0) fail_io(&sc, "create", tmp);
    }
    if (world) comm_barrier(world);
    float bytes = (float)write_rank_files(&sc, rank, strategy, state, step);
    if (world) comm_allreduce(world, &bytes, 1, COMM_F32, COMM_SUM);   /* approximate: f32 */
    if (world) comm_barrier(world);
    if (rank == 0) {
        char final[4096];
        write_index(&sc, ranks, cfg, strategy, step, state);
        publish(&sc, step, final, sizeof final);
        if (!cfg->quiet)
            fprintf(stderr, "checkpoint: step %d saved to %s: %.2f MB in %.3f s\n", step, final,
                    bytes / 1e6, comm_now() - start);
    }
    if (world) comm_barrier(world);
}
