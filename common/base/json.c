/* A bounded recursive-descent JSON parser (json.h). */
#include "json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { JSON_MAX_DEPTH = 32 };

struct json_doc {
    json_value *values;   /* arena: at most one value per input byte, plus the root */
    size_t used, capacity;
    char *strings;        /* arena: decoded strings, at most len + one NUL per string */
    size_t strings_used, strings_capacity;
    json_value *root;
};

typedef struct {
    const char *text;
    size_t len, pos;
    json_doc *doc;
    char *err;
    size_t err_len;
    int failed;
} parser;

static int fail(parser *p, const char *what) {
    if (!p->failed) snprintf(p->err, p->err_len, "%s at byte %zu", what, p->pos);
    p->failed = 1;
    return 0;
}

static void skip_space(parser *p) {
    while (p->pos < p->len && strchr(" \t\r\n", p->text[p->pos]) && p->text[p->pos]) p->pos++;
}

static json_value *new_value(parser *p, json_type type) {
    json_doc *d = p->doc;
    if (d->used == d->capacity) { fail(p, "too many values"); return NULL; }
    json_value *v = &d->values[d->used++];
    memset(v, 0, sizeof *v);
    v->type = type;
    return v;
}

/* A string starting at the opening quote; returns it in the string arena. */
static const char *parse_string(parser *p) {
    json_doc *d = p->doc;
    p->pos++;   /* the quote */
    char *out = d->strings + d->strings_used;
    size_t n = 0;
    while (p->pos < p->len && p->text[p->pos] != '"') {
        char c = p->text[p->pos++];
        if ((unsigned char)c < 0x20) { fail(p, "control character in a string"); return NULL; }
        if (c == '\\') {
            if (p->pos >= p->len) break;
            char e = p->text[p->pos++];
            if (e != '"' && e != '\\' && e != '/') { fail(p, "unsupported escape"); return NULL; }
            c = e;
        }
        if (d->strings_used + n + 1 >= d->strings_capacity) { fail(p, "string arena full"); return NULL; }
        out[n++] = c;
    }
    if (p->pos >= p->len) { fail(p, "unterminated string"); return NULL; }
    p->pos++;   /* the closing quote */
    out[n] = '\0';
    d->strings_used += n + 1;
    return out;
}

static int parse_number(parser *p, json_value *v) {
    const size_t start = p->pos;
    while (p->pos < p->len && strchr("+-0123456789.eE", p->text[p->pos]) && p->text[p->pos])
        p->pos++;
    size_t n = p->pos - start;
    char buf[64];
    if (n == 0 || n >= sizeof buf) return fail(p, "bad number");
    memcpy(buf, p->text + start, n);
    buf[n] = '\0';
    char *end;
    v->number = strtod(buf, &end);
    if (*end) return fail(p, "bad number");
    return 1;
}

static int literal(parser *p, const char *word) {
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->text + p->pos, word, n) != 0)
        return fail(p, "unexpected character");
    p->pos += n;
    return 1;
}

static json_value *parse_value(parser *p, int depth);

/* The members of an array or object, after its opening bracket. */
static int parse_children(parser *p, json_value *parent, char close, int depth) {
    json_value **tail = &parent->first;
    skip_space(p);
    if (p->pos < p->len && p->text[p->pos] == close) { p->pos++; return 1; }
    for (;;) {
        const char *key = NULL;
        skip_space(p);
        if (parent->type == JSON_OBJECT) {
            if (p->pos >= p->len || p->text[p->pos] != '"') return fail(p, "expected a key");
            if (!(key = parse_string(p))) return 0;
            skip_space(p);
            if (p->pos >= p->len || p->text[p->pos] != ':') return fail(p, "expected ':'");
            p->pos++;
        }
        json_value *child = parse_value(p, depth + 1);
        if (!child) return 0;
        child->key = key;
        *tail = child;
        tail = &child->next;
        parent->count++;
        skip_space(p);
        if (p->pos >= p->len) return fail(p, "unexpected end");
        char c = p->text[p->pos++];
        if (c == close) return 1;
        if (c != ',') return fail(p, "expected ',' or a closing bracket");
    }
}

static json_value *parse_value(parser *p, int depth) {
    if (depth > JSON_MAX_DEPTH) { fail(p, "nested too deeply"); return NULL; }
    skip_space(p);
    if (p->pos >= p->len) { fail(p, "unexpected end"); return NULL; }
    const char c = p->text[p->pos];
    json_value *v = NULL;
    if (c == '{' || c == '[') {
        if (!(v = new_value(p, c == '{' ? JSON_OBJECT : JSON_ARRAY))) return NULL;
        p->pos++;
        return parse_children(p, v, c == '{' ? '}' : ']', depth) ? v : NULL;
    }
    if (c == '"') {
        if (!(v = new_value(p, JSON_STRING))) return NULL;
        return (v->string = parse_string(p)) ? v : NULL;
    }
    if (c == 't' || c == 'f') {
        if (!(v = new_value(p, JSON_BOOL))) return NULL;
        v->number = c == 't';
        return literal(p, c == 't' ? "true" : "false") ? v : NULL;
    }
    if (c == 'n') {
        if (!(v = new_value(p, JSON_NULL))) return NULL;
        return literal(p, "null") ? v : NULL;
    }
    if (!(v = new_value(p, JSON_NUMBER))) return NULL;
    return parse_number(p, v) ? v : NULL;
}

json_doc *json_parse(const char *text, size_t len, char *err, size_t err_len) {
    json_doc *d = calloc(1, sizeof *d);
    if (!d) abort();
    d->capacity = len + 1;
    d->strings_capacity = len + 1;
    d->values = malloc(d->capacity * sizeof *d->values);
    d->strings = malloc(d->strings_capacity);
    if (!d->values || !d->strings) abort();
    parser p = {.text = text, .len = len, .doc = d, .err = err, .err_len = err_len};
    d->root = parse_value(&p, 0);
    skip_space(&p);
    if (d->root && p.pos != p.len) fail(&p, "text after the value");
    if (p.failed || !d->root) {
        if (!p.failed) fail(&p, "no value");
        json_free(d);
        return NULL;
    }
    return d;
}

void json_free(json_doc *d) {
    if (!d) return;
    free(d->values);
    free(d->strings);
    free(d);
}

const json_value *json_root(const json_doc *d) { return d ? d->root : NULL; }

const json_value *json_get(const json_value *object, const char *key) {
    if (!object || object->type != JSON_OBJECT) return NULL;
    for (const json_value *c = object->first; c; c = c->next)
        if (strcmp(c->key, key) == 0) return c;
    return NULL;
}

const json_value *json_at(const json_value *array, size_t index) {
    if (!array || array->type != JSON_ARRAY) return NULL;
    const json_value *c = array->first;
    while (c && index--) c = c->next;
    return c;
}

const char *json_string(const json_value *v) {
    return v && v->type == JSON_STRING ? v->string : NULL;
}

int json_uint(const json_value *v, unsigned long long *out) {
    if (!v || v->type != JSON_NUMBER) return 0;
    const double x = v->number;
    if (!(x >= 0 && x <= 9007199254740992.0) || x != (double)(unsigned long long)x) return 0;
    *out = (unsigned long long)x;
    return 1;
}

int json_double(const json_value *v, double *out) {
    if (!v || v->type != JSON_NUMBER) return 0;
    *out = v->number;
    return 1;
}

const json_value *json_find(const json_value *array, const char *key, const char *value) {
    if (!array || array->type != JSON_ARRAY) return NULL;
    for (const json_value *c = array->first; c; c = c->next) {
        const char *s = json_string(json_get(c, key));
        if (s && strcmp(s, value) == 0) return c;
    }
    return NULL;
}
