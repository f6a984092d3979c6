/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg-backup: running other programs (qemu-img) and the report that
 * ends a run.  Here rather than in snapfg-backup-main.c, so that the command
 * files never call back into the file of main.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <unistd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include "snapfg-backup.h"

int
run_command (const char *dir, char *const argv[])
{
  pid_t pid, parent = getpid ();
  int st;
  bool stopped = false;

  fflush (stderr);
  pid = fork ();
  if (pid == -1) {
    backup_error ("fork: %m");
    return -1;
  }
  if (pid == 0) {
    int fd;
    /* Its own process group, so that a terminal's ^C reaches the tool,
     * which stops it (below); and killed if the tool dies first.
     */
    setpgid (0, 0);
    prctl (PR_SET_PDEATHSIG, SIGKILL);
    if (getppid () != parent)
      _exit (127);
    fd = open ("/dev/null", O_WRONLY);
    if (fd >= 0) {
      dup2 (fd, 1);
      close (fd);
    }
    if (dir && chdir (dir) == -1) {
      fprintf (stderr, "snapfg-backup: %s: %m\n", dir);
      _exit (127);
    }
    execvp (argv[0], argv);
    fprintf (stderr, "snapfg-backup: cannot run %s: %m (install qemu-utils)\n",
             argv[0]);
    _exit (127);
  }
  setpgid (pid, pid);           /* as the child does: whoever runs first */
  while (waitpid (pid, &st, 0) == -1) {
    if (errno != EINTR) {
      backup_error ("waitpid: %m");
      kill (-pid, SIGKILL);
      return -1;
    }
    if (backup_interrupted && !stopped) {
      kill (-pid, SIGTERM);
      stopped = true;
    }
  }
  if (!WIFEXITED (st) || WEXITSTATUS (st) != 0) {
    backup_error ("%s failed (%s %d)", argv[0],
                  WIFEXITED (st) ? "exit status" : "signal",
                  WIFEXITED (st) ? WEXITSTATUS (st) : WTERMSIG (st));
    return -1;
  }
  return 0;
}

void
backup_report_run (json_t *run, const char *dir_path, double seconds)
{
  uint64_t bytes = json_u64 (run, "bytes_copied");
  char rate[128];

  tool_format_rate (rate, sizeof rate, json_u64 (run, "bytes_read"),
                    seconds);
  if (json_is_true (json_object_get (run, "empty")))
    backup_info ("run %" PRIu64 ": nothing changed since run %" PRIu64
                 ": recorded an empty %s run (no image); read %s",
                 json_u64 (run, "seq"),
                 json_u64 (run, "base") ? json_u64 (run, "base")
                 : json_u64 (run, "seq") - 1, json_str (run, "type"), rate);
  else
    backup_info ("run %" PRIu64 ": %s backup %s/%s, %" PRIu64 " bytes "
                 "copied, %" PRIu64 " zeroed; read %s",
                 json_u64 (run, "seq"), json_str (run, "type"), dir_path,
                 json_str (run, "image"), bytes,
                 json_u64 (run, "bytes_zeroed"), rate);
  if (tool_out.json) {
    json_t *o = json_deep_copy (run);

    if (o == NULL)
      return;
    json_object_set_new (o, "command", json_string ("backup"));
    json_object_set_new (o, "directory", json_string (dir_path));
    json_object_set_new (o, "duration_s", json_real (seconds));
    json_object_set_new (o, "rate_bytes_per_s",
                         json_real (seconds > 0
                                    ? json_u64 (run, "bytes_read") / seconds
                                    : 0));
    tool_json_result (o, 0);
  }
}
