/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg repository: the S3 back end's settings from options, the AWS
 * environment variables and the AWS shared-credentials file.
 */
#include <config.h>

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cleanup.h"
#include "snapfg-error.h"
#include "repo-s3-config.h"

/* An environment variable, NULL if unset or empty (an empty
 * AWS_REGION= means "not set" to the AWS tools too).
 */
static const char *
env (const char *name)
{
  const char *v = getenv (name);

  return v && *v ? v : NULL;
}

void
repo_s3_options_from_env (struct repo_s3_options *o,
                          const char *endpoint_option,
                          const char *credentials_option)
{
  memset (o, 0, sizeof *o);
  o->endpoint = endpoint_option;
  if (!o->endpoint)
    o->endpoint = env ("AWS_ENDPOINT_URL_S3");
  if (!o->endpoint)
    o->endpoint = env ("AWS_ENDPOINT_URL");
  o->region = env ("AWS_REGION");
  if (!o->region)
    o->region = env ("AWS_DEFAULT_REGION");
  if (!o->region)
    o->region = "us-east-1";
  o->credentials_file = credentials_option;
  o->profile = env ("AWS_PROFILE");
}

static void
wipe_free (char **p)
{
  if (*p) {
    explicit_bzero (*p, strlen (*p));
    free (*p);
    *p = NULL;
  }
}

void
repo_s3_credentials_clear (struct repo_s3_credentials *c)
{
  wipe_free (&c->access_key_id);
  wipe_free (&c->secret_access_key);
  wipe_free (&c->session_token);
}

/* s without leading and trailing blanks, in place. */
static char *
trim (char *s)
{
  char *e;

  while (isspace ((unsigned char) *s))
    s++;
  e = s + strlen (s);
  while (e > s && isspace ((unsigned char) e[-1]))
    *--e = '\0';
  return s;
}

static int
set_field (char **field, const char *value, const char *path, int lineno)
{
  char *copy = strdup (value);

  if (copy == NULL)
    return snapfg_set_error (ENOMEM, "%s:%d: out of memory", path, lineno);
  wipe_free (field);
  *field = copy;
  return 0;
}

int
repo_s3_credentials_read_file (const char *path, const char *profile,
                               struct repo_s3_credentials *c)
{
  CLEANUP_CLOSE int fd = -1;
  FILE *fp;
  struct stat st;
  char *line = NULL;
  size_t cap = 0;
  int lineno = 0, r = 0;
  bool in_profile = false, profile_seen = false;

  if (profile == NULL)
    profile = "default";
  memset (c, 0, sizeof *c);

  fd = open (path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0)
    return snapfg_set_error (errno, "S3 credentials file %s: %s",
                             path, strerror (errno));
  if (fstat (fd, &st) < 0)
    return snapfg_set_error (errno, "S3 credentials file %s: %s",
                             path, strerror (errno));
  if (!S_ISREG (st.st_mode))
    return snapfg_set_error (EINVAL, "S3 credentials file %s: not a regular "
                             "file", path);
  /* Readable by everyone means the secret is known to every user of the
   * machine: refuse it rather than use it, like ssh does with its keys.
   */
  if (st.st_mode & (S_IROTH | S_IWOTH))
    return snapfg_set_error (EACCES, "S3 credentials file %s is readable or "
                             "writable by every user (mode %04o): "
                             "run 'chmod 600 %s' and change the key if "
                             "others may have read it",
                             path, (unsigned) (st.st_mode & 07777), path);

  fp = fdopen (fd, "r");
  if (fp == NULL)
    return snapfg_set_error (errno, "S3 credentials file %s: %s",
                             path, strerror (errno));
  TAKE_FD (fd);

  while (getline (&line, &cap, fp) >= 0) {
    char *s = trim (line), *eq, *name, *value;

    lineno++;
    if (*s == '\0' || *s == '#' || *s == ';')
      continue;
    if (*s == '[') {
      char *end = strchr (s, ']');

      if (end == NULL) {
        r = snapfg_set_error (EINVAL, "S3 credentials file %s:%d: a section "
                              "header without ']'", path, lineno);
        break;
      }
      *end = '\0';
      in_profile = strcmp (trim (s + 1), profile) == 0;
      profile_seen |= in_profile;
      continue;
    }
    eq = strchr (s, '=');
    if (eq == NULL) {
      r = snapfg_set_error (EINVAL, "S3 credentials file %s:%d: expected "
                            "'name = value' or '[profile]'", path, lineno);
      break;
    }
    if (!in_profile)
      continue;
    *eq = '\0';
    name = trim (s);
    value = trim (eq + 1);
    if (strcmp (name, "aws_access_key_id") == 0)
      r = set_field (&c->access_key_id, value, path, lineno);
    else if (strcmp (name, "aws_secret_access_key") == 0)
      r = set_field (&c->secret_access_key, value, path, lineno);
    else if (strcmp (name, "aws_session_token") == 0)
      r = set_field (&c->session_token, value, path, lineno);
    /* Other settings of a profile (region, output...) are not ours. */
    if (r < 0)
      break;
  }
  if (line) {
    explicit_bzero (line, cap);
    free (line);
  }
  if (r == 0 && ferror (fp))
    r = snapfg_set_error (EIO, "S3 credentials file %s: read error", path);
  fclose (fp);

  if (r == 0 && !profile_seen)
    r = snapfg_set_error (ENOKEY, "S3 credentials file %s has no [%s] "
                          "profile (AWS_PROFILE chooses another)",
                          path, profile);
  else if (r == 0 && (c->access_key_id == NULL || *c->access_key_id == '\0'
                      || c->secret_access_key == NULL
                      || *c->secret_access_key == '\0'))
    r = snapfg_set_error (ENOKEY, "S3 credentials file %s: profile [%s] "
                          "lacks aws_access_key_id or aws_secret_access_key",
                          path, profile);
  if (r < 0)
    repo_s3_credentials_clear (c);
  return r;
}

int
repo_s3_credentials_load (const struct repo_s3_options *o,
                          struct repo_s3_credentials *c)
{
  const char *id, *secret, *token, *shared, *home;
  CLEANUP_FREE char *default_path = NULL;

  memset (c, 0, sizeof *c);
  if (o && o->credentials_file)
    return repo_s3_credentials_read_file (o->credentials_file, o->profile, c);

  id = env ("AWS_ACCESS_KEY_ID");
  secret = env ("AWS_SECRET_ACCESS_KEY");
  token = env ("AWS_SESSION_TOKEN");
  if (id && secret) {
    c->access_key_id = strdup (id);
    c->secret_access_key = strdup (secret);
    c->session_token = token ? strdup (token) : NULL;
    if (!c->access_key_id || !c->secret_access_key || (token && !c->session_token)) {
      repo_s3_credentials_clear (c);
      return snapfg_set_error (ENOMEM, "S3 credentials: out of memory");
    }
    return 0;
  }
  if (id || secret)
    return snapfg_set_error (ENOKEY, "S3 credentials: %s is set but %s is "
                             "not: set both, or neither and use "
                             "--s3-credentials FILE",
                             id ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY",
                             id ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID");

  /* The AWS tools' own fallback, only if it exists: with none at all the
   * message below says every place a key may come from.
   */
  shared = env ("AWS_SHARED_CREDENTIALS_FILE");
  if (shared == NULL && (home = env ("HOME")) != NULL) {
    if (asprintf (&default_path, "%s/.aws/credentials", home) < 0) {
      default_path = NULL;
      return snapfg_set_error (ENOMEM, "S3 credentials: out of memory");
    }
    if (access (default_path, F_OK) == 0)
      shared = default_path;
  }
  if (shared)
    return repo_s3_credentials_read_file (shared, o ? o->profile : NULL, c);

  return snapfg_set_error (ENOKEY, "no S3 credentials: give --s3-credentials "
                           "FILE (AWS shared-credentials format, mode 0600) "
                           "or set AWS_ACCESS_KEY_ID and "
                           "AWS_SECRET_ACCESS_KEY");
}
