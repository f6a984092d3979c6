/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* Unit test of crc32c.c: the standard check value, continuation, and
 * the hardware path against the table on unaligned buffers, and the
 * three lanes of long buffers joined.
 */

#include <config.h>

#include <stdlib.h>
#include <string.h>

#include "crc32c.h"
#include "unit-test.h"

/* Bit by bit, independent of both implementations. */
static uint32_t
crc_bits (const unsigned char *p, size_t len)
{
  uint32_t c = 0xffffffff;

  while (len--) {
    c ^= *p++;
    for (int k = 0; k < 8; ++k)
      c = (c >> 1) ^ (0x82f63b78u & -(c & 1));
  }
  return ~c;
}

int
main (void)
{
  unsigned char buf[4096 + 16];

  CHECK (crc32c (0, "123456789", 9) == 0xe3069283);
  CHECK (crc32c (0, "", 0) == 0);
  CHECK (crc32c (crc32c (0, "1234", 4), "56789", 5) == 0xe3069283);
  srand (1);
  for (size_t i = 0; i < sizeof buf; ++i)
    buf[i] = rand ();
  for (size_t off = 0; off < 9; ++off)
    for (size_t len = 0; len < 64; ++len)
      CHECK (crc32c (0, buf + off, len) == crc_bits (buf + off, len));
  CHECK (crc32c (0, buf + 3, 4096) == crc_bits (buf + 3, 4096));

  /* Long buffers go in three lanes joined by shifting: every split of
   * lengths and alignments around the cut, a continued CRC, and a
   * buffer of 1 MiB and a few bytes.
   */
  {
    size_t big = (1 << 20) + 77;
    unsigned char *b = malloc (big + 8);

    CHECK (b != NULL);
    for (size_t i = 0; i < big + 8; ++i)
      b[i] = rand ();
    for (size_t off = 0; off < 9; ++off)
      for (size_t len = 4090; len < 4140; ++len)
        CHECK (crc32c (0, b + off, len) == crc_bits (b + off, len));
    for (size_t len = 12280; len < 12300; ++len)
      CHECK (crc32c (0, b + 5, len) == crc_bits (b + 5, len));
    CHECK (crc32c (crc32c (0, b, 100), b + 100, 9000) ==
           crc_bits (b, 9100));
    CHECK (crc32c (0, b + 1, big) == crc_bits (b + 1, big));
    free (b);
  }
  return 0;
}
