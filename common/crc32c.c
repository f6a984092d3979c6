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
__attribute__ ((target ("sse4.2")))
static uint32_t
crc_hw (uint32_t c, const unsigned char *p, size_t len)
{
  uint64_t c64 = c;

  while (len && ((uintptr_t) p & 7)) {
    c64 = __builtin_ia32_crc32qi ((uint32_t) c64, *p++);
    len--;
  }
  while (len >= 8) {
    uint64_t v;

    memcpy (&v, p, 8);
    c64 = __builtin_ia32_crc32di (c64, v);
    p += 8;
    len -= 8;
  }
  while (len--)
    c64 = __builtin_ia32_crc32qi ((uint32_t) c64, *p++);
  return c64;
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
