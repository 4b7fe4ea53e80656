#include "safetensors.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "crc32.h"

/* ---- writing ------------------------------------------------------------------------ */

typedef struct {
    char *text;
    size_t len, cap;
} text_buf;

static void append(text_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void append(text_buf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->text + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < b->cap - b->len) { b->len += (size_t)n; return; }
        b->cap = 2 * b->cap + (size_t)(n > 0 ? n : 0) + 64;
        b->text = realloc(b->text, b->cap);
        if (!b->text) abort();
    }
}

static size_t numel_of(const st_tensor *t) {
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->dims[d];
    return n;
}

size_t safetensors_write(FILE *f, const st_tensor *tensors, int n, const char *metadata,
                         uint32_t *crc) {
    text_buf h = {.text = malloc(256), .cap = 256};
    if (!h.text) abort();
    append(&h, "{\"__metadata__\": {%s}", metadata ? metadata : "");
    size_t offset = 0;
    for (int i = 0; i < n; i++) {
        const st_tensor *t = &tensors[i];
        append(&h, ", \"%s\": {\"dtype\": \"F32\", \"shape\": [", t->name);
        for (int d = 0; d < t->ndim; d++) append(&h, "%s%zu", d ? ", " : "", t->dims[d]);
        const size_t bytes = numel_of(t) * sizeof(float);
        append(&h, "], \"data_offsets\": [%zu, %zu]}", offset, offset + bytes);
        offset += bytes;
    }
    append(&h, "}");
    while (h.len % 8) append(&h, " ");   /* the data starts 8-byte aligned */
    unsigned char len_bytes[8];
    for (int i = 0; i < 8; i++) len_bytes[i] = (unsigned char)((uint64_t)h.len >> (8 * i));
    uint32_t c = crc32_update(0, len_bytes, 8);
    c = crc32_update(c, h.text, h.len);
    int ok = fwrite(len_bytes, 1, 8, f) == 8 && fwrite(h.text, 1, h.len, f) == h.len;
    size_t total = 8 + h.len;
    for (int i = 0; i < n && ok; i++) {
        const size_t bytes = numel_of(&tensors[i]) * sizeof(float);
        ok = fwrite(tensors[i].data, 1, bytes, f) == bytes;
        c = crc32_update(c, tensors[i].data, bytes);
        total += bytes;
    }
    free(h.text);
    *crc = c;
    return ok ? total : 0;
}

/* ---- reading ------------------------------------------------------------------------ */

/* Checks one tensor entry against the data region. */
static int check_entry(const json_value *e, size_t data_len, char *err, size_t err_len) {
    const char *dtype = json_string(json_get(e, "dtype"));
    const json_value *shape = json_get(e, "shape"), *offsets = json_get(e, "data_offsets");
    unsigned long long begin, end, numel = 1;
    if (!dtype || strcmp(dtype, "F32") != 0) {
        snprintf(err, err_len, "tensor '%s': dtype is not F32", e->key);
        return 0;
    }
    if (!shape || shape->type != JSON_ARRAY || shape->count > ST_MAX_DIMS) {
        snprintf(err, err_len, "tensor '%s': shape is not a list of at most %d sizes", e->key,
                 ST_MAX_DIMS);
        return 0;
    }
    for (const json_value *d = shape->first; d; d = d->next) {
        unsigned long long size;
        if (!json_uint(d, &size) || size > (1ull << 40)) {
            snprintf(err, err_len, "tensor '%s': a size in its shape is not a count", e->key);
            return 0;
        }
        numel *= size;
        if (numel > (1ull << 40)) numel = 1ull << 41;   /* stays too large, no overflow */
    }
    if (!offsets || offsets->count != 2 || !json_uint(json_at(offsets, 0), &begin) ||
        !json_uint(json_at(offsets, 1), &end) || begin > end || end > data_len ||
        end - begin != numel * sizeof(float)) {
        snprintf(err, err_len, "tensor '%s': data_offsets do not fit its shape and the file's"
                 " %zu data bytes", e->key, data_len);
        return 0;
    }
    return 1;
}

/* Where each tensor's bytes lie, to find two tensors that share a name or a byte. */
typedef struct {
    const char *name;
    unsigned long long begin, end;
} extent;

static int by_name(const void *a, const void *b) {
    return strcmp(((const extent *)a)->name, ((const extent *)b)->name);
}

static int by_begin(const void *a, const void *b) {
    const extent *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

/* After every entry passed check_entry: no name twice (a reader would see only one of
 * them), no byte in two tensors (a write to one would change the other). */
static int check_extents(const json_value *root, char *err, size_t err_len) {
    extent *x = malloc((root->count + 1) * sizeof *x);
    if (!x) abort();
    size_t n = 0;
    for (const json_value *e = root->first; e; e = e->next) {
        if (strcmp(e->key, "__metadata__") == 0) continue;
        const json_value *offsets = json_get(e, "data_offsets");
        x[n].name = e->key;
        json_uint(json_at(offsets, 0), &x[n].begin);
        json_uint(json_at(offsets, 1), &x[n].end);
        n++;
    }
    int ok = 1;
    qsort(x, n, sizeof *x, by_name);
    for (size_t i = 1; i < n && ok; i++)
        if (strcmp(x[i - 1].name, x[i].name) == 0) {
            snprintf(err, err_len, "tensor '%s' is in the header twice", x[i].name);
            ok = 0;
        }
    qsort(x, n, sizeof *x, by_begin);
    for (size_t i = 1; i < n && ok; i++)
        if (x[i - 1].end > x[i].begin) {
            snprintf(err, err_len, "tensors '%s' and '%s' overlap (bytes %llu-%llu and %llu-%llu)",
                     x[i - 1].name, x[i].name, x[i - 1].begin, x[i - 1].end, x[i].begin, x[i].end);
            ok = 0;
        }
    free(x);
    return ok;
}

int safetensors_parse(const void *bytes, size_t size, st_file *out, char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    const unsigned char *b = bytes;
    if (size < 8) {
        snprintf(err, err_len, "%zu bytes: shorter than the 8-byte header length", size);
        return 0;
    }
    uint64_t header_len = 0;
    for (int i = 0; i < 8; i++) header_len |= (uint64_t)b[i] << (8 * i);
    if (header_len > size - 8) {
        snprintf(err, err_len, "header length %llu runs past the file's %zu bytes (truncated?)",
                 (unsigned long long)header_len, size);
        return 0;
    }
    char why[160];
    json_doc *doc = json_parse((const char *)b + 8, (size_t)header_len, why, sizeof why);
    const json_value *root = json_root(doc);
    if (!doc || root->type != JSON_OBJECT) {
        snprintf(err, err_len, "header is not a JSON object (%s)", doc ? "another value" : why);
        json_free(doc);
        return 0;
    }
    out->header = doc;
    out->data = b + 8 + header_len;
    out->data_len = size - 8 - (size_t)header_len;
    for (const json_value *e = root->first; e; e = e->next) {
        if (strcmp(e->key, "__metadata__") == 0) continue;
        if (!check_entry(e, out->data_len, err, err_len)) {
            safetensors_close(out);
            return 0;
        }
    }
    if (!check_extents(root, err, err_len)) {
        safetensors_close(out);
        return 0;
    }
    return 1;
}

void safetensors_close(st_file *f) {
    json_free(f->header);
    memset(f, 0, sizeof *f);
}

const unsigned char *safetensors_find(const st_file *f, const char *name, size_t *numel) {
    const json_value *e = json_get(json_root(f->header), name);
    unsigned long long begin, end;
    if (!e || strcmp(name, "__metadata__") == 0) return NULL;
    json_uint(json_at(json_get(e, "data_offsets"), 0), &begin);   /* checked when parsed */
    json_uint(json_at(json_get(e, "data_offsets"), 1), &end);
    *numel = (size_t)(end - begin) / sizeof(float);
    return f->data + begin;
}

const char *safetensors_metadata(const st_file *f, const char *key) {
    return json_string(json_get(json_get(json_root(f->header), "__metadata__"), key));
}
