/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the kernel's id of this boot (boot-id.h). */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>

#include "boot-id.h"

#define BOOT_ID_FILE "/proc/sys/kernel/random/boot_id"

int
read_boot_id (char *id, size_t len)
{
  const char *env = getenv ("SNAPFG_TEST_BOOT_ID");
  FILE *fp;
  int r = 0;

  if (len == 0)
    return -EINVAL;
  id[0] = '\0';
  if (env && *env) {
    snprintf (id, len, "%s", env);
    return 0;
  }
  fp = fopen (BOOT_ID_FILE, "re");
  if (fp == NULL)
    return -errno;
  if (fgets (id, len, fp) == NULL)
    r = ferror (fp) ? -EIO : -ENODATA;
  fclose (fp);
  if (r < 0) {
    id[0] = '\0';
    return r;
  }
  id[strcspn (id, "\n")] = '\0';
  return id[0] ? 0 : -ENODATA;
}
