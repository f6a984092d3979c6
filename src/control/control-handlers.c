/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the control commands' handlers (see control-handlers.h): one
 * function a command of control-commands.def, each turning a request
 * into engine calls and a reply.  control-dispatch.c runs them.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>

#include "control-handlers.h"
#include "checkpoint.h"
#include "device.h"
#include "snapfg-log.h"
#include "snapfg-error.h"
#include "vector.h"



/* --- JSON helpers --- */

json_t *
control_json_text (const char *s)
{
  json_t *v = json_string (s);
  char *copy;

  if (v || s == NULL)
    return v ? v : json_null ();
  copy = strdup (s);
  if (copy == NULL)
    return NULL;
  for (char *p = copy; *p; ++p)
    if ((unsigned char) *p >= 0x80)
      *p = '?';
  v = json_string (copy);
  free (copy);
  return v;
}

static void
set_text (json_t *obj, const char *key, const char *value)
{
  json_object_set_new (obj, key, control_json_text (value));
}

static void
set_int (json_t *obj, const char *key, uint64_t value)
{
  json_object_set_new (obj, key, json_integer ((json_int_t) value));
}

/* A number rounded to 'decimals' places (printed without float noise). */
static void
set_real (json_t *obj, const char *key, double value, int decimals)
{
  double scale = 1;

  while (decimals-- > 0)
    scale *= 10;

  json_object_set_new (obj, key,
                       json_real ((double) (int64_t) (value * scale + 0.5)
                                  / scale));
}

/* --- the handlers --- */

static json_t *
snapshot_json (struct snapfg_snapshot *s)
{
  struct snapfg_snapshot_info info;
  json_t *o = json_object ();

  if (o == NULL)
    return NULL;
  snapfg_snapshot_info (s, &info);
  set_text (o, "name", info.name);
  set_text (o, "export", info.name);
  set_text (o, "state", info.state);
  set_text (o, "status", info.status);
  /* The same usage as numbers, for scripts and monitoring. */
  set_int (o, "allocated_bytes", info.allocated_sectors * 512);
  set_int (o, "total_bytes", info.total_sectors * 512);
  set_int (o, "metadata_bytes", info.metadata_sectors * 512);
  set_real (o, "percent", info.total_sectors
            ? 100.0 * info.allocated_sectors / info.total_sectors : 0, 2);
  set_text (o, "store", info.store);
  set_text (o, "cow", info.cow_path);
  set_int (o, "chunk_size", info.chunk_size);
  set_int (o, "exceptions", info.exceptions);
  set_int (o, "connections", info.connections);
  if (info.merge_total) {
    set_int (o, "merge_done", info.merge_done);
    set_int (o, "merge_total", info.merge_total);
  }
  return o;
}

/* The origin's suspend (suspend, resume), beside its request counters. */
static json_t *
suspend_json (struct snapfg_engine *e, json_t *o)
{
  struct snapfg_suspend_info si;

  if (o == NULL)
    return NULL;
  snapfg_suspend_info (e, &si);
  json_object_set_new (o, "suspended", json_boolean (si.suspended));
  set_int (o, "suspend_id", si.id);
  if (si.suspended) {
    set_int (o, "suspend_timeout_ms", si.timeout_ms);
    set_int (o, "suspended_ms", si.held_ms);
    set_int (o, "suspend_remaining_ms", si.remaining_ms);
  }
  set_int (o, "suspend_waiting", si.waiting);
  set_int (o, "suspends", si.count);
  set_int (o, "suspend_timeouts", si.timeouts);
  set_int (o, "suspend_held_writes", si.held_writes);
  set_int (o, "suspended_ms_total", si.held_ms_total);
  return o;
}

static int
no_such_snapshot (struct control_call *call, const char *name)
{
  snprintf (call->error, sizeof call->error,
            "%s: no snapshot named \"%s\"", call->req->command->name, name);
  return -ENOENT;
}

int
control_do_status (struct control_call *call)
{
  const char *name = control_arg_string (call->req, "name");
  struct snapfg_engine *e = call->e;
  struct snapfg_view_stats vs;
  struct snapfg_snapshot *s;
  json_t *list = json_array (), *origin;

  if (list == NULL)
    return -ENOMEM;
  if (name) {
    s = snapfg_snapshot_get (e, name);
    if (s == NULL) {
      json_decref (list);
      return no_such_snapshot (call, name);
    }
    json_array_append_new (list, snapshot_json (s));
    snapfg_snapshot_put (s);
    json_object_set_new (call->reply, "snapshots", list);
    return 0;
  }

  snapfg_view_stats (e, NULL, &vs);
  origin = json_object ();
  if (origin == NULL) {
    json_decref (list);
    return -ENOMEM;
  }
  set_text (origin, "export", "origin");
  set_text (origin, "path", snapfg_origin_path (e));
  set_int (origin, "size", snapfg_size (e));
  set_int (origin, "block_size", snapfg_block_size (e));
  set_int (origin, "connections", vs.requests.connections);
  suspend_json (e, origin);
  json_object_set_new (call->reply, "origin", origin);
  for (size_t i = 0; (s = snapfg_snapshot_get_nth (e, i)) != NULL; ++i) {
    json_array_append_new (list, snapshot_json (s));
    snapfg_snapshot_put (s);
  }
  json_object_set_new (call->reply, "snapshots", list);
  return 0;
}

int
control_do_list (struct control_call *call)
{
  return control_do_status (call);
}

static json_t *
stats_json (const char *name, const struct snapfg_view_stats *vs)
{
  const uint64_t *c = vs->requests.counter;
  json_t *o = json_object ();

  if (o == NULL)
    return NULL;
  set_text (o, "export", name);
  set_int (o, "connections", vs->requests.connections);
  set_int (o, "requests", c[STAT_REQUESTS]);
  set_int (o, "errors", c[STAT_ERRORS]);
  set_int (o, "bytes_read", c[STAT_BYTES_READ]);
  set_int (o, "bytes_written", c[STAT_BYTES_WRITTEN]);
  set_int (o, "copy_outs", c[STAT_COPY_OUTS]);
  set_int (o, "bytes_copied", c[STAT_BYTES_COPIED]);
  set_int (o, "exceptions", vs->exceptions);
  set_int (o, "pending_waits", c[STAT_PENDING_WAITS]);
  set_int (o, "lock_contention", vs->lock_contention);
  set_real (o, "latency_p50_us", vs->requests.latency_p50_ns / 1000.0, 1);
  set_real (o, "latency_p99_us", vs->requests.latency_p99_ns / 1000.0, 1);
  return o;
}

/* The origin's write-back (writeback=), beside its request counters. */
static json_t *
writeback_json (struct snapfg_engine *e, json_t *o)
{
  struct snapfg_writeback_stats ws;

  if (o == NULL)
    return NULL;
  snapfg_writeback_stats (e, &ws);
  json_object_set_new (o, "writeback", json_boolean (ws.enabled));
  set_int (o, "writeback_max_bytes", ws.max_bytes);
  set_int (o, "writeback_held_bytes", ws.held_bytes);
  set_int (o, "writeback_held_writes", ws.held_writes);
  set_int (o, "writeback_commit_rounds", ws.rounds);
  set_int (o, "writeback_round_exceptions", ws.round_exceptions);
  set_real (o, "writeback_exceptions_per_round",
            ws.rounds ? (double) ws.round_exceptions / ws.rounds : 0.0, 1);
  set_int (o, "writeback_max_round", ws.max_round);
  set_int (o, "writeback_waiting", ws.waiting);
  set_int (o, "writeback_room_waits", ws.room_waits);
  set_int (o, "writeback_origin_errors", ws.origin_errors);
  set_int (o, "writeback_errors_unseen", ws.errors_unseen);
  return o;
}

int
control_do_stats (struct control_call *call)
{
  struct snapfg_view_stats vs;
  struct snapfg_snapshot *s;
  json_t *list = json_array ();

  if (list == NULL)
    return -ENOMEM;
  snapfg_view_stats (call->e, NULL, &vs);
  json_array_append_new (list,
                         suspend_json (call->e,
                                       writeback_json (call->e,
                                                       stats_json ("origin",
                                                                   &vs))));
  for (size_t i = 0; (s = snapfg_snapshot_get_nth (call->e, i)) != NULL;
       ++i) {
    snapfg_view_stats (call->e, s, &vs);
    json_array_append_new (list, stats_json (snapfg_snapshot_name (s), &vs));
    snapfg_snapshot_put (s);
  }
  json_object_set_new (call->reply, "exports", list);
  return 0;
}

/* A suspend's timeout: seconds, a decimal number with an optional "s"
 * ("10", "0.5", "2.5s").  Returns milliseconds, or 0 if it is not one.
 */
static uint64_t
parse_timeout_ms (const char *text)
{
  uint64_t ms = 0, scale = 1000;
  const char *p = text;
  bool digits = false;

  for (; *p >= '0' && *p <= '9'; ++p, digits = true) {
    ms = ms * 10 + (*p - '0') * 1000;
    if (ms > 1000ull * 1000 * 1000)
      return 0;
  }
  if (*p == '.')
    for (++p; *p >= '0' && *p <= '9'; ++p, digits = true)
      if ((scale /= 10) > 0)
        ms += (*p - '0') * scale;
  if (*p == 's')
    ++p;
  return digits && *p == '\0' ? ms : 0;
}

int
control_do_suspend (struct control_call *call)
{
  const char *text = control_arg_string (call->req, "timeout");
  uint64_t timeout_ms = SNAPFG_SUSPEND_DEFAULT_TIMEOUT_MS, id;
  int r;

  if (text) {
    timeout_ms = parse_timeout_ms (text);
    if (timeout_ms < SNAPFG_SUSPEND_MIN_TIMEOUT_MS ||
        timeout_ms > SNAPFG_SUSPEND_MAX_TIMEOUT_MS) {
      snprintf (call->error, sizeof call->error,
                "suspend: timeout \"%s\": expected seconds from %g to %d "
                "(for example 10 or 2.5)", text,
                SNAPFG_SUSPEND_MIN_TIMEOUT_MS / 1000.0,
                SNAPFG_SUSPEND_MAX_TIMEOUT_MS / 1000);
      return -EINVAL;
    }
  }
  r = snapfg_suspend (call->e, timeout_ms, &id);
  if (r < 0)
    return r;
  json_object_set_new (call->reply, "suspended", json_true ());
  set_int (call->reply, "suspend_id", id);
  set_int (call->reply, "timeout_ms", timeout_ms);
  return 0;
}

int
control_do_resume (struct control_call *call)
{
  struct snapfg_suspend_info was;

  snapfg_resume (call->e, &was);
  /* "resumed": false says there was no suspend to end: whoever
   * suspended must not trust that writes were held until now (with
   * "timed_out", the last one ended by its timeout).
   */
  json_object_set_new (call->reply, "resumed", json_boolean (was.suspended));
  json_object_set_new (call->reply, "timed_out",
                       json_boolean (was.timed_out));
  set_int (call->reply, "suspend_id", was.id);
  set_int (call->reply, "held_ms", was.held_ms);
  set_int (call->reply, "waiting", was.waiting);
  return 0;
}

/* The ranges are written as text as they come: a disk with millions of
 * scattered changed chunks would cost ~100 bytes a range as a tree.
 * Only numbers go in here; the strings are encoded by jansson.
 */
struct changed_state {
  char_vector buf;              /* NUL-terminated when not empty */
  bool failed;
  uint64_t bytes, count;
};

static void
append (struct changed_state *cs, const char *s, size_t n)
{
  if (cs->failed)
    return;
  /* Room for the NUL too, then the bytes. */
  if (char_vector_reserve (&cs->buf, n + 1) < 0 ||
      char_vector_append_n (&cs->buf, s, n) < 0) {
    cs->failed = true;
    return;
  }
  cs->buf.ptr[cs->buf.len] = '\0';
}

static int
append_range (void *opaque, uint64_t offset, uint64_t length)
{
  struct changed_state *cs = opaque;
  char item[80];
  int n = snprintf (item, sizeof item,
                    "%s{\"offset\":%" PRIu64 ",\"length\":%" PRIu64 "}",
                    cs->count ? "," : "", offset, length);

  append (cs, item, n);
  cs->count++;
  cs->bytes += length;
  return cs->failed ? -ENOMEM : 0;
}

/* changed --since CKPT [SNAPSHOT]: a checkpoint chain's union
 * (checkpoint.h), in the same form as the snapshot's ranges.
 */
static int
changed_since (struct control_call *call, const char *since,
               const char *name)
{
  struct changed_state cs = { .buf = { 0 } }, out = { .buf = { 0 } };
  json_t *head = json_object ();
  char *head_text = NULL;
  uint32_t granularity = 0;
  size_t len;
  int r;

  if (head == NULL)
    return -ENOMEM;
  /* The head of the reply up to the ranges, from jansson (the names are
   * strings from the client); its closing brace is replaced.
   */
  json_object_set_new (head, "ok", json_true ());
  json_object_set_new (head, "since", control_json_text (since));
  json_object_set_new (head, "name", name ? control_json_text (name)
                       : json_null ());
  r = snapfg_checkpoint_changed (call->e, since, name, &granularity,
                                 append_range, &cs);
  if (r == 0 && !cs.failed) {
    json_object_set_new (head, "granularity", json_integer (granularity));
    json_object_set_new (head, "bytes", json_integer ((json_int_t) cs.bytes));
    head_text = json_dumps (head, JSON_COMPACT | JSON_PRESERVE_ORDER);
  }
  json_decref (head);
  if (r < 0 || cs.failed || head_text == NULL) {
    char_vector_reset (&cs.buf);
    free (head_text);
    return r < 0 ? r : -ENOMEM;
  }
  /* The head without its closing brace, the ranges, the end. */
  len = strlen (head_text);
  append (&out, head_text, len - 1);
  append (&out, ",\"ranges\":[", 11);
  append (&out, cs.buf.ptr, cs.buf.len);
  append (&out, "]}\n", 3);
  char_vector_reset (&cs.buf);
  free (head_text);
  if (out.failed) {
    char_vector_reset (&out.buf);
    return -ENOMEM;
  }
  call->raw_reply = out.buf.ptr;
  return 0;
}

int
control_do_changed (struct control_call *call)
{
  const char *name = control_arg_string (call->req, "name");
  const char *since = control_arg_string (call->req, "since");
  struct snapfg_snapshot *s;
  struct changed_state cs = { .buf = { 0 } };
  json_t *jname;
  char *name_text, head[64];
  int r;

  if (since)
    return changed_since (call, since, name);
  if (name == NULL) {
    snprintf (call->error, sizeof call->error,
              "changed: missing \"name\" (a snapshot) or \"since\" (a "
              "checkpoint); snapfgctl: changed SNAPSHOT, or changed "
              "--since CHECKPOINT [SNAPSHOT]");
    return -EINVAL;
  }
  s = snapfg_snapshot_get (call->e, name);
  if (s == NULL)
    return no_such_snapshot (call, name);
  jname = control_json_text (name);
  name_text = jname ? json_dumps (jname, JSON_ENCODE_ANY) : NULL;
  json_decref (jname);
  if (name_text == NULL) {
    snapfg_snapshot_put (s);
    return -ENOMEM;
  }
  append (&cs, "{\"ok\":true,\"name\":", 18);
  append (&cs, name_text, strlen (name_text));
  free (name_text);
  /* The byte count is known at the end only: leave room for it. */
  append (&cs, ",\"ranges\":[", 11);
  r = snapfg_snapshot_changed (s, append_range, &cs);
  snapfg_snapshot_put (s);
  if (r == 0 && !cs.failed) {
    int n = snprintf (head, sizeof head, "],\"bytes\":%" PRIu64 "}\n",
                      cs.bytes);
    append (&cs, head, n);
  }
  if (r < 0 || cs.failed) {
    char_vector_reset (&cs.buf);
    if (r == 0)
      r = -ENOMEM;
    if (snapfg_get_error () == NULL)
      snprintf (call->error, sizeof call->error, "changed %s: %s", name,
                strerror (-r));
    return r;
  }
  call->raw_reply = cs.buf.ptr;
  return 0;
}

int
control_do_create (struct control_call *call)
{
  const struct control_request *req = call->req;
  const char *cow = control_arg_string (req, "cow");
  struct snapfg_snapshot_options o = {
    .name = control_arg_string (req, "name"),
    .cow_path = cow,
    .store_type = control_arg_string (req, "store"),
    .chunk_size = control_arg_size (req, "chunk_size"),
    .cow_size = control_arg_size (req, "cow_size"),
    .checkpoint = control_arg_string (req, "checkpoint"),
    .checkpoint_owner = control_arg_string (req, "checkpoint_owner"),
    .temporary = control_arg_bool (req, "temporary"),
  };
  struct snapfg_snapshot *s;
  int r;

  /* The name and the chunk size are checked once, by the engine.  What
   * is the control socket's own rule is checked here: the start-up
   * snapshot's name belongs to cow=, and a relative path would be
   * resolved against the server's directory, not the client's.
   */
  if (strcmp (o.name, SNAPFG_STARTUP_SNAPSHOT) == 0) {
    snprintf (call->error, sizeof call->error, "snapshot name \"%s\": %s",
              o.name, snapfg_check_new_snapshot_name (o.name));
    return -EINVAL;
  }
  if (cow && cow[0] != '/' && !device_is_uri (cow)) {
    /* The server's working directory is "/", not the client's. */
    snprintf (call->error, sizeof call->error,
              "cow: the path must be absolute (or an NBD URI)");
    return -EINVAL;
  }
  r = snapfg_snapshot_create (call->e, &o);
  if (r < 0)
    return r;
  s = snapfg_snapshot_get (call->e, o.name);
  if (s) {
    json_object_set_new (call->reply, "snapshot", snapshot_json (s));
    snapfg_snapshot_put (s);
  }
  return 0;
}

int
control_do_drop (struct control_call *call)
{
  const char *name = control_arg_string (call->req, "name");
  struct snapfg_snapshot *s = snapfg_snapshot_get (call->e, name);
  bool owned = s && snapfg_snapshot_cow_owned (s);
  int r;

  snapfg_snapshot_put (s);
  r = snapfg_snapshot_drop (call->e, name);
  /* Tell the client whether the COW file stays: a store of the state
   * directory goes with its snapshot, one named by the client does not.
   */
  if (r == 0)
    json_object_set_new (call->reply, "cow_removed", json_boolean (owned));
  return r;
}

int
control_do_set_block_size (struct control_call *call)
{
  uint64_t block_size = control_arg_size (call->req, "block_size");

  if (block_size > UINT32_MAX) {
    snprintf (call->error, sizeof call->error,
              "block size %" PRIu64 ": must be 512 or 4096", block_size);
    return -EINVAL;
  }
  return snapfg_set_block_size (call->e, block_size);
}

/* What a client's flush does, for the operator (a service's ExecStop=
 * before nbdkit is signalled: nbdkit does not exit on SIGTERM while
 * clients are connected, and the SIGKILL that follows must find nothing
 * held).  It reports no write-back error to anyone: those stay for the
 * clients' own flushes (stats counts them).
 */
int
control_do_flush (struct control_call *call)
{
  return snapfg_flush (call->e, NULL);
}

int
control_do_merge (struct control_call *call)
{
  return snapfg_snapshot_merge (call->e,
                                control_arg_string (call->req, "name"));
}

int
control_do_checkpoint_create (struct control_call *call)
{
  return snapfg_checkpoint_create (call->e,
                                   control_arg_string (call->req, "name"));
}

int
control_do_checkpoint_drop (struct control_call *call)
{
  return snapfg_checkpoint_drop (call->e,
                                 control_arg_string (call->req, "name"));
}

static int
checkpoint_json (void *opaque, const struct snapfg_checkpoint_info *ci)
{
  json_t *list = opaque, *o = json_object ();

  if (o == NULL)
    return -ENOMEM;
  set_text (o, "name", ci->name);
  set_text (o, "state", ci->state);
  set_int (o, "granularity", ci->granularity);
  json_object_set_new (o, "created", json_integer (ci->created));
  set_int (o, "seq", ci->seq);
  json_object_set_new (o, "snapshot", ci->snapshot
                       ? control_json_text (ci->snapshot) : json_null ());
  set_text (o, "bitmap", ci->bitmap);
  json_object_set_new (o, "owner", ci->owner
                       ? control_json_text (ci->owner) : json_null ());
  set_int (o, "dirty_bytes", ci->dirty_bytes);
  return json_array_append_new (list, o) == 0 ? 0 : -ENOMEM;
}

int
control_do_checkpoint_list (struct control_call *call)
{
  json_t *list = json_array ();
  int r;

  if (list == NULL)
    return -ENOMEM;
  r = snapfg_checkpoint_list (call->e, checkpoint_json, list);
  if (r < 0) {
    json_decref (list);
    return r;
  }
  json_object_set_new (call->reply, "checkpoints", list);
  return 0;
}
