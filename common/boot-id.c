/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the kernel's id of this boot (see boot-id.h). */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "boot-id.h"

bool
boot_id_read (char *id, size_t len)
{
  const char *env = getenv ("SNAPFG_TEST_BOOT_ID");
  FILE *fp;
  bool ok;

  if (len == 0)
    return false;
  id[0] = '\0';
  if (env && *env) {
    snprintf (id, len, "%s", env);
    return true;
  }
  fp = fopen ("/proc/sys/kernel/random/boot_id", "re");
  if (fp == NULL)
    return false;
  ok = fgets (id, len, fp) != NULL;
  fclose (fp);
  if (ok)
    id[strcspn (id, "\n")] = '\0';
  return ok && id[0] != '\0';
}
