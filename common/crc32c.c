/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: CRC-32C (see crc32c.h). */

#include <config.h>

#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include "crc32c.h"

#define POLY 0x82f63b78u          /* Castagnoli, reflected */

static uint32_t table[256];
static bool have_hw;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void
init (void)
{
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;

    for (int k = 0; k < 8; ++k)
      c = (c >> 1) ^ (POLY & -(c & 1));
    table[i] = c;
  }
#if defined(__x86_64__)
  have_hw = __builtin_cpu_supports ("sse4.2");
#endif
}

static uint32_t
crc_table (uint32_t c, const unsigned char *p, size_t len)
{
  while (len--)
    c = table[(c ^ *p++) & 0xff] ^ (c >> 8);
  return c;
}

#if defined(__x86_64__)
/* --- shifting a CRC over zeros, to join CRCs of pieces ---
 *
 * The register after A then B is the register after A run on over
 * |B| zero bytes, xor the register of B from zero: a CRC register is
 * linear in its input.  Running on over n zero bytes multiplies the
 * register by x^(8n) modulo the polynomial, so the CRCs of three lanes
 * computed side by side are joined with two such products.  Bits are
 * reflected as in the register: the top bit is x^0.
 */

/* a * b modulo the polynomial. */
static uint32_t
mul_mod_poly (uint32_t a, uint32_t b)
{
  uint32_t product = 0;

  for (uint32_t bit = 1u << 31; bit; bit >>= 1) {
    if (a & bit)
      product ^= b;
    b = (b >> 1) ^ (POLY & -(b & 1));     /* b * x */
  }
  return product;
}

/* x^(8 * bytes) modulo the polynomial, by squaring. */
static uint32_t
x_pow_bytes (size_t bytes)
{
  uint32_t result = 1u << 31;             /* x^0 */
  uint32_t square = 1u << 23;             /* x^8: one byte */

  for (; bytes; bytes >>= 1) {
    if (bytes & 1)
      result = mul_mod_poly (square, result);
    square = mul_mod_poly (square, square);
  }
  return result;
}

/* The crc32 instruction takes three cycles but starts one each cycle:
 * one chain of them uses a third of what the CPU can do.  Buffers from
 * LANES_MIN bytes on are cut in three lanes checksummed side by side and
 * joined (a 1 MiB held write's checksum in about a third of the time).
 */
#define LANES_MIN 4096

__attribute__ ((target ("sse4.2")))
static uint64_t
crc_hw_bytes (uint64_t c64, const unsigned char *p, size_t len)
{
  while (len--)
    c64 = __builtin_ia32_crc32qi ((uint32_t) c64, *p++);
  return c64;
}

__attribute__ ((target ("sse4.2")))
static uint32_t
crc_hw (uint32_t c, const unsigned char *p, size_t len)
{
  uint64_t c64 = c;
  size_t head = (8 - ((uintptr_t) p & 7)) & 7;

  if (head > len)
    head = len;
  c64 = crc_hw_bytes (c64, p, head);
  p += head;
  len -= head;

  if (len >= LANES_MIN) {
    size_t lane = (len / 3) & ~(size_t) 7;
    const unsigned char *p1 = p + lane, *p2 = p + 2 * lane;
    uint64_t c1 = 0, c2 = 0;
    uint32_t shift;

    for (size_t i = 0; i < lane; i += 8) {
      uint64_t v0, v1, v2;

      memcpy (&v0, p + i, 8);
      memcpy (&v1, p1 + i, 8);
      memcpy (&v2, p2 + i, 8);
      c64 = __builtin_ia32_crc32di (c64, v0);
      c1 = __builtin_ia32_crc32di (c1, v1);
      c2 = __builtin_ia32_crc32di (c2, v2);
    }
    shift = x_pow_bytes (lane);
    c64 = mul_mod_poly (shift, (uint32_t) c64) ^ (uint32_t) c1;
    c64 = mul_mod_poly (shift, (uint32_t) c64) ^ (uint32_t) c2;
    p += 3 * lane;
    len -= 3 * lane;
  }
  while (len >= 8) {
    uint64_t v;

    memcpy (&v, p, 8);
    c64 = __builtin_ia32_crc32di (c64, v);
    p += 8;
    len -= 8;
  }
  return crc_hw_bytes (c64, p, len);
}
#endif

uint32_t
crc32c (uint32_t crc, const void *buf, size_t len)
{
  uint32_t c = ~crc;

  pthread_once (&once, init);
#if defined(__x86_64__)
  if (have_hw)
    return ~crc_hw (c, buf, len);
#endif
  return ~crc_table (c, buf, len);
}
