#include "data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "rng.h"

/* A small grammar of determiners, adjectives, nouns and verbs gives text with
 * spelling, word order and punctuation to learn, and no randomness a model can't
 * eventually predict within a word. */
static const char *const determiners[] = {"the", "a", "one", "every", "that"};
static const char *const adjectives[] = {"small", "red", "quiet", "old", "bright", "happy",
                                         "lazy", "green"};
static const char *const nouns[] = {"cat", "dog", "bird", "river", "tree", "child",
                                    "robot", "teacher", "house", "garden"};
static const char *const verbs[] = {"sees", "likes", "follows", "finds", "helps",
                                    "watches", "draws", "visits"};
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static const char *pick(const char *const *words, size_t n, uint64_t *counter) {
    return words[rng_hash(7, 1, (*counter)++) % n];
}

dataset *dataset_builtin(void) {
    const size_t target_length = 1 << 20;
    dataset *d = calloc(1, sizeof *d);
    if (!d || !(d->bytes = malloc(target_length + 256))) {
        fprintf(stderr, "error: out of memory\n");
        exit(1);
    }
    snprintf(d->name, sizeof d->name, "built-in sentences");
    uint64_t counter = 0;
    size_t at = 0;
    while (at < target_length) {
        char sentence[256];
        int n = snprintf(sentence, sizeof sentence, "%s %s %s %s %s %s. ",
                         pick(determiners, COUNT(determiners), &counter),
                         pick(adjectives, COUNT(adjectives), &counter),
                         pick(nouns, COUNT(nouns), &counter),
                         pick(verbs, COUNT(verbs), &counter),
                         pick(determiners, COUNT(determiners), &counter),
                         pick(nouns, COUNT(nouns), &counter));
        sentence[0] = (char)(sentence[0] - 'a' + 'A');
        memcpy(d->bytes + at, sentence, (size_t)n);
        at += (size_t)n;
    }
    d->length = at;
    return d;
}

/* Only a regular file has a size known before reading: a device (/dev/zero) or a FIFO
 * could grow without end or block forever, a directory has no bytes. */
static int check_data_file(const char *path, const struct stat *st, char *err,
                           size_t err_len) {
    if (S_ISDIR(st->st_mode)) {
        snprintf(err, err_len, "--data %s: is a directory; give a text file", path);
        return 0;
    }
    if (!S_ISREG(st->st_mode)) {
        snprintf(err, err_len, "--data %s: not a regular file (a device, FIFO or socket);"
                 " give a text file", path);
        return 0;
    }
    if ((unsigned long long)st->st_size > DATASET_MAX_BYTES) {
        snprintf(err, err_len, "--data %s: %lld bytes is more than the %llu bytes (1 GiB) a"
                 " data file may have", path, (long long)st->st_size, DATASET_MAX_BYTES);
        return 0;
    }
    return 1;
}

dataset *dataset_load(const char *path, int ctx, char *err, size_t err_len) {
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(err, err_len, "--data %s: cannot open (%s)", path, strerror(errno));
        return NULL;
    }
    if (!check_data_file(path, &st, err, err_len)) return NULL;
    const size_t length = (size_t)st.st_size;
    if (length < (size_t)ctx + 1) {
        snprintf(err, err_len, "--data %s: %zu bytes is too short; a sequence of --ctx %d"
                 " needs at least %d bytes", path, length, ctx, ctx + 1);
        return NULL;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, err_len, "--data %s: cannot open (%s)", path, strerror(errno));
        return NULL;
    }
    dataset *d = calloc(1, sizeof *d);
    if (d) d->bytes = malloc(length);
    if (!d || !d->bytes) {
        snprintf(err, err_len, "--data %s: out of memory for its %zu bytes", path, length);
        fclose(f);
        dataset_free(d);
        return NULL;
    }
    d->length = fread(d->bytes, 1, length, f);
    fclose(f);
    if (d->length != length) {
        snprintf(err, err_len, "--data %s: read %zu of its %zu bytes (it changed while"
                 " being read?)", path, d->length, length);
        dataset_free(d);
        return NULL;
    }
    const char *base = strrchr(path, '/');
    snprintf(d->name, sizeof d->name, "%s", base ? base + 1 : path);
    return d;
}

void dataset_free(dataset *d) {
    if (!d) return;
    free(d->bytes);
    free(d);
}

void dataset_batch(const dataset *d, uint64_t seed, int step, int first, int count, int T,
                   int *tokens, int *targets) {
    const size_t starts = d->length - (size_t)T;   /* start + T must be a valid index */
    for (int i = 0; i < count; i++) {
        uint64_t sequence = (uint64_t)(first + i);
        size_t start = rng_hash(seed, 1000 + (uint64_t)step, sequence) % starts;
        for (int t = 0; t < T; t++) {
            tokens[i * T + t] = d->bytes[start + t];
            targets[i * T + t] = d->bytes[start + t + 1];
        }
    }
}
