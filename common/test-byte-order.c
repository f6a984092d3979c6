/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* Unit test of common/byte-order.h. */

#include <config.h>

#include <stdint.h>
#include <string.h>

#include "byte-order.h"
#include "unit-test.h"

int
main (void)
{
  unsigned char buf[32];
  static const unsigned char le64[8] = {
    0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01
  };

  /* The bytes, least significant first, whatever the host's order. */
  memset (buf, 0xee, sizeof buf);
  put_le64 (buf, UINT64_C (0x0102030405060708));
  CHECK (memcmp (buf, le64, 8) == 0);
  CHECK (buf[8] == 0xee);              /* nothing written past the field */
  put_le32 (buf, UINT32_C (0x0a0b0c0d));
  CHECK (buf[0] == 0x0d && buf[1] == 0x0c && buf[2] == 0x0b &&
         buf[3] == 0x0a && buf[4] == 0x04);
  put_le16 (buf, 0x1234);
  CHECK (buf[0] == 0x34 && buf[1] == 0x12 && buf[2] == 0x0b);

  /* dm-snapshot's magic "SnAp" reads as 0x70416e53. */
  CHECK (get_le32 ("SnAp") == UINT32_C (0x70416e53));

  /* At every (unaligned) offset, a round trip gives the value back. */
  for (size_t off = 0; off + 8 <= sizeof buf; ++off) {
    uint64_t v = UINT64_C (0x8877665544332211) ^ (off * UINT64_C (0x0101));

    put_le64 (buf + off, v);
    CHECK (get_le64 (buf + off) == v);
    put_le32 (buf + off, (uint32_t) v);
    CHECK (get_le32 (buf + off) == (uint32_t) v);
    put_le16 (buf + off, (uint16_t) v);
    CHECK (get_le16 (buf + off) == (uint16_t) v);
  }
  /* The extremes. */
  put_le64 (buf + 3, UINT64_MAX);
  CHECK (get_le64 (buf + 3) == UINT64_MAX);
  put_le32 (buf + 1, 0);
  CHECK (get_le32 (buf + 1) == 0);
  CHECK (get_le64 (buf + 3) == UINT64_C (0xffffffffffff0000));  /* overlapped */
  put_le64 (buf, 0);
  put_le32 (buf + 2, UINT32_MAX);
  CHECK (get_le64 (buf) == UINT64_C (0x0000ffffffff0000));
  return 0;
}
