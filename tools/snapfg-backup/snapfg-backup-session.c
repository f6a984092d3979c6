/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg-backup: the session with the server.
 *
 * On the server's machine (no -H): the control socket, and the NBD URI
 * as given.
 *
 * From a backup host (-H [USER@]HOST[:PORT]): one ssh connection
 * carries everything.  Its session runs "snapfgctl --stdio
 * --drop-on-hangup -S CONTROL" on HOST, which bridges the session's
 * standard input and output to the control socket (and drops the run's
 * snapshot if the connection is lost); the NBD server's socket (or TCP
 * port, as HOST sees it) is forwarded to a Unix socket in a private
 * directory here (ssh -L), so each NBD connection of the copy is a
 * channel of the same ssh connection.  An nbds:// URI is not forwarded:
 * the data goes straight to the server, encrypted by TLS.
 *
 * ssh runs with BatchMode (no password prompt: a key or an agent) and
 * ExitOnForwardFailure; host keys are checked as ssh always does (a
 * changed or unknown key is refused, unless the user's own ssh
 * configuration says otherwise).
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <limits.h>
#include <unistd.h>

#include "snapfg-backup.h"
#include "vector.h"

DEFINE_VECTOR_TYPE (string_vector, char *);

/* ARG quoted for the remote shell: 'it'\''s'. */
static int
append_quoted (char_vector *cmd, const char *arg)
{
  if (cmd->len && char_vector_append (cmd, ' ') < 0)
    return -1;
  if (char_vector_append (cmd, '\'') < 0)
    return -1;
  for (const char *p = arg; *p; ++p) {
    if (*p == '\'') {
      if (char_vector_append_n (cmd, "'\\''", 4) < 0)
        return -1;
    }
    else if (char_vector_append (cmd, *p) < 0)
      return -1;
  }
  return char_vector_append (cmd, '\'');
}

/* Split -H [USER@]HOST[:PORT] ([IPV6]:PORT too) into DEST and PORT. */
int
ssh_parse_host (const char *spec, char **dest, char **port)
{
  const char *at = strchr (spec, '@');
  const char *host = at ? at + 1 : spec, *colon;
  size_t user_len = at ? (size_t) (at - spec) + 1 : 0;

  *port = NULL;
  if (*host == '[') {
    const char *close = strchr (host, ']');
    if (close == NULL)
      return -1;
    colon = close[1] == ':' ? close + 1 : NULL;
    if (close[1] != '\0' && colon == NULL)
      return -1;
    /* ssh takes the address without brackets. */
    if (asprintf (dest, "%.*s%.*s", (int) user_len, spec,
                  (int) (close - host - 1), host + 1) == -1)
      return -1;
  }
  else {
    colon = strrchr (host, ':');
    if (asprintf (dest, "%.*s%.*s", (int) user_len, spec,
                  (int) (colon ? (size_t) (colon - host) : strlen (host)),
                  host) == -1)
      return -1;
  }
  if (colon) {
    char *end;
    long v = strtol (colon + 1, &end, 10);
    if (*end || end == colon + 1 || v < 1 || v > 65535 ||
        (*port = strdup (colon + 1)) == NULL) {
      free (*dest);
      return -1;
    }
  }
  return *dest[0] && (*dest)[strlen (*dest) - 1] != '@' ? 0 : -1;
}

/* The forward for the NBD URI as HOST sees it: "REMOTE" for ssh -L
 * LOCAL:REMOTE (a socket path or host:port), and the URI to use here.
 * *remote NULL: no forward (nbds://, straight to the server).
 */
static int
forward_for (const char *uri, const char *local, char **remote,
             char **data_uri)
{
  const char *q, *sock, *end;

  *remote = NULL;
  if (strncmp (uri, "nbds://", 7) == 0)
    return (*data_uri = strdup (uri)) ? 0 : -1;
  if (strncmp (uri, "nbd+unix://", 11) == 0 ||
      strncmp (uri, "nbds+unix://", 12) == 0) {
    q = strchr (uri, '?');
    for (sock = q; sock; sock = strchr (sock + 1, '&'))
      if (strncmp (sock + 1, "socket=", 7) == 0)
        break;
    if (sock == NULL)
      return -1;
    sock += 8;
    end = sock + strcspn (sock, "&#");
    if (end == sock || memchr (sock, '%', end - sock))
      return -1;
    if (asprintf (remote, "%.*s", (int) (end - sock), sock) == -1 ||
        asprintf (data_uri, "%.*s%s%s", (int) (sock - uri), uri, local,
                  end) == -1)
      return -1;
    return 0;
  }
  if (strncmp (uri, "nbd://", 6) == 0) {
    const char *auth = uri + 6, *path = auth + strcspn (auth, "/?#");
    const char *colon = memchr (auth, ':', path - auth);

    if (path == auth || *auth == '[')
      return -1;
    if (asprintf (remote, "%.*s:%.*s",
                  (int) ((colon ? colon : path) - auth), auth,
                  colon ? (int) (path - colon - 1) : 5,
                  colon ? colon + 1 : "10809") == -1 ||
        asprintf (data_uri, "nbd+unix://%.*s?socket=%s",
                  (int) strcspn (path, "?#"), path, local) == -1)
      return -1;
    return 0;
  }
  return -1;
}

/* This machine's name and DIR made absolute: the checkpoints' owner. */
static char *
owner_of (const char *dir_path)
{
  char host[256] = "localhost", cwd[PATH_MAX], *owner;

  gethostname (host, sizeof host - 1);
  if (dir_path[0] == '/' || getcwd (cwd, sizeof cwd) == NULL)
    cwd[0] = '\0';
  if (asprintf (&owner, "%s:%s%s%s", host, cwd, cwd[0] ? "/" : "",
                dir_path) == -1)
    return NULL;
  return owner;
}

static int
open_remote (struct backup_options *o, struct backup_session *s)
{
  string_vector argv = { 0 };
  char_vector cmd = { 0 };
  char *dest = NULL, *port = NULL, *remote = NULL, *local = NULL;
  char *forward = NULL, timeout[16], what[300];
  const char *tmp = getenv ("TMPDIR");
  int status = EXIT_FAILED;

  if (ssh_parse_host (o->host, &dest, &port) == -1) {
    backup_error ("-H %s: not [USER@]HOST[:PORT]", o->host);
    return EXIT_USAGE;
  }
  if (asprintf (&s->tmpdir, "%s/snapfg-backup-XXXXXX", tmp && *tmp ? tmp
                : "/tmp") == -1 || mkdtemp (s->tmpdir) == NULL) {
    backup_error ("cannot make a private directory for the forwarded "
                  "socket: %m");
    free (s->tmpdir);
    s->tmpdir = NULL;
    goto out;
  }
  if (asprintf (&local, "%s/nbd.sock", s->tmpdir) == -1)
    goto oom;
  /* prune needs no data: no -u, no forward. */
  if (o->uri && forward_for (o->uri, local, &remote, &s->data_uri) == -1) {
    backup_error ("-u %s: with -H the NBD URI is nbd+unix:///?socket=PATH "
                  "or nbd://HOST:PORT/ as the server's machine sees it "
                  "(forwarded over ssh), or nbds://HOST/ (TLS, direct)",
                  o->uri);
    status = EXIT_USAGE;
    goto out;
  }
  snprintf (timeout, sizeof timeout, "%d", o->timeout);
  if (append_quoted (&cmd, o->remote_snapfgctl) < 0 ||
      append_quoted (&cmd, "--stdio") < 0 ||
      append_quoted (&cmd, "--drop-on-hangup") < 0 ||
      append_quoted (&cmd, "--timeout") < 0 ||
      append_quoted (&cmd, timeout) < 0 ||
      append_quoted (&cmd, "-S") < 0 ||
      append_quoted (&cmd, o->socket) < 0 ||
      char_vector_append (&cmd, '\0') < 0)
    goto oom;

#define ARG(a) do {                                            \
    if (string_vector_append (&argv, (char *) (a)) < 0)        \
      goto oom;                                                \
  } while (0)
  ARG ("ssh");
  ARG ("-T");
  ARG ("-o"); ARG ("BatchMode=yes");
  ARG ("-o"); ARG ("ExitOnForwardFailure=yes");
  /* A silent network is noticed within a minute. */
  ARG ("-o"); ARG ("ServerAliveInterval=15");
  ARG ("-o"); ARG ("ServerAliveCountMax=4");
  for (size_t i = 0; i < o->nssh_options; ++i) {
    ARG ("-o");
    ARG (o->ssh_options[i]);
  }
  if (port) {
    ARG ("-p");
    ARG (port);
  }
  if (remote) {
    if (asprintf (&forward, "%s:%s", local, remote) == -1 ||
        asprintf (&s->data_what, "%s %s on %s (forwarded by ssh from %s)",
                  remote[0] == '/' ? "the NBD socket" : "the NBD server",
                  remote, o->host, local) == -1)
      goto oom;
    ARG ("-L");
    ARG (forward);
  }
  ARG ("--");
  ARG (dest);
  ARG (cmd.ptr);
  ARG (NULL);
#undef ARG

  snprintf (what, sizeof what, "ssh %s (snapfgctl --stdio -S %s)", o->host,
            o->socket);
  if (control_client_spawn (&s->ctl, argv.ptr, what, o->timeout) == -1) {
    backup_error ("%s", s->ctl.error);
    status = EXIT_UNREACHABLE;
    goto out;
  }
  status = EXIT_OK;
  goto out;

 oom:
  backup_error ("out of memory");
 out:
  string_vector_reset (&argv);
  char_vector_reset (&cmd);
  free (dest);
  free (port);
  free (remote);
  free (local);
  free (forward);
  return status;
}

int
session_open (struct backup_options *o, const char *dir_path)
{
  struct backup_session *s = calloc (1, sizeof *s);
  json_t *req, *reply;
  char err[1024];
  int status;

  if (s == NULL) {
    backup_error ("out of memory");
    return EXIT_FAILED;
  }
  s->ctl.rfd = s->ctl.wfd = s->ctl.pid = -1;
  o->session = s;
  s->owner = owner_of (dir_path);
  if (o->host)
    status = open_remote (o, s);
  else if (control_client_connect (&s->ctl, o->socket, o->timeout) == -1) {
    backup_error ("%s", s->ctl.error);
    status = EXIT_UNREACHABLE;
  }
  else if (o->uri && ((s->data_uri = strdup (o->uri)) == NULL ||
                      (s->data_what = strdup (o->uri)) == NULL)) {
    backup_error ("out of memory");
    status = EXIT_FAILED;
  }
  else
    status = EXIT_OK;
  if (status == EXIT_OK && s->data_uri && s->data_what == NULL &&
      (s->data_what = strdup (s->data_uri)) == NULL) {
    backup_error ("out of memory");
    status = EXIT_FAILED;
  }
  if (status != EXIT_OK)
    return status;

  /* The server answers (over ssh: the connection, the host key, the
   * remote snapfgctl and the socket all work) before anything is made,
   * here or there.
   */
  req = control_request (CONTROL_LIST);
  reply = control_call (o, req, err, sizeof err);
  json_decref (req);
  if (reply == NULL) {
    backup_error ("%s", err);
    return control_failure_status (o);
  }
  json_decref (reply);
  return EXIT_OK;
}

void
session_close (struct backup_options *o)
{
  struct backup_session *s = o->session;

  if (s == NULL)
    return;
  control_client_close (&s->ctl);
  if (s->tmpdir) {
    char path[PATH_MAX];
    snprintf (path, sizeof path, "%s/nbd.sock", s->tmpdir);
    unlink (path);
    rmdir (s->tmpdir);
  }
  free (s->tmpdir);
  free (s->data_uri);
  free (s->data_what);
  free (s->owner);
  free (s);
  o->session = NULL;
}
