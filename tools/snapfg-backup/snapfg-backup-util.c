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
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include "snapfg-backup.h"
#include "full-io.h"

/* The program's messages, read back from FD (its stderr): the line
 * that says the disk is full if there is one (qemu-img may say more
 * after it, such as failing to remove what it made), else the last line
 * that is not a warning; in OUT.
 */
static void
last_message (int fd, char *out, size_t len)
{
  char buf[8192], *line, *save = NULL;
  bool full = false;
  ssize_t n;

  out[0] = '\0';
  n = pread (fd, buf, sizeof buf - 1, 0);
  if (n <= 0)
    return;
  buf[n] = '\0';
  for (line = strtok_r (buf, "\n", &save); line && !full;
       line = strtok_r (NULL, "\n", &save)) {
    full = strcasestr (line, "No space left on device") != NULL;
    if (full || strstr (line, "warning:") == NULL)
      snprintf (out, len, "%s", line);
  }
}

/* Copy what the program printed on its stderr (F) to ours, as it was. */
static void
pass_messages (int fd)
{
  char buf[4096];
  ssize_t n;
  off_t off = 0;

  while ((n = pread (fd, buf, sizeof buf, off)) > 0) {
    if (full_write (2, buf, n) == -1)
      break;
    off += n;
  }
}

int
run_command (const char *dir, char *const argv[], const char *what)
{
  pid_t pid, parent = getpid ();
  int st, err_fd;
  bool stopped = false;
  char msg[1024];

  /* Its stderr is kept (not a pipe: nothing to drain while it runs), so
   * that a failure is reported with its reason and the file it was
   * about, not only "exit status 1".
   */
  err_fd = memfd_create ("snapfg-backup-stderr", MFD_CLOEXEC);
  fflush (stderr);
  pid = fork ();
  if (pid == -1) {
    backup_error ("fork: %m");
    if (err_fd >= 0)
      close (err_fd);
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
    if (err_fd >= 0)
      dup2 (err_fd, 2);
    if (dir && chdir (dir) == -1) {
      fprintf (stderr, "snapfg-backup: %s: %m\n", dir);
      _exit (127);
    }
    execvp (argv[0], argv);
    fprintf (stderr, "cannot run %s: %m (install qemu-utils)\n", argv[0]);
    _exit (127);
  }
  setpgid (pid, pid);           /* as the child does: whoever runs first */
  while (waitpid (pid, &st, 0) == -1) {
    if (errno != EINTR) {
      backup_error ("waitpid: %m");
      kill (-pid, SIGKILL);
      if (err_fd >= 0)
        close (err_fd);
      return -1;
    }
    if (backup_interrupted && !stopped) {
      kill (-pid, SIGTERM);
      stopped = true;
    }
  }
  if (WIFEXITED (st) && WEXITSTATUS (st) == 0) {
    if (err_fd >= 0) {
      pass_messages (err_fd);
      close (err_fd);
    }
    return 0;
  }
  msg[0] = '\0';
  if (err_fd >= 0) {
    last_message (err_fd, msg, sizeof msg);
    close (err_fd);
  }
  if (strcasestr (msg, "No space left on device"))
    backup_error ("%s: no space left on device (%s failed: %s); free some "
                  "space there and run again", what, argv[0], msg);
  else
    backup_error ("%s: %s failed (%s %d)%s%s", what, argv[0],
                  WIFEXITED (st) ? "exit status" : "signal",
                  WIFEXITED (st) ? WEXITSTATUS (st) : WTERMSIG (st),
                  msg[0] ? ": " : "", msg);
  return -1;
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
