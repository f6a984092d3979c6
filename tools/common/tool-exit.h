/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* The exit statuses of snapfgctl and snapfg-backup: one table, so that a
 * script reads the same number the same way from either tool.  Both man
 * pages (EXIT STATUS) list it; tests/test-tools-common.sh checks the
 * cases that the two tools share.
 */
#ifndef SNAPFG_TOOL_EXIT_H
#define SNAPFG_TOOL_EXIT_H

enum tool_exit {
  TOOL_EXIT_OK = 0,
  /* The work failed: the server refused a request, a copy or a file
   * failed, snapfgctl inspect found a bad store.
   */
  TOOL_EXIT_FAILED = 1,
  TOOL_EXIT_USAGE = 2,          /* the command line is wrong */
  /* snapfg-backup: an incremental backup is impossible (the chain or
   * the server's checkpoint cannot show what changed): run --full.
   */
  TOOL_EXIT_NEED_FULL = 3,
  /* The server cannot be reached: the control socket, the SSH
   * connection (-H) or the NBD server refused or is not there.
   */
  TOOL_EXIT_UNREACHABLE = 4,
  /* The server accepted the connection but gave no reply within
   * --timeout seconds.
   */
  TOOL_EXIT_TIMEOUT = 5,
};

/* The default of --timeout, in seconds: the longest a reply to one
 * request may take.  Every request is answered at once by a working
 * server (merge --wait polls status, so a long merge never waits this
 * long for one reply); a create under a heavy write load takes well
 * under a second.
 */
#define TOOL_DEFAULT_TIMEOUT 60

#endif
