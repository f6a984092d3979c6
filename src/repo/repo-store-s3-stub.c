/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg repository: the S3 back end's place holder.
 *
 * Built until the S3 back end (repo-store-s3.c) replaces this file in
 * Makefile.am: an s3:// location is refused with a message that says so.
 */

#include <config.h>

#include <errno.h>

#include "snapfg-error.h"
#include "repo-store.h"

int
repo_store_s3_open (const char *url, const struct repo_s3_options *s3,
                    struct repo_store **s)
{
  *s = NULL;
  return snapfg_set_error (ENOTSUP, "%s: this build of snapfg has no S3 "
                           "back end yet; use a directory repository", url);
}
