/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: buffers of whole chunks (see big-buffer.h). */

#include <config.h>

#include <errno.h>
#include <stdint.h>
#include <sys/mman.h>

#include "big-buffer.h"
#include "rounding.h"

#define HUGE_PAGE (2 * 1024 * 1024)

void *
big_alloc (size_t len)
{
  size_t size, span;
  char *p, *aligned;

  if (len == 0 || len > SIZE_MAX - 2 * HUGE_PAGE) {
    errno = EINVAL;
    return NULL;
  }
  size = round_up (len, HUGE_PAGE);
  /* One huge page more than needed, then the unaligned ends unmapped:
   * mmap only promises 4 KiB alignment.
   */
  span = size + HUGE_PAGE;
  p = mmap (NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
            -1, 0);
  if (p == MAP_FAILED)
    return NULL;
  aligned = (char *) (uintptr_t) round_up ((uintptr_t) p, HUGE_PAGE);
  if (aligned > p)
    munmap (p, aligned - p);
  if (aligned + size < p + span)
    munmap (aligned + size, p + span - (aligned + size));
#ifdef MADV_HUGEPAGE
  /* Only advice: without transparent huge pages it is 4 KiB pages. */
  madvise (aligned, size, MADV_HUGEPAGE);
#endif
  return aligned;
}

void
big_free (void *p, size_t len)
{
  if (p)
    munmap (p, round_up (len, HUGE_PAGE));
}
