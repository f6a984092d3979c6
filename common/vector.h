/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: growable arrays.
 *
 *   DEFINE_VECTOR_TYPE (pair_vector, struct store_pair);
 *
 * defines
 *
 *   typedef struct { struct store_pair *ptr; size_t len, cap; } pair_vector;
 *   int  pair_vector_reserve (pair_vector *v, size_t n);   room for n more
 *   int  pair_vector_append (pair_vector *v, struct store_pair elem);
 *   int  pair_vector_append_n (pair_vector *v, const struct store_pair *p,
 *                              size_t n);             copies n elements of p
 *   void pair_vector_remove (pair_vector *v, size_t i);    keeps the order
 *   void pair_vector_clear (pair_vector *v);               len = 0, keeps memory
 *   void pair_vector_reset (pair_vector *v);               frees, back to empty
 *
 * A zero-initialised vector ({ 0 } or calloc) is empty and valid.
 * reserve, append and append_n return 0, -ENOMEM (the allocation failed) or
 * -EOVERFLOW (the size in bytes would not fit in a size_t); on error the
 * vector is unchanged.  The capacity doubles, so n appends cost O(n).
 * ptr may move on reserve or append: do not keep pointers into the array
 * across them.
 *
 * char_vector (a growable byte buffer: replies, lines read from a
 * socket) is defined here once for everyone.
 */
#ifndef SNAPFG_VECTOR_H
#define SNAPFG_VECTOR_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Make room for n more elements of elem_size bytes after len.  The
 * untyped part shared by every vector type.
 */
static inline int
vector_reserve_ (void **ptr, size_t *cap, size_t len, size_t n,
                 size_t elem_size)
{
  size_t want, new_cap, bytes;
  void *p;

  if (__builtin_add_overflow (len, n, &want))
    return -EOVERFLOW;
  if (want <= *cap)
    return 0;
  new_cap = *cap ? *cap : 8;
  while (new_cap < want)
    if (__builtin_mul_overflow (new_cap, 2, &new_cap)) {
      new_cap = want;
      break;
    }
  if (__builtin_mul_overflow (new_cap, elem_size, &bytes)) {
    /* Doubling overshoots: try exactly what is needed. */
    new_cap = want;
    if (__builtin_mul_overflow (new_cap, elem_size, &bytes))
      return -EOVERFLOW;
  }
  p = realloc (*ptr, bytes);
  if (p == NULL)
    return -ENOMEM;
  *ptr = p;
  *cap = new_cap;
  return 0;
}

#define DEFINE_VECTOR_TYPE(name, type)                                  \
  typedef struct {                                                      \
    type *ptr;                                                          \
    size_t len;                 /* elements in use */                   \
    size_t cap;                 /* elements allocated */                \
  } name;                                                               \
                                                                        \
  static inline __attribute__ ((unused)) int                            \
  name##_reserve (name *v, size_t n)                                    \
  {                                                                     \
    void *p = v->ptr;                                                   \
    int r = vector_reserve_ (&p, &v->cap, v->len, n, sizeof (type));    \
    v->ptr = p;                                                         \
    return r;                                                           \
  }                                                                     \
                                                                        \
  static inline __attribute__ ((unused)) int                            \
  name##_append (name *v, type elem)                                    \
  {                                                                     \
    if (v->len == v->cap) {                                             \
      int r = name##_reserve (v, 1);                                    \
      if (r < 0)                                                        \
        return r;                                                       \
    }                                                                   \
    v->ptr[v->len++] = elem;                                            \
    return 0;                                                           \
  }                                                                     \
                                                                        \
  static inline __attribute__ ((unused)) int                            \
  name##_append_n (name *v, const type *elems, size_t n)                \
  {                                                                     \
    int r = name##_reserve (v, n);                                      \
                                                                        \
    if (r < 0)                                                          \
      return r;                                                         \
    if (n > 0)                  /* elems may be NULL then */            \
      memcpy (&v->ptr[v->len], elems, n * sizeof (type));               \
    v->len += n;                                                        \
    return 0;                                                           \
  }                                                                     \
                                                                        \
  static inline __attribute__ ((unused)) void                           \
  name##_remove (name *v, size_t i)                                     \
  {                                                                     \
    memmove (&v->ptr[i], &v->ptr[i + 1],                                \
             (v->len - i - 1) * sizeof (type));                         \
    v->len--;                                                           \
  }                                                                     \
                                                                        \
  static inline __attribute__ ((unused)) void                           \
  name##_clear (name *v)                                                \
  {                                                                     \
    v->len = 0;                                                         \
  }                                                                     \
                                                                        \
  static inline __attribute__ ((unused)) void                           \
  name##_reset (name *v)                                                \
  {                                                                     \
    free (v->ptr);                                                      \
    v->ptr = NULL;                                                      \
    v->len = v->cap = 0;                                                \
  }                                                                     \
  struct name##_semicolon_ /* so that the macro takes a ';' */

DEFINE_VECTOR_TYPE (char_vector, char);

#endif
