/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* Unit test of src/vector.h: append, append_n and reserve grow the
 * array and keep its contents, remove keeps the order, and a reserve
 * that cannot fit in memory or in a size_t fails with the vector
 * unchanged.
 */

#include <config.h>

#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "vector.h"
#include "unit-test.h"

struct pair { uint64_t a, b; };

DEFINE_VECTOR_TYPE (int_vector, int);
DEFINE_VECTOR_TYPE (pair_vector, struct pair);
struct megabyte { char bytes[1 << 20]; };
DEFINE_VECTOR_TYPE (big_vector, struct megabyte);

int
main (void)
{
  int_vector iv = { 0 };
  pair_vector pv = { 0 };
  big_vector bv = { 0 };
  size_t cap;
  struct pair *before;

  /* An empty vector is valid: nothing allocated. */
  CHECK (iv.ptr == NULL && iv.len == 0 && iv.cap == 0);
  int_vector_reset (&iv);
  CHECK (iv.ptr == NULL);

  /* Appends keep every element, across many reallocations. */
  for (int i = 0; i < 100000; ++i)
    CHECK (int_vector_append (&iv, i * 3) == 0);
  CHECK (iv.len == 100000 && iv.cap >= iv.len);
  for (int i = 0; i < 100000; ++i)
    CHECK (iv.ptr[i] == i * 3);

  /* remove keeps the order of the rest. */
  int_vector_remove (&iv, 0);
  int_vector_remove (&iv, 500);
  int_vector_remove (&iv, iv.len - 1);
  CHECK (iv.len == 99997);
  CHECK (iv.ptr[0] == 3 && iv.ptr[499] == 1500 && iv.ptr[500] == 1506);
  CHECK (iv.ptr[iv.len - 1] == 99998 * 3);

  /* clear keeps the memory; reset frees it. */
  cap = iv.cap;
  int_vector_clear (&iv);
  CHECK (iv.len == 0 && iv.cap == cap && iv.ptr != NULL);
  int_vector_reset (&iv);
  CHECK (iv.ptr == NULL && iv.len == 0 && iv.cap == 0);

  /* reserve makes room in one step, and appends up to it do not move
   * the array.
   */
  CHECK (pair_vector_reserve (&pv, 1000) == 0);
  CHECK (pv.cap >= 1000 && pv.len == 0);
  CHECK (pair_vector_append (&pv, (struct pair) { 1, 2 }) == 0);
  before = pv.ptr;
  for (int i = 1; i < 1000; ++i)
    CHECK (pair_vector_append (&pv, (struct pair) { i, i * 2 }) == 0);
  CHECK (pv.ptr == before);
  CHECK (pv.ptr[999].a == 999 && pv.ptr[999].b == 1998);
  CHECK (pair_vector_reserve (&pv, 0) == 0);

  /* append_n copies a run after what is there, across reallocations;
   * zero elements (even from NULL) change nothing.
   */
  {
    char_vector cv = { 0 };
    char chunk[3000];

    for (size_t i = 0; i < sizeof chunk; ++i)
      chunk[i] = (char) (i % 251);
    CHECK (char_vector_append_n (&cv, NULL, 0) == 0);
    CHECK (cv.len == 0);
    CHECK (char_vector_append_n (&cv, "abc", 3) == 0);
    for (int i = 0; i < 10; ++i)
      CHECK (char_vector_append_n (&cv, chunk, sizeof chunk) == 0);
    CHECK (cv.len == 3 + 10 * sizeof chunk && cv.cap >= cv.len);
    CHECK (memcmp (cv.ptr, "abc", 3) == 0);
    for (int i = 0; i < 10; ++i)
      CHECK (memcmp (cv.ptr + 3 + i * sizeof chunk, chunk,
                     sizeof chunk) == 0);
    cap = cv.cap;
    CHECK (char_vector_append_n (&cv, chunk, SIZE_MAX) == -EOVERFLOW);
    CHECK (cv.len == 3 + 10 * sizeof chunk && cv.cap == cap);
    char_vector_reset (&cv);
  }

  /* Overflow: len + n past SIZE_MAX, and n elements whose bytes do not
   * fit in a size_t, fail with EOVERFLOW and change nothing.
   */
  cap = pv.cap;
  CHECK (pair_vector_reserve (&pv, SIZE_MAX) == -EOVERFLOW);
  CHECK (pair_vector_reserve (&pv, SIZE_MAX / sizeof (struct pair))
         == -EOVERFLOW);
  CHECK (pv.len == 1000 && pv.cap == cap && pv.ptr[999].a == 999);
  CHECK (big_vector_reserve (&bv, SIZE_MAX >> 19) == -EOVERFLOW);
  CHECK (bv.ptr == NULL && bv.cap == 0);

  /* An allocation that fits in a size_t but not in memory: ENOMEM,
   * unchanged.  (2^60 bytes is more than any address space here.)  The
   * sanitizers' allocators abort on such a request instead of failing
   * it, so there this check is left out.
   */
#if !defined (__SANITIZE_ADDRESS__) && !defined (__SANITIZE_THREAD__)
  CHECK (pair_vector_reserve (&pv, (SIZE_MAX >> 4) / sizeof (struct pair))
         == -ENOMEM);
  CHECK (pv.len == 1000 && pv.cap == cap && pv.ptr[0].a == 1);
#endif

  pair_vector_reset (&pv);
  big_vector_reset (&bv);
  printf ("vector: append, append_n, reserve, remove, clear, reset, "
          "overflow and out of memory: ok\n");
  return EXIT_SUCCESS;
}
