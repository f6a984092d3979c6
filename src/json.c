/* snapfg: a small JSON reader and writer (see json.h). */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>
#include <errno.h>
#include <math.h>

#include "json.h"

struct parser {
  const char *p, *end;
  char *err;
  size_t err_len;
  int depth;
};

static struct json_value *parse_value (struct parser *ps);

static void *
fail (struct parser *ps, const char *msg)
{
  if (ps->err && ps->err[0] == '\0')
    snprintf (ps->err, ps->err_len, "%s", msg);
  return NULL;
}

static void
skip_space (struct parser *ps)
{
  while (ps->p < ps->end &&
         (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
    ps->p++;
}

static bool
literal (struct parser *ps, const char *word)
{
  size_t n = strlen (word);

  if ((size_t) (ps->end - ps->p) < n || memcmp (ps->p, word, n) != 0)
    return false;
  ps->p += n;
  return true;
}

static struct json_value *
new_value (enum json_type type)
{
  struct json_value *v = calloc (1, sizeof *v);

  if (v)
    v->type = type;
  return v;
}

static int
hex_digit (char c)
{
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

static bool
read_hex4 (struct parser *ps, unsigned *out)
{
  unsigned v = 0;

  if (ps->end - ps->p < 4)
    return false;
  for (int i = 0; i < 4; ++i) {
    int d = hex_digit (ps->p[i]);
    if (d < 0)
      return false;
    v = v * 16 + d;
  }
  ps->p += 4;
  *out = v;
  return true;
}

static size_t
utf8_encode (unsigned cp, char *out)
{
  if (cp < 0x80) { out[0] = cp; return 1; }
  if (cp < 0x800) {
    out[0] = 0xc0 | (cp >> 6); out[1] = 0x80 | (cp & 0x3f); return 2;
  }
  if (cp < 0x10000) {
    out[0] = 0xe0 | (cp >> 12); out[1] = 0x80 | ((cp >> 6) & 0x3f);
    out[2] = 0x80 | (cp & 0x3f); return 3;
  }
  out[0] = 0xf0 | (cp >> 18); out[1] = 0x80 | ((cp >> 12) & 0x3f);
  out[2] = 0x80 | ((cp >> 6) & 0x3f); out[3] = 0x80 | (cp & 0x3f);
  return 4;
}

/* Parse a string starting at the opening quote.  The result is at most
 * as long as the input, so one allocation of that size suffices.
 */
static char *
parse_string_raw (struct parser *ps)
{
  const char *start = ++ps->p;       /* after the quote */
  char *out = malloc (ps->end - start + 1), *o = out;

  if (out == NULL)
    return fail (ps, "out of memory");
  while (ps->p < ps->end && *ps->p != '"') {
    unsigned char c = *ps->p;

    if (c < 0x20) {
      free (out);
      return fail (ps, "control character in string");
    }
    if (c != '\\') {
      *o++ = c;
      ps->p++;
      continue;
    }
    ps->p++;
    if (ps->p >= ps->end)
      break;
    c = *ps->p++;
    switch (c) {
    case '"': *o++ = '"'; break;
    case '\\': *o++ = '\\'; break;
    case '/': *o++ = '/'; break;
    case 'b': *o++ = '\b'; break;
    case 'f': *o++ = '\f'; break;
    case 'n': *o++ = '\n'; break;
    case 'r': *o++ = '\r'; break;
    case 't': *o++ = '\t'; break;
    case 'u': {
      unsigned cp, lo;
      if (!read_hex4 (ps, &cp)) {
        free (out);
        return fail (ps, "bad \\u escape in string");
      }
      if (cp >= 0xd800 && cp < 0xdc00) {
        /* A surrogate pair: \uD8xx\uDCxx.  6 input bytes make 4 output. */
        if (!literal (ps, "\\u") || !read_hex4 (ps, &lo) ||
            lo < 0xdc00 || lo >= 0xe000) {
          free (out);
          return fail (ps, "bad surrogate pair in string");
        }
        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
      }
      else if (cp >= 0xdc00 && cp < 0xe000) {
        free (out);
        return fail (ps, "lone low surrogate in string");
      }
      if (cp == 0) {
        free (out);
        return fail (ps, "NUL character in string");
      }
      o += utf8_encode (cp, o);
      break;
    }
    default:
      free (out);
      return fail (ps, "bad escape in string");
    }
  }
  if (ps->p >= ps->end) {
    free (out);
    return fail (ps, "unterminated string");
  }
  ps->p++;                            /* the closing quote */
  *o = '\0';
  return out;
}

static struct json_value *
parse_number (struct parser *ps)
{
  const char *start = ps->p;
  bool integer = true;
  char buf[64];
  struct json_value *v;
  char *endp;

  if (ps->p < ps->end && *ps->p == '-')
    ps->p++;
  if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
    return fail (ps, "bad number");
  if (*ps->p == '0')
    ps->p++;
  else
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
      ps->p++;
  if (ps->p < ps->end && *ps->p == '.') {
    integer = false;
    ps->p++;
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
      return fail (ps, "bad number");
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
      ps->p++;
  }
  if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
    integer = false;
    ps->p++;
    if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-'))
      ps->p++;
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
      return fail (ps, "bad number");
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
      ps->p++;
  }
  if ((size_t) (ps->p - start) >= sizeof buf)
    return fail (ps, "number too long");
  memcpy (buf, start, ps->p - start);
  buf[ps->p - start] = '\0';

  v = new_value (JSON_NUMBER);
  if (v == NULL)
    return fail (ps, "out of memory");
  v->number = strtod (buf, NULL);
  if (integer) {
    errno = 0;
    v->integer = strtoll (buf, &endp, 10);
    v->is_integer = errno == 0;
  }
  return v;
}

static bool
append_member (struct json_value *v, char *key, struct json_value *item)
{
  size_t n = v->count + 1;
  struct json_value **items = realloc (v->items, n * sizeof *items);

  if (items == NULL)
    return false;
  v->items = items;
  if (v->type == JSON_OBJECT) {
    char **keys = realloc (v->keys, n * sizeof *keys);
    if (keys == NULL)
      return false;
    v->keys = keys;
    keys[v->count] = key;
  }
  items[v->count] = item;
  v->count = n;
  return true;
}

static struct json_value *
parse_container (struct parser *ps, enum json_type type)
{
  const char close = type == JSON_OBJECT ? '}' : ']';
  struct json_value *v;

  if (++ps->depth > JSON_MAX_DEPTH)
    return fail (ps, "nested too deeply");
  v = new_value (type);
  if (v == NULL)
    return fail (ps, "out of memory");
  ps->p++;                            /* { or [ */
  skip_space (ps);
  if (ps->p < ps->end && *ps->p == close) {
    ps->p++;
    ps->depth--;
    return v;
  }
  for (;;) {
    char *key = NULL;
    struct json_value *item;

    skip_space (ps);
    if (type == JSON_OBJECT) {
      if (ps->p >= ps->end || *ps->p != '"') {
        json_free (v);
        return fail (ps, "expected a string key in object");
      }
      key = parse_string_raw (ps);
      if (key == NULL) {
        json_free (v);
        return NULL;
      }
      skip_space (ps);
      if (ps->p >= ps->end || *ps->p != ':') {
        free (key);
        json_free (v);
        return fail (ps, "expected ':' after key");
      }
      ps->p++;
    }
    item = parse_value (ps);
    if (item == NULL || !append_member (v, key, item)) {
      free (key);
      json_free (item);
      json_free (v);
      return fail (ps, "out of memory");
    }
    skip_space (ps);
    if (ps->p < ps->end && *ps->p == ',') {
      ps->p++;
      continue;
    }
    if (ps->p < ps->end && *ps->p == close) {
      ps->p++;
      ps->depth--;
      return v;
    }
    json_free (v);
    return fail (ps, type == JSON_OBJECT ? "expected ',' or '}' in object"
                 : "expected ',' or ']' in array");
  }
}

static struct json_value *
parse_value (struct parser *ps)
{
  struct json_value *v;

  skip_space (ps);
  if (ps->p >= ps->end)
    return fail (ps, "unexpected end of input");
  switch (*ps->p) {
  case '{': return parse_container (ps, JSON_OBJECT);
  case '[': return parse_container (ps, JSON_ARRAY);
  case '"': {
    char *s = parse_string_raw (ps);
    if (s == NULL)
      return NULL;
    v = new_value (JSON_STRING);
    if (v == NULL) {
      free (s);
      return fail (ps, "out of memory");
    }
    v->string = s;
    return v;
  }
  case 't': case 'f': case 'n':
    if (literal (ps, "true") || literal (ps, "false")) {
      v = new_value (JSON_BOOL);
      if (v)
        v->boolean = ps->p[-1] == 'e' && ps->p[-2] == 'u';
      return v ? v : fail (ps, "out of memory");
    }
    if (literal (ps, "null")) {
      v = new_value (JSON_NULL);
      return v ? v : fail (ps, "out of memory");
    }
    return fail (ps, "unknown literal");
  default:
    return parse_number (ps);
  }
}

struct json_value *
json_parse (const char *text, size_t len, char *err, size_t err_len)
{
  struct parser ps = { .p = text, .end = text + len, .err = err,
                       .err_len = err_len, .depth = 0 };
  struct json_value *v;

  if (err && err_len)
    err[0] = '\0';
  v = parse_value (&ps);
  if (v == NULL)
    return fail (&ps, "invalid JSON");
  skip_space (&ps);
  if (ps.p != ps.end) {
    json_free (v);
    return fail (&ps, "trailing characters after the JSON value");
  }
  return v;
}

void
json_free (struct json_value *v)
{
  if (v == NULL)
    return;
  for (size_t i = 0; i < v->count; ++i) {
    if (v->keys)
      free (v->keys[i]);
    json_free (v->items[i]);
  }
  free (v->keys);
  free (v->items);
  free (v->string);
  free (v);
}

const struct json_value *
json_get (const struct json_value *obj, const char *key)
{
  if (obj == NULL || obj->type != JSON_OBJECT)
    return NULL;
  for (size_t i = 0; i < obj->count; ++i)
    if (strcmp (obj->keys[i], key) == 0)
      return obj->items[i];
  return NULL;
}

const char *
json_get_string (const struct json_value *obj, const char *key)
{
  const struct json_value *v = json_get (obj, key);

  return v && v->type == JSON_STRING ? v->string : NULL;
}

/* --- writer --- */

static bool
reserve (struct json_buf *b, size_t more)
{
  if (b->failed)
    return false;
  if (b->len + more + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (b->len + more + 1 > cap)
      cap *= 2;
    char *d = realloc (b->data, cap);
    if (d == NULL) {
      b->failed = true;
      return false;
    }
    b->data = d;
    b->cap = cap;
  }
  return true;
}

void
json_buf_free (struct json_buf *b)
{
  free (b->data);
  memset (b, 0, sizeof *b);
}

void
json_raw (struct json_buf *b, const char *s)
{
  size_t n = strlen (s);

  if (!reserve (b, n))
    return;
  memcpy (b->data + b->len, s, n + 1);
  b->len += n;
}

void
json_printf (struct json_buf *b, const char *fmt, ...)
{
  va_list args;
  int n;

  va_start (args, fmt);
  n = vsnprintf (NULL, 0, fmt, args);
  va_end (args);
  if (n < 0 || !reserve (b, n))
    return;
  va_start (args, fmt);
  vsnprintf (b->data + b->len, n + 1, fmt, args);
  va_end (args);
  b->len += n;
}

void
json_string (struct json_buf *b, const char *s)
{
  json_raw (b, "\"");
  for (; s && *s; ++s) {
    unsigned char c = *s;
    switch (c) {
    case '"': json_raw (b, "\\\""); break;
    case '\\': json_raw (b, "\\\\"); break;
    case '\n': json_raw (b, "\\n"); break;
    case '\r': json_raw (b, "\\r"); break;
    case '\t': json_raw (b, "\\t"); break;
    default:
      if (c < 0x20)
        json_printf (b, "\\u%04x", c);
      else {
        char one[2] = { c, 0 };
        json_raw (b, one);
      }
    }
  }
  json_raw (b, "\"");
}

void
json_key (struct json_buf *b, const char *key, bool first)
{
  if (!first)
    json_raw (b, ",");
  json_string (b, key);
  json_raw (b, ":");
}
