/* Training data: byte-level tokens (vocab 256) from a text, either a built-in corpus
 * with structure a small model learns quickly, or any file given with --data.
 *
 * A global batch is a list of sequences; sequence i of step s starts at a position
 * that depends only on (seed, s, i). A rank, a micro-step or a pipeline micro-batch
 * asks for its slice of sequences and gets exactly the rows the single-device baseline
 * would see. */
#ifndef DATA_H
#define DATA_H
#include <stddef.h>
#include <stdint.h>

typedef struct {
    unsigned char *bytes;
    size_t length;
    char name[64];
} dataset;

/* The built-in corpus: simple English-like sentences from a small grammar. */
dataset *dataset_builtin(void);
/* A data file is read whole into memory: at most this many bytes. */
#define DATASET_MAX_BYTES (1ULL << 30)

/* Reads a regular file of at most DATASET_MAX_BYTES; returns NULL and writes why to err
 * when it cannot be used for sequences of ctx tokens (too short needs at least ctx + 1
 * bytes; a directory, device or FIFO is refused before it is opened). */
dataset *dataset_load(const char *path, int ctx, char *err, size_t err_len);
void dataset_free(dataset *d);

/* Sequences [first, first + count) of step `step`'s global batch, T tokens each:
 * tokens[i*T + t] and targets[i*T + t] = the next byte. */
void dataset_batch(const dataset *d, uint64_t seed, int step, int first, int count, int T,
                   int *tokens, int *targets);

#endif
