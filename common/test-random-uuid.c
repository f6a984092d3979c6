/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* Unit test of common/random-uuid.c: the RFC 4122 version 4 form, and
 * no two alike.
 */

#include <config.h>

#include <string.h>

#include "random-uuid.h"
#include "unit-test.h"

#define N 1000

int
main (void)
{
  static char ids[N][RANDOM_UUID_LEN + 1];

  for (int i = 0; i < N; ++i) {
    char *u = ids[i];

    memset (u, 'X', sizeof ids[i]);
    random_uuid (u);
    CHECK (strlen (u) == RANDOM_UUID_LEN);
    for (int c = 0; c < RANDOM_UUID_LEN; ++c) {
      if (c == 8 || c == 13 || c == 18 || c == 23)
        CHECK (u[c] == '-');
      else
        CHECK (strchr ("0123456789abcdef", u[c]) != NULL && u[c] != '\0');
    }
    CHECK (u[14] == '4');                       /* version 4 */
    CHECK (strchr ("89ab", u[19]) != NULL);     /* the variant */
    for (int j = 0; j < i; ++j)
      CHECK (strcmp (ids[j], u) != 0);
  }
  return 0;
}
