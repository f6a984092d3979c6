/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg repository: opening a store by its location, and the rule for
 * object keys that every back end applies.
 */

#include <config.h>

#include <stdbool.h>
#include <string.h>
#include <errno.h>

#include "snapfg-error.h"
#include "repo-store.h"
#include "repo-store-key.h"

bool
repo_location_is_s3 (const char *location)
{
  return location && strncmp (location, "s3://", 5) == 0;
}

/* Keys are '/'-separated components of [A-Za-z0-9._-], none of them "."
 * or ".." or empty: a key can never name anything outside the store, in
 * a directory or a bucket prefix.
 */
bool
repo_key_is_valid (const char *key)
{
  size_t comp = 0;
  const char *start = key;

  if (key == NULL || *key == '\0' || strlen (key) > 1000)
    return false;
  for (const char *p = key; ; ++p) {
    if (*p == '/' || *p == '\0') {
      if (comp == 0)
        return false;
      if ((comp == 1 && start[0] == '.') ||
          (comp == 2 && start[0] == '.' && start[1] == '.'))
        return false;
      if (*p == '\0')
        return true;
      comp = 0;
      start = p + 1;
      continue;
    }
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
          (*p >= '0' && *p <= '9') || *p == '.' || *p == '_' || *p == '-'))
      return false;
    comp++;
  }
}

int
repo_store_open (const char *location, const struct repo_s3_options *s3,
                 bool create, struct repo_store **s)
{
  *s = NULL;
  if (location == NULL || *location == '\0')
    return snapfg_set_error (EINVAL, "no repository location given");
  if (repo_location_is_s3 (location)) {
    static const struct repo_s3_options none;
    return repo_store_s3_open (location, s3 ? s3 : &none, s);
  }
  return repo_store_dir_open (location, create, s);
}
