/* A small JSON reader for the files this project writes itself (checkpoint indexes,
 * safetensors headers, the programs' --json reports): the whole text parsed into a tree of values held in one
 * arena. Bounded: a nesting depth limit and no recursion beyond it, every length
 * checked, so any byte string (truncated, corrupted, random) is either a tree or a
 * clear error, never a crash. Strings keep their escapes undecoded except \" and \\
 * (names here are plain ASCII). */
#ifndef JSON_H
#define JSON_H
#include <stddef.h>

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } json_type;

typedef struct json_value json_value;
struct json_value {
    json_type type;
    double number;            /* JSON_NUMBER, JSON_BOOL (0 or 1) */
    const char *string;       /* JSON_STRING: NUL-terminated, in the arena */
    const char *key;          /* the member's name, inside an object */
    json_value *first, *next; /* children of an array or object; siblings */
    size_t count;             /* children */
};

typedef struct json_doc json_doc;

/* Parses text[0 .. len) (need not be NUL-terminated). NULL on error, with why (and
 * the byte offset) in err. */
json_doc *json_parse(const char *text, size_t len, char *err, size_t err_len);
void json_free(json_doc *d);
const json_value *json_root(const json_doc *d);

/* Lookups that tolerate NULL and wrong types (they return NULL / the fallback). */
const json_value *json_get(const json_value *object, const char *key);
const json_value *json_at(const json_value *array, size_t index);
const char *json_string(const json_value *v);        /* NULL unless a string */
/* 1 and *out when v is a number that is an integer from 0 to 2^53. */
int json_uint(const json_value *v, unsigned long long *out);
/* 1 and *out when v is a number (any); 0 otherwise (null, a string, NULL). */
int json_double(const json_value *v, double *out);
/* The first element of an array of objects whose member `key` is the string `value`
 * (the run named "zero2" among a report's runs); NULL when none is. */
const json_value *json_find(const json_value *array, const char *key, const char *value);

#endif
