/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: rounding to a multiple.
 *
 *   round_up (x, a), round_down (x, a)   a a power of two (chunk and
 *                                        block sizes): bit masks
 *   div_round_up (n, d)                  any d > 0: how many d-sized
 *                                        pieces hold n (chunks of a size,
 *                                        metadata areas of a table)
 *
 * All take and return uint64_t.  round_up and div_round_up cannot wrap:
 * a result that would not fit in 64 bits is UINT64_MAX rounded down to
 * the multiple (round_up) and the exact quotient (div_round_up never
 * overflows), so a caller comparing against a limit sees a value over it
 * rather than a small wrapped one.
 */
#ifndef SNAPFG_ROUNDING_H
#define SNAPFG_ROUNDING_H

#include <stdint.h>

#include "power-of-two.h"

static inline uint64_t
round_down (uint64_t x, uint64_t align)
{
  return x & ~(align - 1);
}

static inline uint64_t
round_up (uint64_t x, uint64_t align)
{
  if (x > UINT64_MAX - (align - 1))
    return round_down (UINT64_MAX, align);   /* saturate, don't wrap */
  return (x + align - 1) & ~(align - 1);
}

static inline uint64_t
div_round_up (uint64_t n, uint64_t d)
{
  return n / d + (n % d != 0);
}

#endif
