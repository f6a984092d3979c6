/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg repository: reading S3's XML replies with libxml2.
 *
 * libxml2 rather than string matching: keys and continuation tokens come
 * back entity-escaped, and a token may hold any character; a real parser
 * gets that right once.  No network access and no entity expansion are
 * allowed (XML_PARSE_NONET, and XML_PARSE_NOENT is not given), so a
 * hostile endpoint's reply cannot make us fetch or expand anything.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libxml/parser.h>
#include <libxml/tree.h>

#include "snapfg-error.h"
#include "s3-xml.h"

static pthread_once_t xml_once = PTHREAD_ONCE_INIT;

static void
xml_init_once (void)
{
  xmlInitParser ();
}

void
s3_xml_init (void)
{
  pthread_once (&xml_once, xml_init_once);
}

static xmlDocPtr
parse (const char *body, size_t len)
{
  if (len == 0 || len > INT_MAX)
    return NULL;
  return xmlReadMemory (body, (int) len, "s3-reply.xml", NULL,
                        XML_PARSE_NONET | XML_PARSE_NOERROR
                        | XML_PARSE_NOWARNING | XML_PARSE_NOBLANKS);
}

static bool
is (xmlNodePtr n, const char *name)
{
  return n->type == XML_ELEMENT_NODE
    && strcmp ((const char *) n->name, name) == 0;
}

/* The text of element n, malloc'd (libxml2 unescapes entities). */
static char *
text_of (xmlNodePtr n)
{
  xmlChar *x = xmlNodeGetContent (n);
  char *s;

  if (x == NULL)
    return strdup ("");
  s = strdup ((const char *) x);
  xmlFree (x);
  return s;
}

bool
s3_xml_error (const char *body, size_t len, char **code, char **message)
{
  xmlDocPtr doc = parse (body, len);
  xmlNodePtr root, n;

  *code = *message = NULL;
  if (doc == NULL)
    return false;
  root = xmlDocGetRootElement (doc);
  if (root == NULL || !is (root, "Error")) {
    xmlFreeDoc (doc);
    return false;
  }
  for (n = root->children; n; n = n->next) {
    if (is (n, "Code") && *code == NULL)
      *code = text_of (n);
    else if (is (n, "Message") && *message == NULL)
      *message = text_of (n);
  }
  xmlFreeDoc (doc);
  return true;
}

static int
bad_page (const char *what)
{
  return snapfg_set_error (EPROTO, "S3 listing reply: %s (is the endpoint an "
                           "S3 gateway, with path-style requests?)", what);
}

/* One Contents element. */
static int
contents (xmlNodePtr c, s3_xml_object_fn fn, void *opaque)
{
  xmlNodePtr n;
  char *key = NULL, *size_s = NULL, *mtime_s = NULL, *end;
  uint64_t size = 0;
  int64_t mtime = 0;
  int r;

  for (n = c->children; n; n = n->next) {
    if (is (n, "Key") && !key)
      key = text_of (n);
    else if (is (n, "Size") && !size_s)
      size_s = text_of (n);
    else if (is (n, "LastModified") && !mtime_s)
      mtime_s = text_of (n);
  }
  if (key == NULL || *key == '\0') {
    r = bad_page ("an object without a Key");
    goto out;
  }
  if (size_s) {
    errno = 0;
    size = strtoull (size_s, &end, 10);
    if (errno || end == size_s || *end) {
      r = bad_page ("an object's Size is not a number");
      goto out;
    }
  }
  if (mtime_s) {
    mtime = s3_parse_iso8601 (mtime_s);
    if (mtime < 0) {
      r = bad_page ("an object's LastModified is not an ISO 8601 time");
      goto out;
    }
  }
  r = fn (opaque, key, size, mtime);
 out:
  free (key);
  free (size_s);
  free (mtime_s);
  return r;
}

int
s3_xml_list_page (const char *body, size_t len,
                  s3_xml_object_fn fn, void *opaque,
                  bool *truncated, char **next_token)
{
  xmlDocPtr doc = parse (body, len);
  xmlNodePtr root, n;
  int r = 0;

  *truncated = false;
  *next_token = NULL;
  if (doc == NULL)
    return bad_page ("not XML");
  root = xmlDocGetRootElement (doc);
  if (root == NULL || !is (root, "ListBucketResult")) {
    xmlFreeDoc (doc);
    return bad_page ("not a ListBucketResult");
  }
  for (n = root->children; n && r == 0; n = n->next) {
    if (is (n, "Contents"))
      r = contents (n, fn, opaque);
    else if (is (n, "IsTruncated")) {
      char *t = text_of (n);
      *truncated = t && strcmp (t, "true") == 0;
      free (t);
    }
    else if (is (n, "NextContinuationToken") && *next_token == NULL)
      *next_token = text_of (n);
  }
  xmlFreeDoc (doc);
  if (r == 0 && *truncated && (*next_token == NULL || **next_token == '\0'))
    r = bad_page ("IsTruncated without a NextContinuationToken");
  if (r != 0) {
    free (*next_token);
    *next_token = NULL;
  }
  return r;
}

/* Days from 1970-01-01 to y-m-d (proleptic Gregorian): timegm without
 * its dependence on TZ handling or the locale.
 */
static int64_t
days_from_civil (int64_t y, unsigned m, unsigned d)
{
  int64_t era;
  unsigned yoe, doy, doe;

  y -= m <= 2;
  era = (y >= 0 ? y : y - 399) / 400;
  yoe = (unsigned) (y - era * 400);
  doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + (int64_t) doe - 719468;
}

static int64_t
to_epoch (int y, int mo, int d, int h, int mi, int s)
{
  if (y < 1970 || mo < 1 || mo > 12 || d < 1 || d > 31
      || h < 0 || h > 23 || mi < 0 || mi > 59 || s < 0 || s > 60)
    return -1;
  return days_from_civil (y, mo, d) * 86400 + h * 3600 + mi * 60 + s;
}

int64_t
s3_parse_iso8601 (const char *s)
{
  int y, mo, d, h, mi, sec, n = 0;

  if (sscanf (s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &y, &mo, &d, &h, &mi, &sec,
              &n) != 6 || n == 0)
    return -1;
  s += n;
  if (*s == '.')                /* fractions of a second */
    for (s++; *s >= '0' && *s <= '9'; s++)
      ;
  if (strcmp (s, "Z") != 0 && strcmp (s, "+00:00") != 0)
    return -1;
  return to_epoch (y, mo, d, h, mi, sec);
}

int64_t
s3_parse_http_date (const char *s)
{
  static const char months[12][4] = {
    "Jan", "Feb", "Mar", "Apr", "May", "Jun",
    "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"
  };
  char wday[4], mon[4];
  int y, mo, d, h, mi, sec, n = 0;

  if (sscanf (s, "%3s, %2d %3s %4d %2d:%2d:%2d GMT%n",
              wday, &d, mon, &y, &h, &mi, &sec, &n) != 7 || n == 0)
    return -1;
  for (mo = 0; mo < 12; mo++)
    if (strcmp (mon, months[mo]) == 0)
      break;
  if (mo == 12)
    return -1;
  return to_epoch (y, mo + 1, d, h, mi, sec);
}
