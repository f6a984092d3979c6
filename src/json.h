/* snapfg: a small JSON reader and writer for the control protocol.
 *
 * The reader builds a tree from one complete JSON text (objects, arrays,
 * strings with escapes including \uXXXX, numbers, true/false/null),
 * bounded in nesting depth, and never reads past the given length.  The
 * writer appends to a growable buffer.
 */
#ifndef SNAPFG_JSON_H
#define SNAPFG_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum json_type {
  JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT,
};

struct json_value {
  enum json_type type;
  bool boolean;
  double number;
  bool is_integer;              /* a number written without . or e */
  int64_t integer;              /* its value, when is_integer */
  char *string;                 /* JSON_STRING (NUL-terminated, no NULs) */
  size_t count;                 /* JSON_ARRAY / JSON_OBJECT members */
  char **keys;                  /* JSON_OBJECT */
  struct json_value **items;
};

#define JSON_MAX_DEPTH 32

/* Parse text[0..len).  Returns the tree, or NULL with a message in err. */
extern struct json_value *json_parse (const char *text, size_t len,
                                      char *err, size_t err_len);
extern void json_free (struct json_value *v);

/* Member of an object by key (NULL if absent or not an object). */
extern const struct json_value *json_get (const struct json_value *obj,
                                          const char *key);
extern const char *json_get_string (const struct json_value *obj,
                                    const char *key);

/* A growable output buffer. */
struct json_buf {
  char *data;
  size_t len, cap;
  bool failed;                  /* out of memory: data is incomplete */
};

extern void json_buf_free (struct json_buf *b);
extern void json_raw (struct json_buf *b, const char *s);
extern void json_printf (struct json_buf *b, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));
/* A quoted, escaped JSON string. */
extern void json_string (struct json_buf *b, const char *s);
/* "key": (with a leading comma unless first) */
extern void json_key (struct json_buf *b, const char *key, bool first);

#endif
