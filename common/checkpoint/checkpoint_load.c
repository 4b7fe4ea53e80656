/* Loading and checking (checkpoint.h). checkpoint_check reads everything once before
 * any rank starts, so a bad checkpoint is one line and exit status 2; checkpoint_load
 * then lets each rank map the files and copy, from every saved piece of every tensor it
 * holds, the intersection with what it needs. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc.h"
#include "checkpoint.h"
#include "crc32.h"
#include "fp8_linear.h"
#include "matmul_f32.h"
#include "ops.h"
#include "safetensors.h"

static const char *const kind_prefix[3] = {"", "optimizer.m.", "optimizer.v."};

/* What `latest` and index.json may weigh: a name, and about 200 bytes per piece of a
 * model far larger than this course trains. */
enum { LATEST_MAX_BYTES = 4096 };
#define INDEX_MAX_BYTES (1ull << 30)

/* Opens path for reading if it is a regular file (a FIFO would block, a device such as
 * /dev/zero never ends): its descriptor and size, or -1 with why in err. */
static int open_regular(const char *path, size_t *size, char *err, size_t err_len) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);   /* a FIFO must not block */
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        snprintf(err, err_len, "%s: cannot read (%s)", path, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    if (!S_ISREG(sb.st_mode)) {
        snprintf(err, err_len, "%s: not a regular file (%s); a checkpoint holds plain files",
                 path, S_ISFIFO(sb.st_mode) ? "a FIFO" : S_ISDIR(sb.st_mode) ? "a directory"
                                                                           : "a device or socket");
        close(fd);
        return -1;
    }
    *size = (size_t)sb.st_size;
    return fd;
}

/* The whole of a regular file of at most max_bytes, in a malloc'd buffer (NULL with why
 * in err). */
static char *read_regular(const char *path, unsigned long long max_bytes, size_t *len,
                          char *err, size_t err_len) {
    size_t size;
    const int fd = open_regular(path, &size, err, err_len);
    if (fd < 0) return NULL;
    if (size > max_bytes) {
        snprintf(err, err_len, "%s: %zu bytes, more than the %llu such a file may have", path,
                 size, max_bytes);
        close(fd);
        return NULL;
    }
    char *buf = malloc(size + 1);
    if (!buf) abort();
    size_t n = 0;
    for (ssize_t got = 1; n < size && got > 0; n += got > 0 ? (size_t)got : 0)
        got = read(fd, buf + n, size - n);
    close(fd);
    if (n != size) {
        snprintf(err, err_len, "%s: read %zu of its %zu bytes (it changed while read?)", path,
                 n, size);
        free(buf);
        return NULL;
    }
    *len = size;
    return buf;
}

const char *checkpoint_dir_check(const char *flag, const char *dir, char *why, size_t why_len) {
    const size_t n = strlen(dir);
    if (n <= CKPT_DIR_MAX) return NULL;
    snprintf(why, why_len, "--%s: a path of %zu characters; at most %d (the checkpoint's"
             " files are named under it)", flag, n, CKPT_DIR_MAX);
    return why;
}

int checkpoint_read_pointer(const char *dir, const char *pointer, char *path, size_t path_len,
                            char *err, size_t err_len) {
    char probe[4096];
    ckpt_fits(snprintf(probe, sizeof probe, "%s/%s", dir, pointer), sizeof probe);
    size_t len;
    char *name = read_regular(probe, LATEST_MAX_BYTES, &len, err, err_len);
    if (!name) return 0;
    while (len > 0 && (name[len - 1] == '\n' || name[len - 1] == '\r')) len--;
    const int ok = len > 0 && len < 256 && !memchr(name, '/', len) && !memchr(name, '\0', len);
    if (ok) snprintf(path, path_len, "%s/%.*s", dir, (int)len, name);
    else snprintf(err, err_len, "%s: not the name of a checkpoint directory", probe);
    free(name);
    return ok;
}

int checkpoint_resolve(const char *dir, char *path, size_t path_len, char *err, size_t err_len) {
    char probe[4096];
    ckpt_fits(snprintf(probe, sizeof probe, "%s/index.json", dir), sizeof probe);
    if (access(probe, F_OK) == 0) {
        snprintf(path, path_len, "%s", dir);
        return 1;
    }
    ckpt_fits(snprintf(probe, sizeof probe, "%s/latest", dir), sizeof probe);
    struct stat sb;
    if (lstat(probe, &sb) != 0) {
        snprintf(err, err_len, "--resume %s: no checkpoint there (neither %s/index.json nor"
                 " %s/latest exists)", dir, dir, dir);
        return 0;
    }
    return checkpoint_read_pointer(dir, "latest", path, path_len, err, err_len);
}

/* ---- the index ------------------------------------------------------------------------ */

typedef struct {
    const char *tensor, *file;
    int ndim;
    size_t shape[2], box_start[2], box_len[2], flat[2];   /* 1-D: one row */
} saved_piece;

typedef struct {
    char dir[4096];
    json_doc *doc;
    const json_value *meta, *files;
    saved_piece *pieces;   /* sorted by tensor name */
    size_t count;
} index_file;

static int read_sizes(const json_value *list, int ndim, size_t *out) {
    if (!list || list->type != JSON_ARRAY || (int)list->count != ndim) return 0;
    for (int d = 0; d < ndim; d++) {
        unsigned long long v;
        if (!json_uint(json_at(list, (size_t)d), &v)) return 0;
        out[d] = (size_t)v;
    }
    return 1;
}

/* One piece's entry into p (1-D entries become one row); 0 when malformed. */
static int read_piece(const json_value *e, saved_piece *p) {
    memset(p, 0, sizeof *p);
    p->tensor = json_string(json_get(e, "tensor"));
    p->file = json_string(json_get(e, "file"));
    const json_value *shape = json_get(e, "shape");
    if (!p->tensor || !p->file || !shape || shape->count < 1 || shape->count > 2) return 0;
    p->ndim = (int)shape->count;
    size_t *dims[3] = {p->shape, p->box_start, p->box_len};
    const char *keys[3] = {"shape", "box_start", "box_shape"};
    for (int i = 0; i < 3; i++) {
        dims[i][0] = 1;
        dims[i][1] = 0;
        if (!read_sizes(json_get(e, keys[i]), p->ndim, dims[i] + (p->ndim == 1))) return 0;
        if (p->ndim == 1 && i == 0) dims[i][0] = 1;
        if (p->ndim == 1 && i == 1) dims[i][0] = 0;
    }
    if (!read_sizes(json_get(e, "flat"), 2, p->flat)) return 0;
    for (int d = 0; d < 2; d++)
        if (p->box_start[d] + p->box_len[d] > p->shape[d] || p->box_len[d] > p->shape[d]) return 0;
    return p->flat[0] <= p->flat[1] && p->flat[1] <= p->box_len[0] * p->box_len[1];
}

static int by_tensor(const void *a, const void *b) {
    return strcmp(((const saved_piece *)a)->tensor, ((const saved_piece *)b)->tensor);
}

static void index_free(index_file *x) {
    json_free(x->doc);
    free(x->pieces);
    memset(x, 0, sizeof *x);
}

/* index.json protects itself: its last member, index_crc32, is the CRC-32 of every byte
 * before that member's line (CKPT_INDEX_CRC_LINE), so an edited step or adam_step is
 * refused like a flipped bit in a rank file. An index without it is refused too: it
 * was written before indexes had a checksum, and its content cannot be trusted. */
static int index_crc_matches(const char *path, const char *text, size_t len,
                             const json_value *root, char *err, size_t err_len) {
    const size_t key_len = strlen(CKPT_INDEX_CRC_LINE);
    size_t at = len;   /* the last occurrence of the line's start */
    while (at > 0 && (at - 1 + key_len > len || memcmp(text + at - 1, CKPT_INDEX_CRC_LINE, key_len)))
        at--;
    unsigned long long saved;
    if (at == 0 || !json_uint(json_get(root, "index_crc32"), &saved)) {
        snprintf(err, err_len, "%s: no index_crc32 (written before indexes had a checksum, or"
                 " edited); it cannot be checked, save the checkpoint again", path);
        return 0;
    }
    const uint32_t crc = crc32_update(0, text, at);   /* up to and with the newline */
    if (crc != saved) {
        snprintf(err, err_len, "%s: CRC-32 %08x of its content, index_crc32 says %08llx"
                 " (edited or corrupted)", path, crc, saved);
        return 0;
    }
    return 1;
}

static int index_open(const char *dir, index_file *x, char *err, size_t err_len) {
    memset(x, 0, sizeof *x);
    if (!checkpoint_resolve(dir, x->dir, sizeof x->dir, err, err_len)) return 0;
    char path[4200], why[160];
    ckpt_fits(snprintf(path, sizeof path, "%s/index.json", x->dir), sizeof path);
    size_t len;
    char *text = read_regular(path, INDEX_MAX_BYTES, &len, err, err_len);
    if (!text) return 0;
    x->doc = json_parse(text, len, why, sizeof why);
    const json_value *root = json_root(x->doc);
    const int sound = !x->doc || index_crc_matches(path, text, len, root, err, err_len);
    free(text);
    if (!sound) {
        index_free(x);
        return 0;
    }
    x->meta = json_get(root, "metadata");
    x->files = json_get(root, "files");
    const json_value *pieces = json_get(root, "pieces");
    if (!x->doc || !x->meta || !x->files || !pieces || pieces->type != JSON_ARRAY ||
        x->files->type != JSON_ARRAY) {
        snprintf(err, err_len, "%s: not a checkpoint index (%s)", path,
                 x->doc ? "metadata, files or pieces missing" : why);
        index_free(x);
        return 0;
    }
    x->pieces = calloc(pieces->count + 1, sizeof *x->pieces);
    if (!x->pieces) abort();
    for (const json_value *e = pieces->first; e; e = e->next) {
        if (!read_piece(e, &x->pieces[x->count++])) {
            snprintf(err, err_len, "%s: piece %zu is malformed", path, x->count - 1);
            index_free(x);
            return 0;
        }
    }
    qsort(x->pieces, x->count, sizeof *x->pieces, by_tensor);
    return 1;
}

static int meta_int(const index_file *x, const char *key) {
    unsigned long long v;
    return json_uint(json_get(x->meta, key), &v) && v < 1000000000ull ? (int)v : -1;
}

/* The precision and loss scale of the metadata (checkpoint.h: absent, fp32 without a
 * loss scale); 0 with why in err when they are there but not valid. */
static int read_run_state(const index_file *x, ckpt_run_state *out, char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    out->precision = PRECISION_FP32;
    out->loss_scale = 1;
    const char *name = json_string(json_get(x->meta, "precision"));
    if (name && precision_parse(name, &out->precision) != 0) {
        snprintf(err, err_len, "%s/index.json: precision '%s' (fp32, bf16 or fp16 are known)",
                 x->dir, name);
        return 0;
    }
    out->precision_listed = name != NULL;
    const char *recipe = json_string(json_get(x->meta, "fp8_recipe"));
    fp8_recipe r;
    if (recipe && fp8_recipe_parse(recipe, &r) != 0) {
        snprintf(err, err_len, "%s/index.json: fp8_recipe '%s' (delayed, tensorwise, rowwise or"
                 " blockwise are known)", x->dir, recipe);
        return 0;
    }
    out->fp8 = recipe != NULL;
    out->fp8_recipe = recipe ? (int)r : 0;
    const char *format = json_string(json_get(x->meta, "fp8_format"));
    fp8_training_format ff = FP8_FORMAT_E4M3;   /* saved before the formats: e4m3 */
    if (format && fp8_training_format_parse(format, &ff) != 0) {
        snprintf(err, err_len, "%s/index.json: fp8_format '%s' (e4m3 or hybrid are known)",
                 x->dir, format);
        return 0;
    }
    out->fp8_format = (int)ff;
    const json_value *scale = json_get(x->meta, "loss_scale");
    if (!scale) return 1;
    double s;
    out->has_loss_scale = 1;
    out->clean_steps = meta_int(x, "loss_scale_clean_steps");
    out->skipped_steps = meta_int(x, "skipped_steps");
    if (!json_double(scale, &s) || !(s >= 1 && s <= 3.4e38) || out->clean_steps < 0 ||
        out->skipped_steps < 0) {
        snprintf(err, err_len, "%s/index.json: a loss scale >= 1 with its clean and skipped"
                 " steps (counts >= 0) expected in the metadata", x->dir);
        return 0;
    }
    out->loss_scale = (float)s;
    return 1;
}

/* ---- checking, before any rank starts -------------------------------------------------- */

static int check_model(const index_file *x, const run_config *cfg, char *err, size_t err_len) {
    const gpt_config *m = &cfg->model;
    const int mine[5] = {m->vocab, m->ctx, m->layers, m->heads, m->dim};
    const char *names[5] = {"vocab", "ctx", "layers", "heads", "dim"};
    for (int i = 0; i < 5; i++) {
        if (meta_int(x, names[i]) != mine[i]) {
            snprintf(err, err_len, "%s/index.json: saved from another model (--%s %d there,"
                     " %d here)", x->dir, names[i], meta_int(x, names[i]), mine[i]);
            return 0;
        }
    }
    char seed[32];
    ckpt_fits(snprintf(seed, sizeof seed, "%llu", (unsigned long long)cfg->seed), sizeof seed);
    const char *saved_seed = json_string(json_get(x->meta, "seed"));
    if (!saved_seed || strcmp(saved_seed, seed) != 0) {
        snprintf(err, err_len, "%s/index.json: saved with --seed %s, this run has --seed %s"
                 " (the data order follows the seed)", x->dir, saved_seed ? saved_seed : "?", seed);
        return 0;
    }
    return 1;
}

/* Every piece stored in `file` must be in its header with the right number of floats. */
static int check_pieces_of(const index_file *x, const char *file, const st_file *st,
                           char *err, size_t err_len) {
    for (size_t i = 0; i < x->count; i++) {
        const saved_piece *p = &x->pieces[i];
        if (strcmp(p->file, file) != 0) continue;
        size_t numel = 0;
        if (!safetensors_find(st, p->tensor, &numel) || numel != p->flat[1] - p->flat[0]) {
            snprintf(err, err_len, "%s/%s: tensor '%s' is missing or not the size the index"
                     " says", x->dir, file, p->tensor);
            return 0;
        }
    }
    return 1;
}

static int check_file(const index_file *x, const json_value *entry, char *err, size_t err_len) {
    const char *file = json_string(json_get(entry, "file"));
    unsigned long long bytes, crc;
    if (!file || strchr(file, '/') || strlen(file) > 255 ||
        !json_uint(json_get(entry, "bytes"), &bytes) ||
        !json_uint(json_get(entry, "crc32"), &crc)) {
        snprintf(err, err_len, "%s/index.json: a file entry is malformed", x->dir);
        return 0;
    }
    char path[4400], why[200];
    ckpt_fits(snprintf(path, sizeof path, "%s/%s", x->dir, file), sizeof path);
    size_t len;
    const int fd = open_regular(path, &len, err, err_len);
    if (fd < 0) return 0;
    if (len != bytes) {   /* before reading: the index bounds what is read */
        snprintf(err, err_len, "%s: %zu bytes, the index says %llu (%s)", path, len, bytes,
                 len < bytes ? "truncated?" : "appended to?");
        close(fd);
        return 0;
    }
    void *data = len ? mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (data == MAP_FAILED) {
        snprintf(err, err_len, "%s: cannot map (%s)", path, strerror(errno));
        return 0;
    }
    int ok = 0;
    st_file st;
    if (crc32_update(0, data, len) != crc)
        snprintf(err, err_len, "%s: CRC-32 %08x, the index says %08llx (corrupted)", path,
                 crc32_update(0, data, len), crc);
    else if (!safetensors_parse(data, len, &st, why, sizeof why))
        snprintf(err, err_len, "%s: %s", path, why);
    else {
        ok = check_pieces_of(x, file, &st, err, err_len);
        safetensors_close(&st);
    }
    if (data) munmap(data, len);
    return ok;
}

int checkpoint_check(const char *dir, const run_config *cfg, char *err, size_t err_len) {
    return checkpoint_check_until(dir, cfg, cfg->steps - 1, err, err_len);
}

int checkpoint_check_until(const char *dir, const run_config *cfg, int last_step, char *err,
                           size_t err_len) {
    index_file x;
    ckpt_run_state run;
    if (!index_open(dir, &x, err, err_len)) return -1;
    int step = meta_int(&x, "step");
    if (step < 0 || meta_int(&x, "adam_step") < 0) {
        snprintf(err, err_len, "%s/index.json: no step or adam_step in the metadata", x.dir);
        step = -1;
    } else if (!check_model(&x, cfg, err, err_len)) {
        step = -1;
    } else if (!read_run_state(&x, &run, err, err_len)) {
        step = -1;   /* any precision resumes any other: the parameters are fp32 */
    } else if (step > last_step) {
        snprintf(err, err_len, "--steps %d: the checkpoint in %s is at step %d; --steps is the"
                 " total, so a resumed run needs more than %d", cfg->steps, x.dir, step, step);
        step = -1;
    }
    for (const json_value *f = x.files->first; f && step >= 0; f = f->next)
        if (!check_file(&x, f, err, err_len)) step = -1;
    for (size_t i = 0; i < x.count && step >= 0; i++) {   /* pieces name listed files */
        int listed = 0;
        for (const json_value *f = x.files->first; f; f = f->next)
            listed |= json_string(json_get(f, "file")) &&
                      strcmp(json_string(json_get(f, "file")), x.pieces[i].file) == 0;
        if (!listed) {
            snprintf(err, err_len, "%s/index.json: piece '%s' is in %s, which no file entry"
                     " lists", x.dir, x.pieces[i].tensor, x.pieces[i].file);
            step = -1;
        }
    }
    index_free(&x);
    return step;
}


/* ---- loading, per rank --------------------------------------------------------------- */

typedef struct {
    const char *name;
    void *map;
    size_t size;
    st_file st;
} mapped_file;

typedef struct {
    index_file index;
    mapped_file *files;
    size_t num_files;
} loader;

/* checkpoint_check found the checkpoint sound before any rank started: a piece that
 * fails now changed since (as resume_source's), so the run stops as on any failure. */
static _Noreturn void load_fail(const char *what, const char *name) {
    fprintf(stderr, "checkpoint: %s %s\n", what, name);
    exit(1);
}

static const st_file *file_of(loader *ld, const char *name) {
    for (size_t i = 0; i < ld->num_files; i++)
        if (strcmp(ld->files[i].name, name) == 0) return &ld->files[i].st;
    char path[4400], why[200];
    ckpt_fits(snprintf(path, sizeof path, "%s/%s", ld->index.dir, name), sizeof path);
    mapped_file *m = &ld->files[ld->num_files++];
    const int fd = open_regular(path, &m->size, why, sizeof why);
    if (fd < 0) load_fail(why, "");
    m->name = name;
    m->map = m->size ? mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (m->size && m->map == MAP_FAILED) load_fail("cannot map", path);
    if (!safetensors_parse(m->map, m->size, &m->st, why, sizeof why)) load_fail(why, path);
    return &m->st;
}

/* The first piece of `tensor` in the sorted list, or count. */
static size_t first_piece(const index_file *x, const char *tensor) {
    size_t lo = 0, hi = x->count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (strcmp(x->pieces[mid].tensor, tensor) < 0) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Copies one row's run of a tensor, global row gr and columns [g0, g1), into dst (which
 * holds column g0 first), from every saved piece that has some of it. Returns floats
 * copied. */
static size_t copy_row(loader *ld, size_t first, const char *tensor, size_t gr, size_t g0,
                       size_t g1, float *dst) {
    size_t copied = 0;
    for (size_t i = first; i < ld->index.count && strcmp(ld->index.pieces[i].tensor, tensor) == 0;
         i++) {
        const saved_piece *p = &ld->index.pieces[i];
        if (gr < p->box_start[0] || gr >= p->box_start[0] + p->box_len[0]) continue;
        size_t x0 = g0 > p->box_start[1] ? g0 : p->box_start[1];
        size_t x1 = g1 < p->box_start[1] + p->box_len[1] ? g1 : p->box_start[1] + p->box_len[1];
        if (x0 >= x1) continue;
        /* the run's flat indices in the piece's box, cut to the flat range it holds */
        const size_t row_base = (gr - p->box_start[0]) * p->box_len[1] - p->box_start[1];
        size_t f0 = row_base + x0, f1 = row_base + x1;
        if (f0 < p->flat[0]) f0 = p->flat[0];
        if (f1 > p->flat[1]) f1 = p->flat[1];
        if (f0 >= f1) continue;
        size_t numel;
        const unsigned char *src = safetensors_find(file_of(ld, p->file), tensor, &numel);
        if (!src) load_fail("a piece is missing from", p->file);
        memcpy(dst + (f0 - row_base - g0), src + (f0 - p->flat[0]) * sizeof(float),
               (f1 - f0) * sizeof(float));
        copied += f1 - f0;
    }
    return copied;
}

/* Fills flat elements [a, b) of tensor t's box (this rank's slice) into dst. */
static void fill_tensor(loader *ld, const ckpt_tensor *t, const char *name, size_t a, size_t b,
                        float *dst) {
    const size_t cols = t->box_len[1], first = first_piece(&ld->index, name);
    size_t copied = 0;
    for (size_t row = a / cols; row * cols < b; row++) {
        const size_t c0 = row * cols < a ? a - row * cols : 0;
        const size_t c1 = (row + 1) * cols > b ? b - row * cols : cols;
        copied += copy_row(ld, first, name, t->box_start[0] + row, t->box_start[1] + c0,
                           t->box_start[1] + c1, dst + (row * cols + c0 - a));
    }
    if (copied != b - a) load_fail("does not hold all of tensor", name);
}

static void load_vector(loader *ld, const ckpt_part *p, int kind, float *device) {
    const int sharded = kind == 0 ? p->params_sharded : p->moments_sharded;
    const size_t n = ckpt_vector_len(p, sharded);
    float *host = mem_alloc(MEM_OTHER, n * sizeof(float));
    memset(host, 0, n * sizeof(float));   /* wte's padding rows stay zero */
    ckpt_tensor tensors[CKPT_MAX_TENSORS];
    char name[CKPT_NAME_LEN + 16];
    for (int slab = 0; slab < gpt_num_slabs(&p->shape); slab++) {
        size_t lo = 0, hi = gpt_slab_numel(&p->shape, slab);
        if (sharded) {
            lo = p->layout->piece_offset[slab];
            hi = lo + p->layout->piece_len[slab];
        }
        const int count = ckpt_slab_tensors(&p->shape, slab, tensors);
        for (int i = 0; i < count; i++) {
            const ckpt_tensor *t = &tensors[i];
            const size_t t_lo = t->local_offset, t_hi = t_lo + ckpt_box_numel(t);
            const size_t a = lo > t_lo ? lo : t_lo, b = hi < t_hi ? hi : t_hi;
            if (a >= b) continue;
            ckpt_fits(snprintf(name, sizeof name, "%s%s", kind_prefix[kind], t->name), sizeof name);
            fill_tensor(ld, t, name, a - t_lo, b - t_lo,
                        host + ckpt_element_index(p, sharded, slab, a));
        }
    }
    ops_upload(device, host, n * sizeof(float));
    mem_free(host);
}

int checkpoint_load(const char *dir, const ckpt_state *state) {
    loader ld;
    char err[512];
    if (!index_open(dir, &ld.index, err, sizeof err)) load_fail(err, "");
    ld.files = calloc(ld.index.files->count + 1, sizeof *ld.files);
    if (!ld.files) abort();
    ld.num_files = 0;
    for (int i = 0; i < state->count; i++) {
        const ckpt_part *p = &state->parts[i];
        float *device[3] = {p->params, p->adam_m, p->adam_v};
        for (int k = 0; k < 3; k++) load_vector(&ld, p, k, device[k]);
    }
    matmul_weights_changed();   /* weights written in place: kept layouts are stale */
    for (int i = 0; state->adam_steps[i]; i++)
        *state->adam_steps[i] = meta_int(&ld.index, "adam_step");
    if (state->run && !read_run_state(&ld.index, state->run, err, sizeof err)) load_fail(err, "");
    const int step = meta_int(&ld.index, "step");
    for (size_t i = 0; i < ld.num_files; i++) {
        safetensors_close(&ld.files[i].st);
        if (ld.files[i].map) munmap(ld.files[i].map, ld.files[i].size);
    }
    free(ld.files);
    index_free(&ld.index);
    return step;
}

void checkpoint_print_resumed(FILE *out, const char *dir, int step, const ckpt_run_state *saved,
                              int scale_restored) {
    char path[4096], err[512], listed[64] = "";
    if (!checkpoint_resolve(dir, path, sizeof path, err, sizeof err))
        snprintf(path, sizeof path, "%s", dir);
    if (saved->fp8)
        snprintf(listed, sizeof listed, ", saved in fp8 (%s, %s)",
                 fp8_recipe_name((fp8_recipe)saved->fp8_recipe),
                 fp8_training_format_name((fp8_training_format)saved->fp8_format));
    else if (saved->precision_listed)
        snprintf(listed, sizeof listed, ", saved in %s", precision_name(saved->precision));
    char scale[96] = "";
    if (scale_restored)
        snprintf(scale, sizeof scale, "; loss scale %.9g restored (%d clean, %d skipped steps)",
                 (double)saved->loss_scale, saved->clean_steps, saved->skipped_steps);
    fprintf(out, "checkpoint: resumed from %s at step %d%s%s\n", path, step, listed, scale);
}
