/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* Unit test of src/power-of-two.h. */

#include <config.h>

#include <stdint.h>

#include "power-of-two.h"
#include "unit-test.h"

int
main (void)
{
  /* Every power of two is one; from 4 up, neither neighbour is. */
  CHECK (!is_power_of_two (0));
  CHECK (is_power_of_two (1));
  CHECK (is_power_of_two (2));
  CHECK (!is_power_of_two (3));
  for (unsigned i = 2; i < 64; ++i) {
    uint64_t v = UINT64_C (1) << i;
    CHECK (is_power_of_two (v));
    CHECK (!is_power_of_two (v + 1));
    CHECK (!is_power_of_two (v - 1));
    CHECK (log2_of_power_of_two (v) == i);
  }
  CHECK (!is_power_of_two (UINT64_MAX));
  CHECK (!is_power_of_two (512 + 4096));
  CHECK (log2_of_power_of_two (1) == 0);

  CHECK (next_power_of_two (0) == 1);
  CHECK (next_power_of_two (1) == 1);
  CHECK (next_power_of_two (2) == 2);
  CHECK (next_power_of_two (3) == 4);
  CHECK (next_power_of_two (4097) == 8192);
  for (unsigned i = 1; i < 64; ++i) {
    uint64_t v = UINT64_C (1) << i;
    CHECK (next_power_of_two (v) == v);
    CHECK (next_power_of_two (v - 1) == (i == 1 ? 1 : v));
    if (i < 63)
      CHECK (next_power_of_two (v + 1) == v << 1);
  }
  /* Past 2^63 there is no 64-bit answer. */
  CHECK (next_power_of_two (UINT64_C (1) << 63) == UINT64_C (1) << 63);
  CHECK (next_power_of_two ((UINT64_C (1) << 63) + 1) == 0);
  CHECK (next_power_of_two (UINT64_MAX) == 0);

  printf ("power-of-two: is_power_of_two, log2, next_power_of_two: ok\n");
  return EXIT_SUCCESS;
}
