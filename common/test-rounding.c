/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* Unit test of src/rounding.h. */

#include <config.h>

#include <stdint.h>

#include "rounding.h"
#include "unit-test.h"

int
main (void)
{
  /* round_down / round_up against the division-based definitions, over
   * every alignment a chunk or block can have and values around its
   * multiples.
   */
  for (unsigned shift = 0; shift <= 20; ++shift) {
    uint64_t a = UINT64_C (1) << shift;
    for (uint64_t m = 0; m < 5; ++m)
      for (int64_t d = -2; d <= 2; ++d) {
        uint64_t x = m * a + d;
        if (d < 0 && m == 0)
          continue;
        CHECK (round_down (x, a) == x / a * a);
        CHECK (round_up (x, a) == (x + a - 1) / a * a);
        CHECK (round_up (x, a) % a == 0 && round_up (x, a) >= x);
        CHECK (round_up (x, a) - x < a);
      }
  }
  CHECK (round_up (0, 4096) == 0);
  CHECK (round_up (1, 4096) == 4096);
  CHECK (round_up (4096, 4096) == 4096);
  CHECK (round_up (4097, 4096) == 8192);
  CHECK (round_down (4095, 4096) == 0);
  CHECK (round_down (UINT64_MAX, 512) == UINT64_MAX - 511);

  /* Near the top: round_up saturates at the last multiple instead of
   * wrapping to a small number.
   */
  CHECK (round_up (UINT64_MAX - 4095, 4096) == UINT64_MAX - 4095);
  CHECK (round_up (UINT64_MAX - 4094, 4096) == UINT64_MAX - 4095);
  CHECK (round_up (UINT64_MAX, 4096) == UINT64_MAX - 4095);
  CHECK (round_up (UINT64_MAX, 1) == UINT64_MAX);

  /* div_round_up for any divisor, powers of two or not. */
  CHECK (div_round_up (0, 7) == 0);
  CHECK (div_round_up (1, 7) == 1);
  CHECK (div_round_up (7, 7) == 1);
  CHECK (div_round_up (8, 7) == 2);
  CHECK (div_round_up (510, 255) == 2);
  CHECK (div_round_up (511, 255) == 3);
  CHECK (div_round_up (UINT64_MAX, 1) == UINT64_MAX);
  CHECK (div_round_up (UINT64_MAX, 2) == (UINT64_MAX >> 1) + 1);
  CHECK (div_round_up (UINT64_MAX, UINT64_MAX) == 1);
  for (uint64_t d = 1; d < 50; ++d)
    for (uint64_t n = 0; n < 200; ++n)
      CHECK (div_round_up (n, d) == (n + d - 1) / d);

  printf ("rounding: round_up, round_down, div_round_up: ok\n");
  return EXIT_SUCCESS;
}
