/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: what a snapshot name may be.  One rule for the plugin's
 * snapshot=NAME:COW, the control socket's create, the engine and the
 * catalogue's records (which is why it sits here, below the engine: the
 * catalogue checks every record before a start uses it).
 */
#ifndef SNAPFG_SNAPSHOT_NAME_H
#define SNAPFG_SNAPSHOT_NAME_H

#include <stddef.h>

/* The name of the snapshot given by cow= at start-up. */
#define SNAPFG_STARTUP_SNAPSHOT "snapshot"

/* Snapshot names: at most this many bytes (see
 * snapfg_check_snapshot_name).
 */
#define SNAPFG_MAX_NAME_LEN 255
#define SNAPFG_MAX_NAME_LEN_STR "255"

/* A snapshot name: UTF-8, no control characters, 1 to
 * SNAPFG_MAX_NAME_LEN bytes, not "origin".  The rule every snapshot
 * follows (snapfg_snapshot_create checks it).
 */
extern const char *snapfg_check_snapshot_name (const char *name);
/* A name the user gives a new snapshot (snapshot=NAME:COW, the control
 * socket's create): the rule above, and not SNAPFG_STARTUP_SNAPSHOT,
 * which belongs to cow='s snapshot.  The engine itself uses only the rule
 * above, so that cow='s snapshot and a catalogue's records still open.
 */
extern const char *snapfg_check_new_snapshot_name (const char *name);
/* name for a message: control characters, backslash and non-ASCII bytes
 * written as \xNN (truncated to fit len).
 */
extern void snapfg_printable_name (const char *name, char *buf, size_t len);

#endif
