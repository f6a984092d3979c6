/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* Unit test of src/control/control-protocol.c: which request lines are
 * accepted, and that each refusal names what is wrong.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control-protocol.h"
#include "unit-test.h"

static struct control_request req;
static char err[512];

static int
parse (const char *line)
{
  err[0] = '\0';
  return control_parse_request (line, strlen (line), &req, err, sizeof err);
}

/* line is accepted as command cmd. */
static void
accepted (const char *line, enum control_cmd cmd)
{
  if (parse (line) != 0)
    FAIL ("refused %s: %s", line, err);
  CHECK (req.command != NULL && req.command->cmd == cmd);
  CHECK (req.json != NULL);
}

/* line is refused with a message containing what, and req left empty. */
static void
refused (const char *line, const char *what)
{
  if (parse (line) != -1)
    FAIL ("accepted %s", line);
  if (strstr (err, what) == NULL)
    FAIL ("refusing %s said \"%s\", not \"%s\"", line, err, what);
  CHECK (req.command == NULL && req.json == NULL);
}

int
main (void)
{
  char big[CONTROL_MAX_LINE + 64];

  /* Good requests, and their arguments. */
  accepted ("{\"cmd\":\"status\"}", CONTROL_STATUS);
  control_request_free (&req);
  accepted ("{\"cmd\":\"status\",\"name\":\"snap1\"}", CONTROL_STATUS);
  CHECK (strcmp (control_arg_string (&req, "name"), "snap1") == 0);
  CHECK (control_arg_string (&req, "cow") == NULL);
  control_request_free (&req);
  CHECK (req.json == NULL);
  accepted ("{\"cmd\":\"create\",\"name\":\"s\",\"cow\":\"/x.cow\","
            "\"store\":\"persistent\",\"chunk_size\":4096,"
            "\"cow_size\":1073741824}", CONTROL_CREATE);
  CHECK (control_arg_size (&req, "chunk_size") == 4096);
  CHECK (control_arg_size (&req, "cow_size") == UINT64_C (1073741824));
  CHECK (control_arg_size (&req, "missing") == 0);
  control_request_free (&req);
  accepted ("  {\"name\":\"s\", \"cmd\":\"drop\"}  ", CONTROL_DROP);
  control_request_free (&req);
  accepted ("{\"cmd\":\"list\"}", CONTROL_LIST);
  control_request_free (&req);

  /* Not a request at all. */
  refused ("", "not a JSON request");
  refused ("{\"cmd\":", "not a JSON request");
  refused ("\"status\"", "must be a JSON object");
  refused ("[1,2]", "must be a JSON object");
  refused ("{\"cmd\":\"status\"} {}", "not a JSON request");
  CHECK (control_parse_request ("{\"cmd\":\"status\"}\0x", 18, &req, err,
                                sizeof err) == -1);
  CHECK (strstr (err, "NUL byte") != NULL);
  memset (big, ' ', sizeof big);
  memcpy (big, "{\"cmd\":\"status\"}", 16);
  CHECK (control_parse_request (big, CONTROL_MAX_LINE + 1, &req, err,
                                sizeof err) == -1);
  CHECK (strstr (err, "longer than") != NULL);
  /* Exactly the limit is still read. */
  CHECK (control_parse_request (big, CONTROL_MAX_LINE, &req, err,
                                sizeof err) == 0);
  control_request_free (&req);
  /* Invalid UTF-8 (jansson checks it). */
  refused ("{\"cmd\":\"status\",\"name\":\"\xff\"}", "not a JSON request");

  /* The command. */
  refused ("{}", "missing \"cmd\"");
  refused ("{\"cmd\":7}", "\"cmd\" must be a string");
  refused ("{\"cmd\":\"frobnicate\"}", "unknown command \"frobnicate\"");
  refused ("{\"cmd\":\"status\",\"cmd\":\"drop\"}", "not a JSON request");

  /* Its keys: unknown ones (naming what it takes), local options of
   * snapfgctl, missing required ones, wrong types.
   */
  refused ("{\"cmd\":\"drop\",\"name\":\"s\",\"force\":true}",
           "unexpected \"force\" for command drop (it takes: name)");
  refused ("{\"cmd\":\"list\",\"name\":\"s\"}",
           "it takes no arguments");
  refused ("{\"cmd\":\"merge\",\"name\":\"s\",\"wait\":true}",
           "unexpected \"wait\"");
  refused ("{\"cmd\":\"drop\"}", "missing \"name\" for command drop");
  refused ("{\"cmd\":\"drop\",\"name\":\"\"}",
           "\"name\" must be a non-empty string");
  refused ("{\"cmd\":\"drop\",\"name\":3}",
           "\"name\" must be a non-empty string");
  refused ("{\"cmd\":\"create\",\"name\":\"s\",\"chunk_size\":0}",
           "\"chunk_size\" must be a positive integer");
  refused ("{\"cmd\":\"create\",\"name\":\"s\",\"chunk_size\":-4096}",
           "\"chunk_size\" must be a positive integer");
  refused ("{\"cmd\":\"create\",\"name\":\"s\",\"chunk_size\":\"4K\"}",
           "\"chunk_size\" must be a positive integer");
  refused ("{\"cmd\":\"create\",\"name\":\"s\",\"cow_size\":1.5}",
           "\"cow_size\" must be a positive integer");
  refused ("{\"cmd\":\"create\",\"name\":\"s\",\"cow\":null}",
           "\"cow\" must be a non-empty string");
  return 0;
}
