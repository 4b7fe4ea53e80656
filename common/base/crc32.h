/* CRC-32 (the zlib / PNG polynomial, reflected 0xEDB88320): what Python's
 * zlib.crc32 computes, so a checkpoint's checksums can be checked from Python too. */
#ifndef CRC32_H
#define CRC32_H
#include <stddef.h>
#include <stdint.h>

/* Continues crc over n more bytes (start with crc = 0). */
uint32_t crc32_update(uint32_t crc, const void *data, size_t n);

#endif
