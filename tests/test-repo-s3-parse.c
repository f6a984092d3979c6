/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* The S3 back end's parsers, without a network: ListObjectsV2 pages and
 * error documents, S3's two date formats, the AWS shared-credentials
 * file and the environment.
 */
#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "unit-test.h"
#include "snapfg-error.h"
#include "repo-s3-config.h"
#include "s3-xml.h"

struct seen {
  int n;
  char keys[4][64];
  uint64_t sizes[4];
  int64_t mtimes[4];
  int stop_at;
};

static int
collect (void *opaque, const char *key, uint64_t size, int64_t mtime)
{
  struct seen *s = opaque;

  if (s->n < 4) {
    snprintf (s->keys[s->n], sizeof s->keys[s->n], "%s", key);
    s->sizes[s->n] = size;
    s->mtimes[s->n] = mtime;
  }
  s->n++;
  return s->n == s->stop_at ? 42 : 0;
}

static void
test_list (void)
{
  static const char page[] =
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>"
    "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
    "<Name>b</Name><Prefix>p/</Prefix><MaxKeys>1000</MaxKeys>"
    "<IsTruncated>true</IsTruncated>"
    "<Contents><Key>p/a&amp;b</Key><LastModified>2026-12-07T02:11:12.345Z"
    "</LastModified><ETag>&quot;x&quot;</ETag><Size>4194304</Size></Contents>"
    "<Contents><Key>p/chunks/00</Key><LastModified>1970-01-02T00:00:01.000Z"
    "</LastModified><Size>0</Size></Contents>"
    "<NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM="
    "&lt;</NextContinuationToken>"
    "</ListBucketResult>";
  static const char last[] =
    "<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>";
  static const char broken[] =
    "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>";
  struct seen s = { 0 };
  bool truncated;
  char *token;

  CHECK (s3_xml_list_page (page, strlen (page), collect, &s,
                           &truncated, &token) == 0);
  CHECK (s.n == 2);
  CHECK (strcmp (s.keys[0], "p/a&b") == 0);
  CHECK (s.sizes[0] == 4194304);
  CHECK (s.mtimes[0] == 1796609472);
  CHECK (strcmp (s.keys[1], "p/chunks/00") == 0);
  CHECK (s.mtimes[1] == 86401);
  CHECK (truncated);
  CHECK (token && strcmp (token, "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/"
                          "wm36Hy4vbOwM=<") == 0);
  free (token);

  /* The callback's value stops the walk and comes back. */
  memset (&s, 0, sizeof s);
  s.stop_at = 1;
  CHECK (s3_xml_list_page (page, strlen (page), collect, &s,
                           &truncated, &token) == 42);
  CHECK (s.n == 1 && token == NULL);

  memset (&s, 0, sizeof s);
  CHECK (s3_xml_list_page (last, strlen (last), collect, &s,
                           &truncated, &token) == 0);
  CHECK (s.n == 0 && !truncated && token == NULL);

  CHECK (s3_xml_list_page (broken, strlen (broken), collect, &s,
                           &truncated, &token) == -EPROTO);
  CHECK (strstr (snapfg_get_error (), "NextContinuationToken"));
  CHECK (s3_xml_list_page ("<html>", 6, collect, &s,
                           &truncated, &token) == -EPROTO);
  CHECK (s3_xml_list_page ("", 0, collect, &s, &truncated, &token) == -EPROTO);
}

static void
test_error (void)
{
  static const char e[] =
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>NoSuchBucket"
    "</Code><Message>The bucket &lt;b&gt; does not exist</Message>"
    "<BucketName>b</BucketName></Error>";
  char *code, *message;

  CHECK (s3_xml_error (e, strlen (e), &code, &message));
  CHECK (strcmp (code, "NoSuchBucket") == 0);
  CHECK (strcmp (message, "The bucket <b> does not exist") == 0);
  free (code);
  free (message);
  CHECK (!s3_xml_error ("", 0, &code, &message));
  CHECK (!s3_xml_error ("<ListBucketResult/>", 19, &code, &message));
}

static void
test_dates (void)
{
  CHECK (s3_parse_iso8601 ("1970-01-01T00:00:00Z") == 0);
  CHECK (s3_parse_iso8601 ("2000-03-01T00:00:00.5Z") == 951868800);
  CHECK (s3_parse_iso8601 ("2000-03-01T00:00:00") == -1);
  CHECK (s3_parse_iso8601 ("garbage") == -1);
  CHECK (s3_parse_http_date ("Wed, 01 Mar 2000 00:00:00 GMT") == 951868800);
  CHECK (s3_parse_http_date ("Mon, 07 Dec 2026 02:11:12 GMT") == 1796609472);
  CHECK (s3_parse_http_date ("Mon, 07 Foo 2026 02:11:12 GMT") == -1);
  CHECK (s3_parse_http_date ("2026-12-07") == -1);
}

static void
write_file (const char *path, const char *text, mode_t mode)
{
  FILE *fp = fopen (path, "w");

  CHECK (fp != NULL);
  fputs (text, fp);
  CHECK (fclose (fp) == 0);
  CHECK (chmod (path, mode) == 0);
}

static void
test_credentials (const char *dir)
{
  char path[4096];
  struct repo_s3_credentials c;
  struct repo_s3_options o;

  snprintf (path, sizeof path, "%s/credentials", dir);
  write_file (path,
              "# comment\n"
              "[default]\n"
              "aws_access_key_id = AKDEFAULT\n"
              "aws_secret_access_key=secret/default+x\n"
              "\n"
              "; another\n"
              "[  ceph ]\n"
              "  aws_access_key_id =  AKCEPH  \n"
              "aws_secret_access_key = sk-ceph\n"
              "aws_session_token = tok\n"
              "region = eu-west-1\n"
              "[half]\n"
              "aws_access_key_id = AKHALF\n", 0600);

  CHECK (repo_s3_credentials_read_file (path, NULL, &c) == 0);
  CHECK (strcmp (c.access_key_id, "AKDEFAULT") == 0);
  CHECK (strcmp (c.secret_access_key, "secret/default+x") == 0);
  CHECK (c.session_token == NULL);
  repo_s3_credentials_clear (&c);

  CHECK (repo_s3_credentials_read_file (path, "ceph", &c) == 0);
  CHECK (strcmp (c.access_key_id, "AKCEPH") == 0);
  CHECK (strcmp (c.secret_access_key, "sk-ceph") == 0);
  CHECK (strcmp (c.session_token, "tok") == 0);
  repo_s3_credentials_clear (&c);

  CHECK (repo_s3_credentials_read_file (path, "half", &c) == -ENOKEY);
  CHECK (strstr (snapfg_get_error (), "[half]"));
  CHECK (c.access_key_id == NULL);
  CHECK (repo_s3_credentials_read_file (path, "nope", &c) == -ENOKEY);
  CHECK (strstr (snapfg_get_error (), "no [nope] profile"));

  /* Readable by everyone: refused, and the message says what to do. */
  CHECK (chmod (path, 0644) == 0);
  CHECK (repo_s3_credentials_read_file (path, NULL, &c) == -EACCES);
  CHECK (strstr (snapfg_get_error (), "chmod 600"));
  CHECK (strstr (snapfg_get_error (), path));
  CHECK (chmod (path, 0640) == 0);
  CHECK (repo_s3_credentials_read_file (path, NULL, &c) == 0);
  repo_s3_credentials_clear (&c);

  write_file (path, "[default\naws_access_key_id = x\n", 0600);
  CHECK (repo_s3_credentials_read_file (path, NULL, &c) == -EINVAL);
  CHECK (strstr (snapfg_get_error (), ":1:"));
  write_file (path, "[default]\njunk\n", 0600);
  CHECK (repo_s3_credentials_read_file (path, NULL, &c) == -EINVAL);
  CHECK (strstr (snapfg_get_error (), ":2:"));

  snprintf (path, sizeof path, "%s/missing", dir);
  CHECK (repo_s3_credentials_read_file (path, NULL, &c) == -ENOENT);
  CHECK (strstr (snapfg_get_error (), path));

  /* The environment, in the AWS tools' order. */
  clearenv ();
  setenv ("HOME", dir, 1);
  repo_s3_options_from_env (&o, NULL, NULL);
  CHECK (o.endpoint == NULL && strcmp (o.region, "us-east-1") == 0);
  CHECK (o.credentials_file == NULL && o.profile == NULL);
  CHECK (repo_s3_credentials_load (&o, &c) == -ENOKEY);
  CHECK (strstr (snapfg_get_error (), "--s3-credentials"));

  setenv ("AWS_ENDPOINT_URL", "http://general:1", 1);
  setenv ("AWS_DEFAULT_REGION", "default-region", 1);
  setenv ("AWS_PROFILE", "ceph", 1);
  repo_s3_options_from_env (&o, NULL, "/creds");
  CHECK (strcmp (o.endpoint, "http://general:1") == 0);
  CHECK (strcmp (o.region, "default-region") == 0);
  CHECK (strcmp (o.credentials_file, "/creds") == 0);
  CHECK (strcmp (o.profile, "ceph") == 0);
  setenv ("AWS_ENDPOINT_URL_S3", "http://s3-only:2", 1);
  setenv ("AWS_REGION", "region", 1);
  repo_s3_options_from_env (&o, NULL, NULL);
  CHECK (strcmp (o.endpoint, "http://s3-only:2") == 0);
  CHECK (strcmp (o.region, "region") == 0);
  repo_s3_options_from_env (&o, "http://option:3", NULL);
  CHECK (strcmp (o.endpoint, "http://option:3") == 0);

  setenv ("AWS_ACCESS_KEY_ID", "AKENV", 1);
  CHECK (repo_s3_credentials_load (&o, &c) == -ENOKEY);
  CHECK (strstr (snapfg_get_error (), "AWS_SECRET_ACCESS_KEY"));
  setenv ("AWS_SECRET_ACCESS_KEY", "skenv", 1);
  CHECK (repo_s3_credentials_load (&o, &c) == 0);
  CHECK (strcmp (c.access_key_id, "AKENV") == 0);
  CHECK (strcmp (c.secret_access_key, "skenv") == 0);
  repo_s3_credentials_clear (&c);

  /* --s3-credentials wins over the environment's keys. */
  snprintf (path, sizeof path, "%s/credentials", dir);
  write_file (path, "[ceph]\naws_access_key_id=AKFILE\n"
              "aws_secret_access_key=skfile\n", 0600);
  o.credentials_file = path;
  CHECK (repo_s3_credentials_load (&o, &c) == 0);
  CHECK (strcmp (c.access_key_id, "AKFILE") == 0);
  repo_s3_credentials_clear (&c);

  /* No keys in the environment: ~/.aws/credentials, if there is one. */
  unsetenv ("AWS_ACCESS_KEY_ID");
  unsetenv ("AWS_SECRET_ACCESS_KEY");
  o.credentials_file = NULL;
  snprintf (path, sizeof path, "%s/.aws", dir);
  CHECK (mkdir (path, 0700) == 0);
  snprintf (path, sizeof path, "%s/.aws/credentials", dir);
  write_file (path, "[ceph]\naws_access_key_id=AKHOME\n"
              "aws_secret_access_key=skhome\n", 0600);
  CHECK (repo_s3_credentials_load (&o, &c) == 0);
  CHECK (strcmp (c.access_key_id, "AKHOME") == 0);
  repo_s3_credentials_clear (&c);
  unlink (path);
  snprintf (path, sizeof path, "%s/.aws", dir);
  rmdir (path);
}

int
main (void)
{
  char dir[] = "/tmp/test-repo-s3-parse.XXXXXX";
  char path[4096];

  test_list ();
  test_error ();
  test_dates ();

  CHECK (mkdtemp (dir) != NULL);
  test_credentials (dir);
  snprintf (path, sizeof path, "%s/credentials", dir);
  unlink (path);
  CHECK (rmdir (dir) == 0);
  printf ("test-repo-s3-parse: ok\n");
  return 0;
}
