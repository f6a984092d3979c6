/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* Unit test of src/engine/snapshot-name.c: the one rule for what a
 * snapshot may be called, and names made printable for messages.
 */

#include <config.h>

#include <stdio.h>
#include <string.h>

#include "engine.h"
#include "unit-test.h"

static void
good (const char *name)
{
  const char *problem = snapfg_check_snapshot_name (name);

  if (problem)
    FAIL ("\"%s\" refused: %s", name, problem);
}

static void
bad (const char *name, const char *what)
{
  const char *problem = snapfg_check_snapshot_name (name);

  if (problem == NULL)
    FAIL ("a bad name was accepted (%zu bytes)", strlen (name));
  if (strstr (problem, what) == NULL)
    FAIL ("refused with \"%s\", not \"%s\"", problem, what);
}

int
main (void)
{
  char name[SNAPFG_MAX_NAME_LEN + 2], buf[64];

  good ("snap1");
  good ("nightly-2026-12-02 03:00");
  good ("a");
  good ("Origin");                     /* only "origin" is reserved */
  good ("caf\xc3\xa9");                /* é, 2 bytes */
  good ("\xe6\x97\xa5\xe6\x9c\xac");   /* two CJK characters */
  good ("\xf0\x9f\x93\xb8");           /* U+1F4F8, 4 bytes */
  good ("\xc2\xa0");                   /* U+00A0, just above the C1 range */
  good ("\xf4\x8f\xbf\xbf");           /* U+10FFFF, the last one */

  bad ("", "cannot be empty");
  bad ("origin", "reserved");
  memset (name, 'n', SNAPFG_MAX_NAME_LEN);
  name[SNAPFG_MAX_NAME_LEN] = '\0';
  good (name);                         /* exactly the limit */
  name[SNAPFG_MAX_NAME_LEN] = 'n';
  name[SNAPFG_MAX_NAME_LEN + 1] = '\0';
  bad (name, "longer than " SNAPFG_MAX_NAME_LEN_STR " bytes");

  /* Not UTF-8: stray continuation, truncated sequence, overlong forms,
   * surrogates, beyond U+10FFFF, bytes never valid.
   */
  bad ("a\x80", "not valid UTF-8");
  bad ("caf\xc3", "not valid UTF-8");
  bad ("\xe6\x97", "not valid UTF-8");
  bad ("\xc0\xaf", "not valid UTF-8");
  bad ("\xe0\x80\xaf", "not valid UTF-8");
  bad ("\xf0\x80\x80\xaf", "not valid UTF-8");
  bad ("\xed\xa0\x80", "not valid UTF-8");
  bad ("\xf4\x90\x80\x80", "not valid UTF-8");
  bad ("\xff", "not valid UTF-8");
  bad ("\xfe\xff", "not valid UTF-8");

  /* Control characters: C0, DEL, C1 (U+0085 is NEL). */
  bad ("a\nb", "control character");
  bad ("\ttab", "control character");
  bad ("esc\x1b[0m", "control character");
  bad ("del\x7f", "control character");
  bad ("nel\xc2\x85", "control character");
  bad ("\xc2\x9f", "control character");

  /* A new snapshot may not take the start-up snapshot's name. */
  CHECK (snapfg_check_new_snapshot_name ("snap1") == NULL);
  CHECK (snapfg_check_snapshot_name (SNAPFG_STARTUP_SNAPSHOT) == NULL);
  CHECK (snapfg_check_new_snapshot_name (SNAPFG_STARTUP_SNAPSHOT) != NULL);
  CHECK (strstr (snapfg_check_new_snapshot_name (SNAPFG_STARTUP_SNAPSHOT),
                 "reserved") != NULL);
  CHECK (snapfg_check_new_snapshot_name ("origin") != NULL);
  CHECK (snapfg_check_new_snapshot_name ("a\x80") != NULL);

  /* Printable: controls, backslashes and non-ASCII bytes escaped, so a
   * name cannot forge a log line; truncated to the buffer.
   */
  snapfg_printable_name ("ok name", buf, sizeof buf);
  CHECK (strcmp (buf, "ok name") == 0);
  snapfg_printable_name ("a\nb\\c\xc3\xa9", buf, sizeof buf);
  CHECK (strcmp (buf, "a\\x0ab\\x5cc\\xc3\\xa9") == 0);
  snapfg_printable_name ("0123456789", buf, 8);
  CHECK (strlen (buf) < 8 && strncmp (buf, "0123456789", strlen (buf)) == 0);
  snapfg_printable_name ("\x01\x02\x03", buf, 8);
  CHECK (strlen (buf) < 8 && strncmp (buf, "\\x01", 4) == 0);
  return 0;
}
