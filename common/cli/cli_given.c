#include "cli_given.h"

#include <string.h>

/* Each flag is given once (cli_parse refuses a second), so the list holds at most every
 * flag a program has. */
enum { GIVEN_MAX = 128 };
static const char *given_names[GIVEN_MAX], *given_texts[GIVEN_MAX];
static int given_count;

static int given_index(const char *name) {
    for (int i = 0; i < given_count; i++)
        if (strcmp(given_names[i], name) == 0) return i;
    return -1;
}

int cli_given(const char *name) { return given_index(name) >= 0; }

const char *cli_given_text(const char *name) {
    const int i = given_index(name);
    return i >= 0 ? given_texts[i] : NULL;
}

void cli_given_reset(void) { given_count = 0; }

void cli_given_add(const char *name, const char *text) {
    if (given_count == GIVEN_MAX) return;
    given_names[given_count] = name;
    given_texts[given_count++] = text;
}
