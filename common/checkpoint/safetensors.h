/* The safetensors file format, written and read by hand:
 *
 *   8 bytes   N, the header's length, little-endian
 *   N bytes   a JSON object: "__metadata__" (string to string) and, per tensor,
 *             {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}
 *   the rest  raw little-endian data; offsets count from the end of the header
 *
 * Only F32 here. The reader checks everything it is given against the file's size, so
 * a truncated or corrupted file is an error message, never a read out of bounds; it
 * refuses offsets that do not match a tensor's shape, a name given twice and tensors
 * that share bytes. */
#ifndef SAFETENSORS_H
#define SAFETENSORS_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "json.h"

enum { ST_MAX_DIMS = 2 };

typedef struct {
    const char *name;
    int ndim;
    size_t dims[ST_MAX_DIMS];
    const float *data;   /* host memory, prod(dims) floats */
} st_tensor;

/* Writes the file to f; metadata: the members of __metadata__ as JSON text
 * ("\"k\": \"v\", ..."; string values only). Returns bytes written and the CRC-32 of
 * the whole file in *crc, or 0 on a write error. */
size_t safetensors_write(FILE *f, const st_tensor *tensors, int n, const char *metadata,
                         uint32_t *crc);

/* A parsed file over bytes the caller keeps alive (a mapping, a buffer). */
typedef struct {
    json_doc *header;
    const unsigned char *data;   /* after the header */
    size_t data_len;
} st_file;

/* 1 on success; 0 with why in err. */
int safetensors_parse(const void *bytes, size_t size, st_file *out, char *err, size_t err_len);
void safetensors_close(st_file *f);
/* The tensor called name: its bytes (floats, maybe unaligned: copy them out with
 * memcpy) and how many floats; NULL when absent. */
const unsigned char *safetensors_find(const st_file *f, const char *name, size_t *numel);
/* A __metadata__ string value, or NULL. */
const char *safetensors_metadata(const st_file *f, const char *key);

#endif
