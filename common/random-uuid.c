/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: a new random (version 4) UUID (see random-uuid.h). */

#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/random.h>

#include "random-uuid.h"

void
random_uuid (char out[RANDOM_UUID_LEN + 1])
{
  unsigned char b[16];
  ssize_t n = getrandom (b, sizeof b, 0);

  if (n != (ssize_t) sizeof b) {
    /* Cannot happen on Linux ≥ 3.17; fall back to something unique. */
    struct timespec ts;
    clock_gettime (CLOCK_REALTIME, &ts);
    uint64_t a = ts.tv_sec ^ ((uint64_t) getpid () << 32), c = ts.tv_nsec;
    memcpy (b, &a, 8);
    memcpy (b + 8, &c, 8);
  }
  b[6] = (b[6] & 0x0f) | 0x40;     /* version 4 (random) */
  b[8] = (b[8] & 0x3f) | 0x80;     /* the RFC 4122 variant */
  snprintf (out, RANDOM_UUID_LEN + 1,
            "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
            "%02x%02x%02x%02x%02x%02x",
            b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9],
            b[10], b[11], b[12], b[13], b[14], b[15]);
}
