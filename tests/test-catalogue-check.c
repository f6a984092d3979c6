/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* Unit test of src/catalogue/catalogue-check.c: the checks every record
 * of a catalogue read from disk must pass before a start uses it.  Each
 * case starts from a good document and breaks one thing; the refusal
 * must name the record and the field.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include <jansson.h>

#include "catalogue.h"
#include "catalogue-internal.h"
#include "unit-test.h"

static struct catalogue *cat;
static char state_dir[512], buf[1024];

#define UUID1 "0f6e2f0c-3a4b-4c5d-8e9f-0a1b2c3d4e5f"
#define UUID2 "1f6e2f0c-3a4b-4c5d-8e9f-0a1b2c3d4e5f"

/* A document the server could have written: two snapshots (one in the
 * state directory, one elsewhere), two checkpoints.
 */
static json_t *
good_document (void)
{
  char cow[600], bitmap1[600], bitmap2[600];
  json_t *doc;

  snprintf (cow, sizeof cow, "%s/s1.cow", state_dir);
  snprintf (bitmap1, sizeof bitmap1, "%s/c1.cbt", state_dir);
  snprintf (bitmap2, sizeof bitmap2, "%s/c2.cbt", state_dir);
  doc = json_pack ("{s:[{s:s, s:s, s:s, s:i, s:i, s:i, s:s, s:s, s:b},"
                   "    {s:s, s:s, s:s, s:i, s:i, s:i, s:s, s:s}],"
                   " s:[{s:s, s:s, s:i, s:i, s:i, s:s, s:n},"
                   "    {s:s, s:s, s:i, s:i, s:i, s:s, s:s}],"
                   " s:[]}",
                   "snapshots",
                   "name", "s1", "cow", cow, "store", "persistent",
                   "chunk_size", 4096, "cow_size", 0, "created", 1700000000,
                   "uuid", UUID1, "state", "active", "owned", 1,
                   "name", "s2", "cow", "/var/tmp/elsewhere.cow",
                   "store", "transient", "chunk_size", 65536,
                   "cow_size", 1048576, "created", 1700000001,
                   "uuid", UUID2, "state", "merging",
                   "checkpoints",
                   "name", "c1", "bitmap", bitmap1, "granularity", 65536,
                   "created", 1700000000, "seq", 1, "state", "frozen",
                   "snapshot",
                   "name", "c2", "bitmap", bitmap2, "granularity", 65536,
                   "created", 1700000002, "seq", 2, "state", "active",
                   "snapshot", "s1",
                   "events");
  CHECK (doc != NULL);
  return doc;
}

static json_t *
record (json_t *doc, const char *kind, size_t i)
{
  return json_array_get (json_object_get (doc, kind), i);
}

/* Change one field of one record of a good document and check the
 * refusal; value NULL removes the field.
 */
static void
refused_when (const char *kind, size_t i, const char *field, json_t *value,
              const char *what)
{
  json_t *doc = good_document ();
  const char *problem;

  if (value)
    json_object_set_new (record (doc, kind, i), field, value);
  else
    json_object_del (record (doc, kind, i), field);
  problem = catalogue_check_records (cat, doc, buf, sizeof buf);
  if (problem == NULL)
    FAIL ("%s record %zu with a bad \"%s\" was accepted (expected: %s)",
          kind, i, field, what);
  if (strstr (problem, what) == NULL)
    FAIL ("%s %zu \"%s\": refused with \"%s\", not \"%s\"", kind, i, field,
          problem, what);
  json_decref (doc);
}

int
main (void)
{
  char dir[] = "/tmp/test-catalogue-check.XXXXXX", path[600];
  struct catalogue_origin origin = { .path = "/dev/null", .size = 1 << 20 };
  const char *problem;
  json_t *doc;

  CHECK (mkdtemp (dir) != NULL);
  snprintf (path, sizeof path, "%s/catalogue", dir);
  CHECK (catalogue_open (path, &origin, &cat) == 0);
  snprintf (state_dir, sizeof state_dir, "%s", cat->state_dir);
  /* As a server makes it with its first store. */
  CHECK (mkdir (state_dir, 0700) == 0);

  /* The good document passes. */
  doc = good_document ();
  problem = catalogue_check_records (cat, doc, buf, sizeof buf);
  if (problem)
    FAIL ("the good document was refused: %s", problem);
  json_decref (doc);

  /* The arrays. */
  doc = good_document ();
  json_object_set_new (doc, "snapshots", json_object ());
  CHECK (strstr (catalogue_check_records (cat, doc, buf, sizeof buf),
                 "\"snapshots\" is not an array") != NULL);
  json_object_set_new (doc, "snapshots", json_array ());
  json_object_set_new (doc, "checkpoints", json_string ("x"));
  CHECK (strstr (catalogue_check_records (cat, doc, buf, sizeof buf),
                 "\"checkpoints\" is not an array") != NULL);
  json_object_set_new (doc, "checkpoints", json_array ());
  json_object_set_new (doc, "events", json_integer (1));
  CHECK (strstr (catalogue_check_records (cat, doc, buf, sizeof buf),
                 "\"events\" is not an array") != NULL);
  json_decref (doc);

  /* Snapshot records: each field, with the record named. */
  refused_when ("snapshots", 0, "name", NULL,
                "snapshot record 0, field \"name\": missing");
  refused_when ("snapshots", 0, "name", json_string ("origin"), "reserved");
  refused_when ("snapshots", 0, "name", json_string ("a\nb"),
                "control character");
  refused_when ("snapshots", 1, "name", json_string ("s1"),
                "snapshot record 1 (\"s1\"), field \"name\": a second "
                "record of this name");
  refused_when ("snapshots", 0, "store", json_string ("bogus"),
                "\"bogus\" is not a store type");
  refused_when ("snapshots", 0, "store", json_integer (1),
                "field \"store\": missing or not a string");
  refused_when ("snapshots", 0, "chunk_size", json_integer (4095),
                "field \"chunk_size\": 4095");
  refused_when ("snapshots", 0, "chunk_size", json_integer (-4096),
                "field \"chunk_size\"");
  refused_when ("snapshots", 0, "chunk_size", json_string ("4096"),
                "field \"chunk_size\"");
  refused_when ("snapshots", 0, "cow_size", json_real (1.5),
                "field \"cow_size\"");
  refused_when ("snapshots", 0, "created", NULL, "field \"created\"");
  refused_when ("snapshots", 0, "uuid", json_string ("not-a-uuid"),
                "field \"uuid\"");
  refused_when ("snapshots", 1, "uuid", json_string (UUID1),
                "the uuid of an earlier record");
  refused_when ("snapshots", 0, "state", json_string ("sleeping"),
                "unknown state \"sleeping\"");
  refused_when ("snapshots", 0, "state", json_string ("merging"),
                "a second snapshot being merged");
  refused_when ("snapshots", 0, "owned", json_string ("yes"),
                "field \"owned\": not true or false");
  refused_when ("snapshots", 0, "cow", json_string ("/var/tmp/x.cow"),
                "the store the server makes for a snapshot of that name");
  refused_when ("snapshots", 1, "cow", json_string ("relative.cow"),
                "not an absolute path or a URI");
  refused_when ("snapshots", 1, "cow", json_string (""), "field \"cow\"");
  refused_when ("snapshots", 1, "cow", json_string (path),
                "is the catalogue");
  {
    char tmp[700];
    snprintf (tmp, sizeof tmp, "%s.tmp", path);
    refused_when ("snapshots", 1, "cow", json_string (tmp),
                  "temporary file");
    snprintf (tmp, sizeof tmp, "%s/s2.cow", state_dir);
    refused_when ("snapshots", 1, "cow", json_string (tmp),
                  "is in the state directory");
  }
  /* Two records, one store. */
  doc = good_document ();
  json_object_set_new (record (doc, "snapshots", 0), "owned", json_false ());
  json_object_set_new (record (doc, "snapshots", 0), "cow",
                       json_string ("/var/tmp/elsewhere.cow"));
  CHECK (catalogue_check_records (cat, doc, buf, sizeof buf) != NULL);
  CHECK (strstr (buf, "snapshot record 1 (\"s2\"), field \"cow\": the "
                 "store of an earlier record") != NULL);
  json_decref (doc);
  /* An NBD URI is not a path: accepted as such. */
  doc = good_document ();
  json_object_set_new (record (doc, "snapshots", 1), "cow",
                       json_string ("nbd+unix:///cow?socket=/run/c.sock"));
  CHECK (catalogue_check_records (cat, doc, buf, sizeof buf) == NULL);
  json_decref (doc);
  {
    json_t *d = good_document ();
    json_array_append_new (json_object_get (d, "snapshots"),
                           json_string ("x"));
    CHECK (strstr (catalogue_check_records (cat, d, buf, sizeof buf),
                   "snapshot record 2, field \"(record)\": not an object")
           != NULL);
    json_decref (d);
  }

  /* Checkpoint records. */
  refused_when ("checkpoints", 0, "name", json_string ("../x"),
                "checkpoint record 0, field \"name\"");
  refused_when ("checkpoints", 0, "name", json_string (".hidden"),
                "field \"name\"");
  doc = good_document ();
  json_object_set_new (record (doc, "checkpoints", 1), "name",
                       json_string ("c1"));
  json_object_set_new (record (doc, "checkpoints", 1), "bitmap",
                       json_deep_copy (json_object_get (
                         record (doc, "checkpoints", 0), "bitmap")));
  CHECK (catalogue_check_records (cat, doc, buf, sizeof buf) != NULL);
  CHECK (strstr (buf, "checkpoint record 1 (\"c1\"), field \"name\": a "
                 "second record of this name") != NULL);
  json_decref (doc);
  refused_when ("checkpoints", 0, "bitmap", json_string ("/tmp/c1.cbt"),
                "the bitmap the server makes for a checkpoint");
  refused_when ("checkpoints", 0, "granularity", json_integer (1000),
                "field \"granularity\": 1000");
  refused_when ("checkpoints", 0, "granularity", json_integer (256),
                "field \"granularity\"");
  refused_when ("checkpoints", 0, "seq", json_integer (0),
                "field \"seq\": missing or not a positive integer");
  refused_when ("checkpoints", 1, "seq", json_integer (1),
                "the seq of an earlier record");
  refused_when ("checkpoints", 0, "state", json_string ("stale"),
                "unknown state \"stale\"");
  refused_when ("checkpoints", 0, "snapshot", json_integer (3),
                "field \"snapshot\": not null or a snapshot name");
  refused_when ("checkpoints", 0, "created", json_string ("now"),
                "field \"created\"");

  /* Fields this version does not know are left alone. */
  doc = good_document ();
  json_object_set_new (record (doc, "snapshots", 0), "future",
                       json_string ("x"));
  json_object_set_new (record (doc, "checkpoints", 1), "future",
                       json_true ());
  CHECK (catalogue_check_records (cat, doc, buf, sizeof buf) == NULL);
  json_decref (doc);

  catalogue_close (cat);
  unlink (path);
  rmdir (state_dir);
  if (rmdir (dir) == -1)
    FAIL ("%s left behind files", dir);
  return 0;
}
