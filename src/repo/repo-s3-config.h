/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg repository: where the S3 back end's settings come from.
 *
 * The tool calls repo_s3_options_from_env with its --s3-endpoint and
 * --s3-credentials values (or NULL); the environment fills the rest, in
 * the AWS tools' order.  The keys themselves never pass through the
 * options or the command line: the back end reads them when it opens the
 * store (repo_s3_credentials_load), from the file named by
 * --s3-credentials, else AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY,
 * else the shared credentials file (AWS_SHARED_CREDENTIALS_FILE or
 * ~/.aws/credentials).
 */
#ifndef SNAPFG_REPO_S3_CONFIG_H
#define SNAPFG_REPO_S3_CONFIG_H

#include "repo-store.h"

/* Fill *o: endpoint = endpoint_option, else AWS_ENDPOINT_URL_S3, else
 * AWS_ENDPOINT_URL, else NULL (AWS itself: https://s3.REGION.amazonaws.com);
 * region = AWS_REGION, else AWS_DEFAULT_REGION, else "us-east-1";
 * credentials_file = credentials_option; profile = AWS_PROFILE or NULL.
 * The strings point into the environment or the arguments: they live as
 * long as those.
 */
extern void repo_s3_options_from_env (struct repo_s3_options *o,
                                      const char *endpoint_option,
                                      const char *credentials_option);

/* A key pair (and the session token of temporary credentials). */
struct repo_s3_credentials {
  char *access_key_id;
  char *secret_access_key;
  char *session_token;          /* NULL unless given */
};

/* Read profile (NULL: "default") from an AWS shared-credentials file
 * (INI: [profile] sections of aws_access_key_id, aws_secret_access_key,
 * aws_session_token).  A file that others may read is refused (-EACCES):
 * the secret in it is no secret any more.  Errors name the file and the
 * line.
 */
extern int repo_s3_credentials_read_file (const char *path,
                                          const char *profile,
                                          struct repo_s3_credentials *c);

/* The credentials to use with o: from o->credentials_file if given, else
 * AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN),
 * else the shared credentials file if there is one.  -ENOKEY with a
 * message saying where they may be given if there are none.
 */
extern int repo_s3_credentials_load (const struct repo_s3_options *o,
                                     struct repo_s3_credentials *c);

/* Forget them (the secret is wiped before it is freed). */
extern void repo_s3_credentials_clear (struct repo_s3_credentials *c);

#endif
