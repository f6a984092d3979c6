/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg repository: the rule for object keys (repo-store.h), for the
 * back ends.
 */
#ifndef SNAPFG_REPO_STORE_KEY_H
#define SNAPFG_REPO_STORE_KEY_H

#include <stdbool.h>

/* Is key a relative path of [A-Za-z0-9._-] components, none "." or ".."? */
extern bool repo_key_is_valid (const char *key);

#endif
