/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: powers of two.
 *
 * Chunk sizes, block sizes and CBT granules are powers of two; these say
 * so once instead of "(x & (x - 1)) == 0" written out at every check
 * (which is also true of 0, the mistake these avoid).
 */
#ifndef SNAPFG_POWER_OF_TWO_H
#define SNAPFG_POWER_OF_TWO_H

#include <stdbool.h>
#include <stdint.h>

/* Is v a power of two (1, 2, 4, ...)?  0 is not. */
static inline bool
is_power_of_two (uint64_t v)
{
  return v != 0 && (v & (v - 1)) == 0;
}

/* log2 of a power of two (the shift that multiplies by it). */
static inline unsigned
log2_of_power_of_two (uint64_t v)
{
  return (unsigned) __builtin_ctzll (v);
}

/* The smallest power of two >= v (1 for 0), or 0 if that does not fit
 * in 64 bits (v > 2^63).
 */
static inline uint64_t
next_power_of_two (uint64_t v)
{
  if (v <= 1)
    return 1;
  if (v > (UINT64_C (1) << 63))
    return 0;
  return UINT64_C (1) << (64 - __builtin_clzll (v - 1));
}

#endif
