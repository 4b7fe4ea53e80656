/* Slicing-by-8: eight tables let the loop take 8 bytes per step instead of one (about
 * 4x the speed of the one-table loop here, which made the checksum most of a save's
 * time). Table k maps a byte to its CRC after k more zero bytes. Little-endian hosts. */
#include "crc32.h"

#include <pthread.h>
#include <string.h>

static uint32_t tables[8][256];

static void fill_tables(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        tables[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int k = 1; k < 8; k++)
            tables[k][i] = (tables[k - 1][i] >> 8) ^ tables[0][tables[k - 1][i] & 0xFF];
}

uint32_t crc32_update(uint32_t crc, const void *data, size_t n) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;   /* rank threads may come at once */
    pthread_once(&once, fill_tables);
    const unsigned char *p = data;
    crc = ~crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
        lo ^= crc;
        crc = tables[7][lo & 0xFF] ^ tables[6][(lo >> 8) & 0xFF] ^ tables[5][(lo >> 16) & 0xFF] ^
              tables[4][lo >> 24] ^ tables[3][hi & 0xFF] ^ tables[2][(hi >> 8) & 0xFF] ^
              tables[1][(hi >> 16) & 0xFF] ^ tables[0][hi >> 24];
    }
    for (; n > 0; n--, p++) crc = tables[0][(crc ^ *p) & 0xFF] ^ (crc >> 8);
    return ~crc;
}
