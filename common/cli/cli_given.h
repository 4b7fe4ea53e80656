/* The flags given on the command line, by name, with their values as typed: what
 * cli_parse notes as it reads argv, and what the checks read to echo a value as the
 * user wrote it. */
#ifndef CLI_GIVEN_H
#define CLI_GIVEN_H

/* Whether --name was on the command line (after cli_parse). */
int cli_given(const char *name);
/* Its value as typed ("" for a flag that takes none), or NULL when not given. */
const char *cli_given_text(const char *name);

/* cli_parse's: forget the last command line; note one flag (name and text must outlive
 * the parse: argv's, or the option table's). */
void cli_given_reset(void);
void cli_given_add(const char *name, const char *text);

#endif
