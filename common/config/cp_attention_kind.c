#include "cp_attention_kind.h"

#include <stddef.h>

const char *const cp_attention_names[] = {"ring", "ulysses", NULL};
