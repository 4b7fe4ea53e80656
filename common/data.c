#include "data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

dataset *dataset_load(const char *path, int ctx, char *err, size_t err_len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, err_len, "--data %s: cannot open (%s)", path, strerror(errno));
        return NULL;
    }
    dataset *d = calloc(1, sizeof *d);
    size_t capacity = 1 << 16;
    d->bytes = malloc(capacity);
    size_t got;
    while ((got = fread(d->bytes + d->length, 1, capacity - d->length, f)) > 0) {
        d->length += got;
        if (d->length == capacity) d->bytes = realloc(d->bytes, capacity *= 2);
    }
    fclose(f);
    if (d->length < (size_t)ctx + 1) {
        snprintf(err, err_len, "--data %s: %zu bytes is too short; a sequence of --ctx %d"
                 " needs at least %d bytes", path, d->length, ctx, ctx + 1);
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
