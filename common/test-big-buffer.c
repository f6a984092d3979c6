/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* Unit test of common/big-buffer.h. */

#include <config.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "big-buffer.h"
#include "unit-test.h"

#define MIB (1024 * 1024)

/* A buffer of len bytes: 2 MiB aligned, zeroed, and every byte of it
 * writable and kept (a pattern written at both ends and every 4 KiB
 * reads back).
 */
static void
check_buffer (size_t len)
{
  unsigned char *p = big_alloc (len);

  if (p == NULL)
    FAIL ("big_alloc (%zu): %m", len);
  CHECK ((uintptr_t) p % (2 * MIB) == 0);
  for (size_t i = 0; i < len; i += 4096)
    CHECK (p[i] == 0);
  CHECK (p[len - 1] == 0);
  for (size_t i = 0; i < len; i += 4096)
    p[i] = (unsigned char) (i / 4096 + 1);
  p[len - 1] = 0xa5;
  for (size_t i = 0; i + 1 < len; i += 4096)
    CHECK (p[i] == (unsigned char) (i / 4096 + 1));
  CHECK (p[len - 1] == 0xa5);
  big_free (p, len);
}

int
main (void)
{
  /* Smaller than a huge page, one chunk, one chunk and a byte (the
   * rounding up), several chunks.
   */
  check_buffer (1);
  check_buffer (4096);
  check_buffer (4 * MIB);
  check_buffer (4 * MIB + 1);
  check_buffer (16 * MIB);

  /* Many in turn: each freed whole (a leak of the unaligned ends would
   * show as address space growing, not here; this checks that freeing
   * and mapping again works and the new memory is zeroed again).
   */
  for (int i = 0; i < 64; ++i)
    check_buffer (4 * MIB);

  /* Nothing to allocate, or more than can be mapped: NULL and EINVAL. */
  errno = 0;
  CHECK (big_alloc (0) == NULL && errno == EINVAL);
  errno = 0;
  CHECK (big_alloc (SIZE_MAX) == NULL && errno == EINVAL);
  big_free (NULL, 4 * MIB);

  printf ("big-buffer: big_alloc, big_free: ok\n");
  return EXIT_SUCCESS;
}
