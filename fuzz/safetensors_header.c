/* libFuzzer target: any bytes as a safetensors file, and as a JSON text. Nothing may
 * crash or read out of bounds (ASan + UBSan); whatever parses must answer lookups.
 *
 *   make fuzz SAN=address && build/cpu-address/fuzz/safetensors_header -max_total_time=60 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "json.h"
#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[256];
    st_file st;
    if (safetensors_parse(data, size, &st, err, sizeof err)) {
        for (const json_value *e = json_root(st.header)->first; e; e = e->next) {
            size_t numel = 0;
            const unsigned char *bytes = safetensors_find(&st, e->key, &numel);
            if (bytes && numel) {
                float first, last;   /* the whole range must be readable */
                memcpy(&first, bytes, sizeof first);
                memcpy(&last, bytes + 4 * (numel - 1), sizeof last);
                (void)first;
                (void)last;
            }
        }
        (void)safetensors_metadata(&st, "format");
        safetensors_close(&st);
    }
    json_doc *doc = json_parse((const char *)data, size, err, sizeof err);
    if (doc) {
        unsigned long long v;
        (void)json_uint(json_at(json_get(json_root(doc), "flat"), 0), &v);
        json_free(doc);
    }
    return 0;
}
