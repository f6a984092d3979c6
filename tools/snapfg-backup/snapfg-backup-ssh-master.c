/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg-backup: one ssh connection shared by the sessions of several
 * disks on one backup host (-H with --disk a ... --disk b ...).
 *
 * Each disk's session is an ssh of its own (its snapfgctl --stdio and
 * its forwarded NBD socket).  Run as they are, n disks cost n TCP
 * connections, n key exchanges and n logins: n times the chance that
 * one of them is refused halfway through a group whose writes are
 * held.  With OpenSSH's connection sharing, one master connects and
 * authenticates first, before anything is asked of any server, and
 * every session runs as a channel of it (ControlPath, ControlMaster=no).
 *
 * The master runs with -N (no command) and BatchMode, its control
 * socket in a private directory here; it dies with this process
 * (PR_SET_PDEATHSIG), so a backup killed with SIGKILL leaves no ssh
 * behind, and each session's channel closes with its own ssh client
 * (the server drops the run's snapshot, as without sharing).
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "snapfg-backup.h"

/* The master's stderr, read back for the message when it fails: its
 * lines without the rows of '@' ssh frames a changed host key with.
 */
static void
master_failure (const struct ssh_master *m, const char *host,
                const char *what)
{
  char path[PATH_MAX], buf[2048] = "", said[1024] = "";
  size_t used = 0;
  ssize_t n = 0;
  int fd;

  snprintf (path, sizeof path, "%s/ssh.err", m->dir);
  fd = open (path, O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    n = read (fd, buf, sizeof buf - 1);
    close (fd);
  }
  buf[n > 0 ? n : 0] = '\0';
  for (char *line = strtok (buf, "\r\n"); line && used < sizeof said - 1;
       line = strtok (NULL, "\r\n")) {
    if (line[strspn (line, "@ ")] == '\0')
      continue;
    used += snprintf (said + used, sizeof said - used, "%s%s",
                      used ? " " : "", line);
  }
  backup_error ("ssh %s (the connection the disks share): %s%s%s", host,
                what, said[0] ? ": " : "", said);
}

int
ssh_master_start (const struct backup_options *o, struct ssh_master *m)
{
  const char *tmp = getenv ("TMPDIR");
  char *dest = NULL, *port = NULL, err[PATH_MAX];
  const char *argv[64 + 2 * 32];
  size_t n = 0;
  struct timespec t0, now;
  int status = EXIT_UNREACHABLE;

  memset (m, 0, sizeof *m);
  m->pid = -1;
  if (o->nssh_options > 32) {
    backup_error ("more than 32 --ssh-option");
    return EXIT_USAGE;
  }
  if (ssh_parse_host (o->host, &dest, &port) == -1) {
    backup_error ("-H %s: not [USER@]HOST[:PORT]", o->host);
    return EXIT_USAGE;
  }
  if (asprintf (&m->dir, "%s/snapfg-backup-XXXXXX",
                tmp && *tmp ? tmp : "/tmp") == -1 ||
      mkdtemp (m->dir) == NULL) {
    backup_error ("cannot make a private directory for the shared ssh "
                  "connection: %m");
    free (m->dir);
    m->dir = NULL;
    goto out;
  }
  if (asprintf (&m->path, "%s/ssh.ctl", m->dir) == -1 ||
      asprintf (&m->option, "ControlPath=%s", m->path) == -1) {
    backup_error ("out of memory");
    goto out;
  }
  snprintf (err, sizeof err, "%s/ssh.err", m->dir);

  argv[n++] = "ssh";
  argv[n++] = "-N";
  argv[n++] = "-o"; argv[n++] = "BatchMode=yes";
  argv[n++] = "-o"; argv[n++] = "ControlMaster=yes";
  argv[n++] = "-o"; argv[n++] = m->option;
  argv[n++] = "-o"; argv[n++] = "ControlPersist=no";
  argv[n++] = "-o"; argv[n++] = "ExitOnForwardFailure=yes";
  /* A silent network is noticed within a minute. */
  argv[n++] = "-o"; argv[n++] = "ServerAliveInterval=15";
  argv[n++] = "-o"; argv[n++] = "ServerAliveCountMax=4";
  for (size_t i = 0; i < o->nssh_options; ++i) {
    argv[n++] = "-o";
    argv[n++] = o->ssh_options[i];
  }
  if (port) {
    argv[n++] = "-p";
    argv[n++] = port;
  }
  argv[n++] = "--";
  argv[n++] = dest;
  argv[n] = NULL;

  fflush (stdout);
  fflush (stderr);
  m->pid = fork ();
  if (m->pid == -1) {
    backup_error ("ssh %s: fork: %m", o->host);
    goto out;
  }
  if (m->pid == 0) {
    int fd = open ("/dev/null", O_RDWR);
    int efd = open (err, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

    prctl (PR_SET_PDEATHSIG, SIGTERM);
    if (getppid () == 1)
      _exit (127);
    if (fd >= 0) {
      dup2 (fd, 0);
      dup2 (fd, 1);
    }
    if (efd >= 0)
      dup2 (efd, 2);
    execvp ("ssh", (char **) argv);
    _exit (127);
  }

  /* Connected and logged in once its control socket is there. */
  clock_gettime (CLOCK_MONOTONIC, &t0);
  for (;;) {
    struct stat st;
    int wst;

    if (stat (m->path, &st) == 0 && S_ISSOCK (st.st_mode)) {
      status = EXIT_OK;
      break;
    }
    if (waitpid (m->pid, &wst, WNOHANG) == m->pid) {
      m->pid = -1;
      master_failure (m, o->host, WIFEXITED (wst) && WEXITSTATUS (wst) == 127
                      ? "ssh could not be run" : "the connection failed");
      break;
    }
    clock_gettime (CLOCK_MONOTONIC, &now);
    if (now.tv_sec - t0.tv_sec >= (o->timeout > 0 ? o->timeout : 30)) {
      master_failure (m, o->host, "no connection within --timeout");
      break;
    }
    usleep (20000);
  }

 out:
  free (dest);
  free (port);
  if (status != EXIT_OK)
    ssh_master_stop (m);
  return status;
}

void
ssh_master_stop (struct ssh_master *m)
{
  char path[PATH_MAX];

  if (m->pid > 0) {
    int st;

    kill (m->pid, SIGTERM);
    while (waitpid (m->pid, &st, 0) == -1 && errno == EINTR)
      ;
  }
  m->pid = -1;
  if (m->dir) {
    if (m->path)
      unlink (m->path);
    snprintf (path, sizeof path, "%s/ssh.err", m->dir);
    unlink (path);
    rmdir (m->dir);
  }
  free (m->dir);
  free (m->path);
  free (m->option);
  m->dir = m->path = m->option = NULL;
}
