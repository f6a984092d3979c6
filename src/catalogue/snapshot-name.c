/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: what a snapshot name may be (see snapfg_check_snapshot_name in
 * snapshot-name.h).  One function, used for the plugin's snapshot=NAME:COW and
 * for the control socket's create alike.
 *
 * A name is an NBD export name, which the NBD protocol requires to be
 * UTF-8; it is also printed one per line by snapfgctl list and put in
 * JSON replies and Prometheus labels, so control characters (a newline
 * would forge a line) are refused too.
 */

#include <config.h>

#include <stdio.h>
#include <string.h>

#include "snapshot-name.h"

/* Length of the valid UTF-8 sequence at s (shortest form, no surrogates,
 * at most U+10FFFF), or 0.  *cp gets the code point.
 */
static size_t
utf8_sequence (const unsigned char *s, unsigned *cp)
{
  unsigned c = s[0], min;
  size_t n;

  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  if ((c & 0xe0) == 0xc0) { n = 2; c &= 0x1f; min = 0x80; }
  else if ((c & 0xf0) == 0xe0) { n = 3; c &= 0x0f; min = 0x800; }
  else if ((c & 0xf8) == 0xf0) { n = 4; c &= 0x07; min = 0x10000; }
  else
    return 0;
  for (size_t i = 1; i < n; ++i) {
    if ((s[i] & 0xc0) != 0x80)
      return 0;                 /* also stops at the terminating NUL */
    c = (c << 6) | (s[i] & 0x3f);
  }
  if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
    return 0;
  *cp = c;
  return n;
}

const char *
snapfg_check_snapshot_name (const char *name)
{
  const unsigned char *s = (const unsigned char *) name;
  size_t len = strlen (name);

  if (len == 0)
    return "a snapshot name cannot be empty (\"\" is the origin's "
      "default export)";
  if (strcmp (name, "origin") == 0)
    return "\"origin\" is reserved for the origin's export";
  if (len > SNAPFG_MAX_NAME_LEN)
    return "longer than " SNAPFG_MAX_NAME_LEN_STR " bytes";
  while (*s) {
    unsigned cp;
    size_t n = utf8_sequence (s, &cp);

    if (n == 0)
      return "not valid UTF-8 (NBD export names must be UTF-8)";
    /* C0 controls, DEL and the C1 controls. */
    if (cp < 0x20 || cp == 0x7f || (cp >= 0x80 && cp < 0xa0))
      return "contains a control character (a newline, tab, escape...)";
    s += n;
  }
  return NULL;
}

const char *
snapfg_check_new_snapshot_name (const char *name)
{
  const char *problem = snapfg_check_snapshot_name (name);

  if (problem)
    return problem;
  if (strcmp (name, SNAPFG_STARTUP_SNAPSHOT) == 0)
    return "\"" SNAPFG_STARTUP_SNAPSHOT "\" is reserved for the snapshot of "
      "cow=";
  return NULL;
}

void
snapfg_printable_name (const char *name, char *buf, size_t len)
{
  size_t used = 0;

  for (const unsigned char *s = (const unsigned char *) name;
       *s && used + 5 < len; ++s) {
    if (*s < 0x20 || *s == 0x7f || *s == '\\' || *s >= 0x80)
      used += snprintf (buf + used, len - used, "\\x%02x", *s);
    else
      buf[used++] = *s;
  }
  buf[used] = '\0';
}
