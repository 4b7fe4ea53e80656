/* The CPU-only build's answer to "which GPU backend is linked in": none. (GPU=1 builds
 * link gpu/'s table instead of this file.) */
#include "device.h"

#include <stddef.h>

const device_backend *device_gpu_backend(void) { return NULL; }
