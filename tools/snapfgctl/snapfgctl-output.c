/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfgctl: the human form of each command's reply (--json prints the
 * reply as the server sent it instead).
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <inttypes.h>

#include <jansson.h>

#include "control-commands.h"
#include "snapfgctl.h"
#include "tool-output.h"

uint64_t
get_u64 (json_t *obj, const char *key)
{
  json_t *v = json_object_get (obj, key);

  return json_is_integer (v) ? (uint64_t) json_integer_value (v) : 0;
}

static double
get_double (json_t *obj, const char *key)
{
  return json_number_value (json_object_get (obj, key));
}

const char *
get_str (json_t *obj, const char *key)
{
  const char *s = json_string_value (json_object_get (obj, key));

  return s ? s : "";
}

static void
print_snapshot (json_t *sn)
{
  printf ("%s: %s, %s", get_str (sn, "name"), get_str (sn, "state"),
          get_str (sn, "status"));
  printf ("; %s store, chunk %" PRIu64 ", COW %s; %" PRIu64 " exceptions, "
          "%" PRIu64 " connections", get_str (sn, "store"),
          get_u64 (sn, "chunk_size"), get_str (sn, "cow"),
          get_u64 (sn, "exceptions"), get_u64 (sn, "connections"));
  if (json_object_get (sn, "merge_total"))
    printf ("; merged %" PRIu64 " of %" PRIu64 " chunks",
            get_u64 (sn, "merge_done"), get_u64 (sn, "merge_total"));
  if (strcmp (get_str (sn, "state"), "Invalid") == 0)
    printf ("; its contents are lost: drop it and create a new one (with a "
            "larger --cow-size if its store was full)");
  printf ("\n");
}

void
print_human (const struct control_command *c, const struct cmdline *cl,
             json_t *req, json_t *r)
{
  const char *name = get_str (req, "name");
  json_t *a, *x;
  size_t i;

  switch (c->cmd) {
  case CONTROL_STATUS:
    x = json_object_get (r, "origin");
    if (x)
      printf ("origin: %s, %" PRIu64 " bytes, block size %" PRIu64 ", %"
              PRIu64 " connections\n", get_str (x, "path"),
              get_u64 (x, "size"), get_u64 (x, "block_size"),
              get_u64 (x, "connections"));
    if (x && json_is_true (json_object_get (x, "suspended")))
      printf ("origin writes are held (suspend %" PRIu64 ", %" PRIu64
              " ms so far, %" PRIu64 " ms left)\n",
              get_u64 (x, "suspend_id"), get_u64 (x, "suspended_ms"),
              get_u64 (x, "suspend_remaining_ms"));
    json_array_foreach (json_object_get (r, "snapshots"), i, x)
      print_snapshot (x);
    break;
  case CONTROL_LIST:
    printf ("origin\n");
    json_array_foreach (json_object_get (r, "snapshots"), i, x)
      printf ("%s\t%s\t%s\n", get_str (x, "name"), get_str (x, "state"),
              get_str (x, "status"));
    break;
  case CONTROL_CHECKPOINT_LIST:
    json_array_foreach (json_object_get (r, "checkpoints"), i, x) {
      json_t *snap = json_object_get (x, "snapshot");
      json_t *owner = json_object_get (x, "owner");
      char when[32];

      /* The time as people and scripts read it elsewhere (ISO 8601,
       * UTC); --json keeps the server's Unix seconds.
       */
      tool_iso_time ((time_t) get_u64 (x, "created"), when);
      printf ("%s\t%s\tseq %" PRIu64 "\tgranularity %" PRIu64 "\t%" PRIu64
              " bytes dirty\tcreated %s%s%s%s%s\n", get_str (x, "name"),
              get_str (x, "state"), get_u64 (x, "seq"),
              get_u64 (x, "granularity"), get_u64 (x, "dirty_bytes"),
              when, json_is_string (snap) ? "\tsnapshot " : "",
              json_is_string (snap) ? json_string_value (snap) : "",
              json_is_string (owner) ? "\tby " : "",
              json_is_string (owner) ? json_string_value (owner) : "");
    }
    break;
  case CONTROL_CHECKPOINT_CREATE:
    printf ("created checkpoint %s\n", name);
    break;
  case CONTROL_CHECKPOINT_DROP:
    printf ("dropped checkpoint %s (its changes are kept by the one "
            "before it, if any)\n", name);
    break;
  case CONTROL_CHANGED:
    a = json_object_get (r, "ranges");
    json_array_foreach (a, i, x)
      printf ("%" PRIu64 " %" PRIu64 "\n", get_u64 (x, "offset"),
              get_u64 (x, "length"));
    printf ("# %zu ranges, %" PRIu64 " bytes changed\n", json_array_size (a),
            get_u64 (r, "bytes"));
    break;
  case CONTROL_STATS:
    printf ("%-12s %5s %10s %12s %12s %9s %12s %10s %9s %9s %10s %10s\n",
            "export", "conns", "requests", "bytes-read", "bytes-written",
            "copy-outs", "bytes-copied", "exceptions", "pending", "contended",
            "p50-us", "p99-us");
    json_array_foreach (json_object_get (r, "exports"), i, x) {
      printf ("%-12s %5" PRIu64 " %10" PRIu64 " %12" PRIu64 " %12" PRIu64
              " %9" PRIu64 " %12" PRIu64 " %10" PRIu64 " %9" PRIu64
              " %9" PRIu64 " %10.1f %10.1f\n",
              get_str (x, "export"), get_u64 (x, "connections"),
              get_u64 (x, "requests"), get_u64 (x, "bytes_read"),
              get_u64 (x, "bytes_written"), get_u64 (x, "copy_outs"),
              get_u64 (x, "bytes_copied"), get_u64 (x, "exceptions"),
              get_u64 (x, "pending_waits"), get_u64 (x, "lock_contention"),
              get_double (x, "latency_p50_us"),
              get_double (x, "latency_p99_us"));
    }
    /* The origin's write-back, on a line of its own. */
    json_array_foreach (json_object_get (r, "exports"), i, x) {
      if (json_object_get (x, "writeback") == NULL)
        continue;
      printf ("write-back %s (max %" PRIu64 " bytes): %" PRIu64 " bytes held "
              "in %" PRIu64 " writes; %" PRIu64 " commit rounds, %" PRIu64
              " exceptions (%.1f per round, at most %" PRIu64 "); %" PRIu64
              " writers waiting for room (%" PRIu64 " waited); %" PRIu64
              " origin writes failed after the acknowledgement (%" PRIu64
              " not yet reported to a client)\n",
              json_is_true (json_object_get (x, "writeback")) ? "on" : "off",
              get_u64 (x, "writeback_max_bytes"),
              get_u64 (x, "writeback_held_bytes"),
              get_u64 (x, "writeback_held_writes"),
              get_u64 (x, "writeback_commit_rounds"),
              get_u64 (x, "writeback_round_exceptions"),
              get_double (x, "writeback_exceptions_per_round"),
              get_u64 (x, "writeback_max_round"),
              get_u64 (x, "writeback_waiting"),
              get_u64 (x, "writeback_room_waits"),
              get_u64 (x, "writeback_origin_errors"),
              get_u64 (x, "writeback_errors_unseen"));
    }
    /* The origin's suspend, on a line of its own. */
    json_array_foreach (json_object_get (r, "exports"), i, x) {
      if (json_object_get (x, "suspended") == NULL)
        continue;
      if (json_is_true (json_object_get (x, "suspended")))
        printf ("suspended (suspend %" PRIu64 ") for %" PRIu64 " ms, %"
                PRIu64 " ms left; %" PRIu64 " origin writes waiting",
                get_u64 (x, "suspend_id"), get_u64 (x, "suspended_ms"),
                get_u64 (x, "suspend_remaining_ms"),
                get_u64 (x, "suspend_waiting"));
      else
        printf ("not suspended");
      printf ("; %" PRIu64 " suspends (%" PRIu64 " ended by their timeout), %"
              PRIu64 " ms in all, %" PRIu64 " origin writes held\n",
              get_u64 (x, "suspends"), get_u64 (x, "suspend_timeouts"),
              get_u64 (x, "suspended_ms_total"),
              get_u64 (x, "suspend_held_writes"));
    }
    break;
  case CONTROL_CREATE:
    x = json_object_get (r, "snapshot");
    printf ("created snapshot %s: %s store, chunk %" PRIu64 ", COW %s\n",
            name, get_str (x, "store"), get_u64 (x, "chunk_size"),
            get_str (x, "cow"));
    break;
  case CONTROL_DROP:
    if (json_is_true (json_object_get (r, "cow_removed")))
      printf ("dropped snapshot %s (its COW store in the state directory "
              "is removed)\n", name);
    else
      printf ("dropped snapshot %s (its COW store is left as it is)\n", name);
    break;
  case CONTROL_MERGE:
    if (option_value (cl, "wait") == NULL)
      printf ("merging snapshot %s into the origin (snapfgctl status shows "
              "the progress)\n", name);
    break;
  case CONTROL_SUSPEND:
    printf ("suspended (suspend %" PRIu64 "): new origin writes wait until "
            "resume, or %.1f s from now\n", get_u64 (r, "suspend_id"),
            get_u64 (r, "timeout_ms") / 1000.0);
    break;
  case CONTROL_RESUME:
    if (json_is_true (json_object_get (r, "resumed")))
      printf ("resumed suspend %" PRIu64 " after %" PRIu64 " ms (%" PRIu64
              " origin writes were waiting)\n", get_u64 (r, "suspend_id"),
              get_u64 (r, "held_ms"), get_u64 (r, "waiting"));
    else if (json_is_true (json_object_get (r, "timed_out")))
      printf ("not suspended: suspend %" PRIu64 " had ended by its "
              "timeout\n", get_u64 (r, "suspend_id"));
    else
      printf ("not suspended\n");
    break;
  case CONTROL_FLUSH:
    printf ("flushed: every write acknowledged so far is on the origin "
            "and durable\n");
    break;
  case CONTROL_SET_BLOCK_SIZE:
    printf ("block size %" PRIu64 " for new connections\n",
            get_u64 (req, "block_size"));
    break;
  default:
    /* A command without a human form yet: its reply as it is. */
    {
      char *s = json_dumps (r, JSON_INDENT (2));
      if (s)
        printf ("%s\n", s);
      free (s);
    }
  }
}
