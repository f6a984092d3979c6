/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfgctl stats --prometheus: the server's counters in the Prometheus
 * text exposition format (version 0.0.4), e.g. for node_exporter's
 * textfile collector.  Every metric is named snapfg_*, has its HELP and
 * TYPE lines, and is labelled with the export (export="origin" or the
 * snapshot's name, escaped as the format says).
 */

#include <config.h>

#include <stdio.h>
#include <stdint.h>
#include <string.h>

#include <jansson.h>

#include "snapfgctl.h"

/* A label value: backslash, double quote and newline escaped. */
static void
print_label (const char *s)
{
  for (; *s; ++s) {
    switch (*s) {
    case '\\': fputs ("\\\\", stdout); break;
    case '"': fputs ("\\\"", stdout); break;
    case '\n': fputs ("\\n", stdout); break;
    default: putchar (*s);
    }
  }
}

struct metric {
  const char *name;             /* without the snapfg_ prefix */
  const char *type;             /* counter or gauge */
  const char *help;
  const char *key;              /* the reply's key */
  double scale;                 /* 0: an integer, printed as is */
};

/* From the stats reply, one sample per export. */
static const struct metric stats_metrics[] = {
  { "connections", "gauge", "Open NBD connections to the export.",
    "connections", 0 },
  { "requests_total", "counter", "NBD requests served by the export.",
    "requests", 0 },
  { "errors_total", "counter", "NBD requests that failed.", "errors", 0 },
  { "read_bytes_total", "counter", "Bytes read by clients.",
    "bytes_read", 0 },
  { "written_bytes_total", "counter", "Bytes written by clients.",
    "bytes_written", 0 },
  { "copy_outs_total", "counter",
    "Chunks copied out of the origin into the snapshot before an origin "
    "write.", "copy_outs", 0 },
  { "copied_bytes_total", "counter", "Bytes copied out into the snapshot.",
    "bytes_copied", 0 },
  { "exceptions", "gauge",
    "Chunks the snapshot holds (completed exceptions).", "exceptions", 0 },
  { "pending_waits_total", "counter",
    "Requests that waited for a copy-out in progress.", "pending_waits", 0 },
  { "lock_contention_total", "counter",
    "Stripe lock acquisitions that had to wait.", "lock_contention", 0 },
  { "writeback_held_bytes", "gauge",
    "Bytes of origin writes acknowledged and held, not yet on the origin "
    "(writeback=on).", "writeback_held_bytes", 0 },
  { "writeback_held_writes", "gauge", "Origin writes held by write-back.",
    "writeback_held_writes", 0 },
  { "writeback_commit_rounds_total", "counter",
    "Write-back commit rounds (exceptions made durable together).",
    "writeback_commit_rounds", 0 },
  { "writeback_round_exceptions_total", "counter",
    "Exceptions made durable by write-back commit rounds (divide by the "
    "rounds for exceptions per round).", "writeback_round_exceptions", 0 },
  { "writeback_waiting_writers", "gauge",
    "Writers waiting for room in write-back (writeback-max reached).",
    "writeback_waiting", 0 },
  { "writeback_room_waits_total", "counter",
    "Writers that waited for room in write-back.", "writeback_room_waits",
    0 },
  { "writeback_origin_errors_total", "counter",
    "Held origin writes that failed after the acknowledgement.",
    "writeback_origin_errors", 0 },
  { "writeback_errors_unseen", "gauge",
    "Held origin writes failed after the acknowledgement that no client's "
    "flush or FUA request has reported yet.", "writeback_errors_unseen", 0 },
  { "request_latency_p50_seconds", "gauge",
    "Median request latency (recent requests).", "latency_p50_us", 1e-6 },
  { "request_latency_p99_seconds", "gauge",
    "99th percentile request latency (recent requests).", "latency_p99_us",
    1e-6 },
};

/* From the status reply, one sample per snapshot. */
static const struct metric status_metrics[] = {
  { "cow_allocated_bytes", "gauge",
    "Bytes of the COW store in use (data and metadata).", "allocated_bytes",
    0 },
  { "cow_total_bytes", "gauge", "Size of the COW store.", "total_bytes", 0 },
  { "cow_metadata_bytes", "gauge", "Bytes of the COW store holding "
    "metadata.", "metadata_bytes", 0 },
  { "cow_used_ratio", "gauge",
    "Share of the COW store in use (1: full; the snapshot then becomes "
    "Invalid).", "percent", 0.01 },
};

static void
print_header (const struct metric *m)
{
  printf ("# HELP snapfg_%s %s\n", m->name, m->help);
  printf ("# TYPE snapfg_%s %s\n", m->name, m->type);
}

static void
print_sample (const struct metric *m, json_t *item, const char *label_key)
{
  json_t *v = json_object_get (item, m->key);
  const char *label = json_string_value (json_object_get (item, label_key));

  if (v == NULL || label == NULL || !json_is_number (v))
    return;
  printf ("snapfg_%s{export=\"", m->name);
  print_label (label);
  if (m->scale)
    printf ("\"} %.9g\n", json_number_value (v) * m->scale);
  else
    printf ("\"} %" JSON_INTEGER_FORMAT "\n",
            json_is_integer (v) ? json_integer_value (v)
            : (json_int_t) json_number_value (v));
}

void
snapfgctl_print_prometheus (json_t *stats, json_t *status)
{
  json_t *exports = json_object_get (stats, "exports");
  json_t *snapshots = json_object_get (status, "snapshots");
  json_t *origin = json_object_get (status, "origin");
  static const char *const states[] = {
    "valid", "Invalid", "Overflow", "merging"
  };
  size_t i;
  json_t *x;

  for (size_t m = 0; m < sizeof stats_metrics / sizeof stats_metrics[0];
       ++m) {
    print_header (&stats_metrics[m]);
    json_array_foreach (exports, i, x)
      print_sample (&stats_metrics[m], x, "export");
  }

  if (json_is_object (origin)) {
    static const struct metric size = {
      "origin_size_bytes", "gauge", "Size of the origin.", "size", 0
    };
    print_header (&size);
    print_sample (&size, origin, "export");
  }
  printf ("# HELP snapfg_snapshots Snapshots of the origin.\n"
          "# TYPE snapfg_snapshots gauge\n"
          "snapfg_snapshots %zu\n", json_array_size (snapshots));
  for (size_t m = 0; m < sizeof status_metrics / sizeof status_metrics[0];
       ++m) {
    print_header (&status_metrics[m]);
    json_array_foreach (snapshots, i, x)
      print_sample (&status_metrics[m], x, "export");
  }
  /* A state set: 1 for the snapshot's state, 0 for the others, so that
   * an alert can match snapfg_snapshot_state{state="Invalid"} == 1.
   */
  printf ("# HELP snapfg_snapshot_state The snapshot's state (1: current)."
          "\n# TYPE snapfg_snapshot_state gauge\n");
  json_array_foreach (snapshots, i, x) {
    const char *name = json_string_value (json_object_get (x, "export"));
    const char *state = json_string_value (json_object_get (x, "state"));

    if (name == NULL || state == NULL)
      continue;
    for (size_t s = 0; s < sizeof states / sizeof states[0]; ++s) {
      printf ("snapfg_snapshot_state{export=\"");
      print_label (name);
      printf ("\",state=\"%s\"} %d\n", states[s],
              strcmp (state, states[s]) == 0);
    }
  }
}
