/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* Unit test of common/boot-id.c: the kernel's id without its newline,
 * the same every time; SNAPFG_TEST_BOOT_ID wins when set and not empty.
 */

#include <config.h>

#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>

#include "boot-id.h"
#include "unit-test.h"

int
main (void)
{
  char a[BOOT_ID_SIZE], b[BOOT_ID_SIZE], small[8];

  unsetenv ("SNAPFG_TEST_BOOT_ID");
  if (access ("/proc/sys/kernel/random/boot_id", R_OK) == 0) {
    CHECK (read_boot_id (a, sizeof a) == 0);
    CHECK (strlen (a) == 36);
    CHECK (strchr (a, '\n') == NULL);
    CHECK (read_boot_id (b, sizeof b) == 0);
    CHECK (strcmp (a, b) == 0);
    /* Cut to what fits, never past the buffer. */
    CHECK (read_boot_id (small, sizeof small) == 0);
    CHECK (strlen (small) == sizeof small - 1);
    CHECK (strncmp (small, a, sizeof small - 1) == 0);
  }

  setenv ("SNAPFG_TEST_BOOT_ID", "boot-A", 1);
  CHECK (read_boot_id (a, sizeof a) == 0);
  CHECK (strcmp (a, "boot-A") == 0);
  setenv ("SNAPFG_TEST_BOOT_ID", "", 1);        /* empty: the kernel's */
  if (access ("/proc/sys/kernel/random/boot_id", R_OK) == 0) {
    CHECK (read_boot_id (a, sizeof a) == 0);
    CHECK (strcmp (a, "boot-A") != 0 && strlen (a) == 36);
  }
  CHECK (read_boot_id (a, 0) == -EINVAL);
  return 0;
}
